"""Tests for jaxdl.generative.likelihood: PF-ODE log-likelihoods against Gaussian closed forms."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.scipy.stats import norm

from jaxdl import models as jmodels
from jaxdl.generative import closed_forms, likelihood, paths

# Data N(mu, Sigma) with a full covariance: the flow's Jacobian is not diagonal, so Hutchinson's
# estimate has a real variance and the exact trace must read every column.
MU_D = np.array([0.5, -1.0, 2.0], np.float32)
L_DxD = np.array([[1.0, 0.0, 0.0], [0.3, 0.6, 0.0], [-0.2, 0.4, 0.8]], np.float32)
SIGMA_DxD = L_DxD @ L_DxD.T


def gaussian_flow_field(y_BxD, t):
  """Exact flow velocity for data N(mu, Sigma), eps ~ N(0, I): with C_t = t^2 Sigma + (1-t)^2 I,
  x_hat = mu + t Sigma C_t^-1 (y - t mu), eps_hat = (1 - t) C_t^-1 (y - t mu), v = x_hat - eps_hat.
  """
  eye = jnp.eye(3)
  c_DxD = t**2 * SIGMA_DxD + (1 - t) ** 2 * eye
  m_DxD = (t * SIGMA_DxD - (1 - t) * eye) @ jnp.linalg.inv(c_DxD)
  return MU_D + (y_BxD - t * MU_D) @ m_DxD.T


@pytest.fixture(scope="module")
def gaussian_data():
  # Imported here: at collection both xdist workers would import it (0.9 CPU-s each).
  import scipy.stats  # pylint: disable=g-import-not-at-top
  x_BxD = MU_D + np.random.default_rng(0).standard_normal((256, 3), np.float32) @ L_DxD.T
  return x_BxD, scipy.stats.multivariate_normal(MU_D, SIGMA_DxD).logpdf(x_BxD)


def test_flow_likelihood_of_gaussian_data_is_the_closed_form(gaussian_data):
  x_BxD, exact_B = gaussian_data
  out = likelihood.log_likelihood(gaussian_flow_field, x_BxD, t_data=1.0, t_noise=0.0, steps=20)
  # 20 RK4 steps on a smooth field: float32 round-off (~1e-5), far inside the 1e-3 nats target.
  np.testing.assert_allclose(out["logp"], exact_B, atol=1e-3)
  np.testing.assert_allclose(out["bpd"], -exact_B / (3 * np.log(2.0)), atol=1e-3)
  # The end point is the noise the ODE maps x to: a whitened draw, mean ~0 and variance ~1.
  np.testing.assert_allclose(np.cov(np.asarray(out["x_noise"]).T), np.eye(3), atol=0.25)


def test_hutchinson_is_unbiased_and_its_error_shrinks_as_one_over_sqrt_probes(gaussian_data):
  x_BxD, exact_B = gaussian_data
  kw = dict(t_data=1.0, t_noise=0.0, steps=20, divergence="hutchinson")
  one = likelihood.log_likelihood(gaussian_flow_field, x_BxD, probes=1, rng=jax.random.PRNGKey(1),
                                  **kw)
  err1_B = np.asarray(one["logp"] - exact_B)
  # Unbiased: the mean error over 256 samples is within 3 standard errors of 0 ...
  assert abs(err1_B.mean()) < 3 * err1_B.std() / np.sqrt(256)
  assert err1_B.std() > 0.1  # ... and a real variance (a full covariance: J is not diagonal)
  many = likelihood.log_likelihood(gaussian_flow_field, x_BxD, probes=16,
                                   rng=jax.random.PRNGKey(2), **kw)
  err16_B = np.asarray(many["logp"] - exact_B)
  np.testing.assert_allclose(err16_B.std() / err1_B.std(), 0.25, rtol=0.3)


def _gaussian_ddpm(schedule: str):
  """(velocity_fn, marginal(tau) -> logpdf, x_BxD): a DDPM 'network' returning the exact
  E[eps | x_tau] for N(mu, s^2) data on the interpolated path, whose density at tau is
  N(alpha mu, alpha^2 s^2 + sigma^2) per coordinate."""
  path = paths.make_path("ddpm", T=1000, schedule=schedule)
  coefficients = likelihood.vp_coefficients(path.alpha_bar)
  mu, s = 1.5, 0.5

  def apply_fn(variables, x_t, tm_1, y=None, train=False):
    a, sg, _, _ = coefficients(tm_1[0])
    return closed_forms.gaussian_eps_posterior(x_t, a, sg, mu, s)

  def marginal(tau):
    a, sg, _, _ = coefficients(jnp.float32(tau))
    return lambda z: jnp.sum(norm.logpdf(z, a * mu, jnp.sqrt(a**2 * s**2 + sg**2)), axis=-1)

  x_BxD = mu + s * jax.random.normal(jax.random.PRNGKey(3), (128, 2))
  return likelihood.network_velocity(apply_fn, None, path, "eps"), marginal, x_BxD


def test_ddpm_run_velocity_gives_the_closed_form_on_its_continuous_path():
  velocity_fn, marginal, x_BxD = _gaussian_ddpm("linear")
  out = likelihood.log_likelihood(velocity_fn, x_BxD, t_data=1e-3, t_noise=1.0, steps=200,
                                  spacing="quadratic", prior_logpdf=marginal(1.0))
  np.testing.assert_allclose(out["logp"], marginal(1e-3)(x_BxD), atol=1e-3)


def test_ddpm_grid_of_runs_is_fine_at_both_ends_for_a_cosine_schedule():
  """At the 100 steps a run's likelihood takes, from tau = 1/T: the cosine grid run_log_likelihood
  uses is within 5e-3 nats of the closed form on cosine betas, where the quadratic grid (fine
  at the data end only) misses the steep noise end of the clipped betas by > 2e-2 (measured
  3.3e-3 and 2.5e-2); on linear betas the cosine grid is within 1e-3 (measured 5e-4)."""
  def error(schedule, spacing):
    velocity_fn, marginal, x_BxD = _gaussian_ddpm(schedule)
    out = likelihood.log_likelihood(velocity_fn, x_BxD, t_data=1e-3, t_noise=1.0, steps=100,
                                    spacing=spacing, prior_logpdf=marginal(1.0))
    return float(np.max(np.abs(out["logp"] - marginal(1e-3)(x_BxD))))

  assert error("cosine", "cosine") < 5e-3
  assert error("cosine", "quadratic") > 2e-2
  assert error("linear", "cosine") < 1e-3


def test_run_likelihood_of_a_denoiser_exact_trace_matches_jacfwd_and_other_tasks_are_refused():
  config = ml_collections.ConfigDict(dict(task="flow_matching", gen=dict(prediction="velocity")))
  model = jmodels.build_model(
      ml_collections.ConfigDict(dict(name="denoiser_mlp", hidden=16, depth=1, emb_dim=8)))
  x_BxD = jax.random.normal(jax.random.PRNGKey(4), (8, 2))
  variables = jax.jit(model.init, static_argnames="train")(jax.random.PRNGKey(5), x_BxD,
                                                           jnp.zeros((1,)), train=False)
  out = likelihood.run_log_likelihood(config, model, variables, x_BxD, steps=1)
  # One RK4 step by hand, each trace from jacfwd's full per-sample Jacobian.
  def v_D(x_D, t):
    return model.apply(variables, x_D[None], jnp.reshape(t, (1,)), train=False)[0]

  @jax.jit
  def f(x, t):
    div_B = jax.vmap(lambda x_D: jnp.trace(jax.jacfwd(v_D)(x_D, t)))(x)
    return jax.vmap(v_D, (0, None))(x, t), div_B

  (k1, d1), h = f(x_BxD, 1.0), -1.0
  k2, d2 = f(x_BxD + 0.5 * h * k1, 0.5)
  k3, d3 = f(x_BxD + 0.5 * h * k2, 0.5)
  k4, d4 = f(x_BxD + h * k3, 0.0)
  x0 = x_BxD + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
  delta = h / 6 * (d1 + 2 * d2 + 2 * d3 + d4)
  np.testing.assert_allclose(out["x_noise"], x0, atol=1e-5)
  np.testing.assert_allclose(out["logp"], likelihood.standard_normal_logpdf(x0) + delta, atol=1e-4)
  # A second model of the same shapes reuses the compiled solve (its params are an argument, not
  # constants), and gets its own numbers: those of the same model's field as a closure.
  other = jax.tree.map(lambda p: 1.5 * p, variables)
  traced = likelihood._solver.cache_info()  # noqa: SLF001
  again = likelihood.run_log_likelihood(config, model, other, x_BxD, steps=1)
  assert likelihood._solver.cache_info().hits == traced.hits + 1  # noqa: SLF001
  closed = likelihood.log_likelihood(
      likelihood.network_velocity(model.apply, other, likelihood.path_from_config(config),
                                  "velocity"), x_BxD, t_data=1.0, t_noise=0.0, steps=1)
  np.testing.assert_allclose(again["logp"], closed["logp"], rtol=1e-6, atol=1e-6)
  assert np.abs(np.asarray(again["logp"] - out["logp"])).max() > 1e-2
  config.task = "gan"
  with pytest.raises(ValueError, match="a GAN defines no density"):
    likelihood.run_log_likelihood(config, model, variables, x_BxD)


def test_batched_solve_with_labels_equals_one_solve():
  """batch_size splits x and its labels y into solves of one compiled program (the last one
  padded): per-example results equal one solve of all of x, Hutchinson probes included (they
  are drawn for all of x first). The field's rate depends on each example's own label, so a
  label paired with the wrong row would change that row's value."""
  def velocity_fn(x_BxD, t, y_B):
    del t
    return -x_BxD * (1.0 + y_B[:, None].astype(jnp.float32))

  x_BxD = jax.random.normal(jax.random.PRNGKey(8), (8, 3))
  y_B = jnp.arange(8) % 3
  kw = dict(t_data=1.0, t_noise=0.0, steps=4, divergence="hutchinson", probes=2,
            rng=jax.random.PRNGKey(9), y=y_B)
  whole = likelihood.log_likelihood(velocity_fn, x_BxD, **kw)
  batched = likelihood.log_likelihood(velocity_fn, x_BxD, batch_size=3, **kw)  # 3 + 3 + 2
  for k in ("logp", "x_noise", "delta_logp"):
    np.testing.assert_allclose(batched[k], whole[k], rtol=1e-6, atol=1e-6, err_msg=k)
  # div v = -D (1 + y) exactly for this linear field, whatever the probes: the integral over
  # t from 1 to 0 is +D (1 + y).
  np.testing.assert_allclose(whole["delta_logp"], 3.0 * (1.0 + y_B), rtol=1e-5)


def test_a_model_that_cannot_be_hashed_is_solved_without_the_cache():
  """A flax module with a list field has no hash; its likelihood is solved all the same (a
  program of its own, as before the cache), equal to its field as a closure."""
  import flax.linen as nn

  class ListModel(nn.Module):
    widths: list

    @nn.compact
    def __call__(self, x, t, y=None, train=False):
      del y, train
      return nn.Dense(x.shape[-1])(jnp.concatenate([x, jnp.broadcast_to(t, x[:, :1].shape)], -1))

  model = ListModel(widths=[4])
  config = ml_collections.ConfigDict(dict(task="flow_matching", gen=dict(prediction="velocity")))
  x_BxD = jax.random.normal(jax.random.PRNGKey(0), (4, 2))
  variables = model.init(jax.random.PRNGKey(1), x_BxD, jnp.zeros((1,)))
  out = likelihood.run_log_likelihood(config, model, variables, x_BxD, steps=2)
  closed = likelihood.log_likelihood(
      likelihood.network_velocity(model.apply, variables, likelihood.path_from_config(config),
                                  "velocity"), x_BxD, t_data=1.0, t_noise=0.0, steps=2)
  np.testing.assert_allclose(out["logp"], closed["logp"], rtol=1e-6, atol=1e-6)
