"""Tests for jaxdl.generative.samplers with exact (closed-form) fields in place of a network."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdl.generative import closed_forms, paths, samplers, solvers, stepwise

FLOW = paths.FlowPath()
EPS5 = jnp.array([-1.3, -0.2, 0.05, 0.5, 2.0])[:, None]


def two_point_field(variables, x, t_B, y=None, train=False):
  del variables, y, train
  return closed_forms.two_point_posterior_velocity(x, t_B[:, None])


def gaussian_field(mu, s):
  def apply(variables, x, t_B, y=None, train=False):
    return closed_forms.gaussian_flow_velocity(x, t_B[:, None], mu, s)
  return apply


def ddpm_gaussian_eps(path, mu, s):
  """Exact E[eps | x_t] for data N(mu, s^2) on a DDPM path; the model time is t / T."""
  sq_ab = jnp.asarray(np.sqrt(path.alpha_bar), jnp.float32)
  sq_1mab = jnp.asarray(np.sqrt(1 - path.alpha_bar), jnp.float32)

  def apply(variables, x, tm_B, y=None, train=False):
    t = jnp.round(tm_B * path.T).astype(jnp.int32)
    a, sg = sq_ab[t][:, None], sq_1mab[t][:, None]
    return closed_forms.gaussian_eps_posterior(x, a, sg, mu, s)
  return apply


# ----------------------------------------------------------------------------- worked examples


# The worked numbers themselves (one Euler step, two steps from 0.5, the exact ODE) are the claim
# flow_matching_two_points of `jaxdl reproduce`; here only what the claim does not check.


def test_euler_and_heun_reach_the_same_limit_of_the_two_point_ode():
  """Two integrators of the same singular field (first and second order) agree at t = 0.999."""
  kw = dict(sample_shape=(1,), t_end=0.999)
  heun = samplers.make_sampler(two_point_field, FLOW, sampler="heun", steps=400, **kw)
  euler = samplers.make_sampler(two_point_field, FLOW, sampler="euler", steps=4000, **kw)
  key = jax.random.PRNGKey(0)
  np.testing.assert_allclose(euler(None, key, 5, x_init=EPS5), heun(None, key, 5, x_init=EPS5),
                             atol=0.003)


# ----------------------------------------------------------------------------- equivalences


def test_euler_on_gaussian_flow_matches_closed_form():
  eps = jax.random.normal(jax.random.PRNGKey(1), (256, 1))
  mu, s = 1.5, 0.5
  exact = closed_forms.gaussian_flow_solution(eps, 1.0, mu, s)  # = mu + s eps
  errs = {}
  for n in (100, 200):
    sample = samplers.make_sampler(gaussian_field(mu, s), FLOW, sampler="euler", steps=n,
                                   sample_shape=(1,))
    errs[n] = float(jnp.max(jnp.abs(sample(None, jax.random.PRNGKey(0), 256, x_init=eps) - exact)))
  assert errs[200] < 0.02  # max over 256 draws, |eps| up to ~3
  np.testing.assert_allclose(errs[100] / errs[200], 2.0, rtol=0.1)  # first order in 1/N
  heun = samplers.make_sampler(gaussian_field(mu, s), FLOW, sampler="heun", steps=100,
                               sample_shape=(1,))
  assert float(jnp.max(jnp.abs(heun(None, jax.random.PRNGKey(0), 256, x_init=eps) - exact))) < 1e-4
  # One Euler step lands on x_hat(eps, 0) = E[x] = mu for every starting point.
  one = samplers.make_sampler(gaussian_field(mu, s), FLOW, sampler="euler", steps=1,
                              sample_shape=(1,))
  np.testing.assert_allclose(one(None, jax.random.PRNGKey(0), 256, x_init=eps), mu, atol=1e-5)


def test_ddim_on_the_flow_path_is_euler():
  kw = dict(steps=7, sample_shape=(1,), t_end=0.99)
  euler = samplers.make_sampler(two_point_field, FLOW, sampler="euler", **kw)
  ddim = samplers.make_sampler(two_point_field, FLOW, sampler="ddim", **kw)
  key = jax.random.PRNGKey(3)
  np.testing.assert_allclose(ddim(None, key, 64), euler(None, key, 64), atol=1e-5)


@pytest.mark.compute_bound  # 1000 steps over 20,000 samples: 10-12 CPU-s fast-compiled, 5 not
def test_ddim_eta1_matches_ddpm_ancestral_statistics():
  path = paths.make_path("ddpm", T=1000, schedule="linear")
  mu, s, n = 1.5, 0.5, 20000
  apply = ddpm_gaussian_eps(path, mu, s)
  kw = dict(steps=1000, sample_shape=(1,), prediction="eps")
  x_ddim = samplers.make_sampler(apply, path, sampler="ddim", eta=1.0, **kw)(
      None, jax.random.PRNGKey(0), n)
  x_ddpm = samplers.make_sampler(apply, path, sampler="ddpm", **kw)(None, jax.random.PRNGKey(1), n)
  for x in (x_ddim, x_ddpm):
    assert abs(float(x.mean()) - mu) < 0.02
    assert abs(float(x.var()) - s**2) < 0.015
  assert abs(float(x_ddim.mean() - x_ddpm.mean())) < 0.02
  assert abs(float(x_ddim.var() - x_ddpm.var())) < 0.015


def test_ddim_eta1_and_ancestral_steps_have_the_same_mean_and_variance():
  """Per step, on a sub-sequence: DDIM eta = 1 and the ancestral posterior agree in closed form."""
  ab = np.array([0.3, 0.7])
  a_t, s_t, a_s, s_s = np.sqrt(ab[0]), np.sqrt(1 - ab[0]), np.sqrt(ab[1]), np.sqrt(1 - ab[1])
  x_t, eps_hat = jnp.array([0.8]), jnp.array([-0.4])
  x_hat = paths.eps_to_x0(x_t, eps_hat, a_t, s_t)
  mean_anc, var_anc = solvers.ancestral_mean_var(x_t, x_hat, a_t, s_t, a_s, s_s)
  mean_ddim = solvers.ddim_update(x_hat, eps_hat, a_t, s_t, a_s, s_s, eta=1.0)
  z1 = solvers.ddim_update(x_hat, eps_hat, a_t, s_t, a_s, s_s, eta=1.0, z=jnp.ones(1))
  np.testing.assert_allclose(mean_ddim, mean_anc, atol=1e-6)
  np.testing.assert_allclose((z1 - mean_ddim) ** 2, var_anc, rtol=1e-5)
  # Textbook DDPM: beta_tilde = (1 - ab_prev)/(1 - ab_t) (1 - ab_t/ab_prev).
  np.testing.assert_allclose(var_anc, (1 - ab[1]) / (1 - ab[0]) * (1 - ab[0] / ab[1]), rtol=1e-6)


def test_deterministic_ddim_depends_only_on_the_starting_noise():
  path = paths.make_path("ddpm", T=200, schedule="cosine")
  apply = ddpm_gaussian_eps(path, 0.5, 0.3)
  x_init = jax.random.normal(jax.random.PRNGKey(9), (32, 1))
  det = samplers.make_sampler(apply, path, sampler="ddim", steps=20, sample_shape=(1,),
                              prediction="eps")
  a = det(None, jax.random.PRNGKey(0), 32, x_init=x_init)
  b = det(None, jax.random.PRNGKey(1), 32, x_init=x_init)
  np.testing.assert_array_equal(a, b)
  sto = samplers.make_sampler(apply, path, sampler="ddim", eta=0.5, steps=20, sample_shape=(1,),
                              prediction="eps")
  assert not np.allclose(sto(None, jax.random.PRNGKey(0), 32, x_init=x_init),
                         sto(None, jax.random.PRNGKey(1), 32, x_init=x_init))


def test_scan_sampler_equals_python_loop_sampler():
  path = paths.make_path("ddpm", T=100)
  apply = ddpm_gaussian_eps(path, 0.5, 0.3)
  kw = dict(sampler="ddpm", steps=100, sample_shape=(1,), prediction="eps")
  key = jax.random.PRNGKey(5)
  np.testing.assert_allclose(samplers.make_sampler(apply, path, **kw)(None, key, 16),
                             stepwise.make_python_loop_sampler(apply, path, **kw)(None, key, 16),
                             atol=1e-5)


# ----------------------------------------------------------------------------- guidance


def conditional_field(variables, x, t_B, y=None, train=False):
  """A toy conditional velocity: pull towards class centre y (null class 3 pulls to 0)."""
  centres = jnp.array([-2.0, 0.0, 2.0, 0.0])
  c = centres[y][:, None] if y is not None else 0.0
  return c - x * (1 - t_B[:, None])


def test_guidance_one_equals_conditional_and_zero_equals_unconditional():
  kw = dict(sampler="heun", steps=10, sample_shape=(1,), num_classes=3)
  key = jax.random.PRNGKey(0)
  cond = samplers.make_sampler(conditional_field, FLOW, **kw)(None, key, 8, y=2)
  g1 = samplers.make_sampler(conditional_field, FLOW, guidance=1.0, **kw)(None, key, 8, y=2)
  np.testing.assert_allclose(g1, cond, atol=1e-5)
  uncond = samplers.make_sampler(conditional_field, FLOW, **kw)(None, key, 8)
  g0 = samplers.make_sampler(conditional_field, FLOW, guidance=0.0, **kw)(None, key, 8, y=2)
  np.testing.assert_allclose(g0, uncond, atol=1e-5)
  g3 = samplers.make_sampler(conditional_field, FLOW, guidance=3.0, **kw)(None, key, 8, y=2)
  # w = 3 moves 3x as far from the unconditional samples as w = 1 (the field is affine in w).
  np.testing.assert_allclose(g3 - uncond, 3 * (cond - uncond), atol=1e-4)


def test_trajectory_shape_and_ends():
  x_init = jax.random.normal(jax.random.PRNGKey(2), (4, 2))
  sample = samplers.make_sampler(two_point_field, FLOW, sampler="heun", steps=5, sample_shape=(2,),
                                 t_end=0.99, return_trajectory=True)
  x, traj = sample(None, jax.random.PRNGKey(0), 4, x_init=x_init)
  assert traj.shape == (6, 4, 2)
  np.testing.assert_array_equal(traj[0], x_init)
  np.testing.assert_array_equal(traj[-1], x)


# ----------------------------------------------------------------------------- bad input


def test_bad_input_raises_one_clear_error_each():
  with pytest.raises(ValueError, match="unconditional"):
    samplers.make_sampler(two_point_field, FLOW, guidance=2.0)
  with pytest.raises(ValueError, match="steps"):
    samplers.make_sampler(two_point_field, FLOW, steps=0)
  with pytest.raises(ValueError, match="sampler: expected one of .*, got 'rk4'"):
    samplers.make_sampler(two_point_field, FLOW, sampler="rk4")
  with pytest.raises(ValueError, match="needs the 'flow' path"):
    samplers.make_sampler(two_point_field, paths.make_path("ddpm", T=10), sampler="euler")
  sample = samplers.make_sampler(conditional_field, FLOW, steps=2, sample_shape=(1,),
                                 num_classes=3, guidance=2.0)
  with pytest.raises(ValueError, match="outside the trained range 0..2"):
    sample(None, jax.random.PRNGKey(0), 4, y=3)
  with pytest.raises(ValueError, match="class y"):
    sample(None, jax.random.PRNGKey(0), 4)


@pytest.mark.parametrize("path_name,prediction", [
    ("flow", "v"), ("flow", "eps"), ("ddpm", "velocity")])
def test_a_prediction_that_does_not_fit_the_path_is_refused(path_name, prediction):
  """'v' needs alpha^2 + sigma^2 = 1 and 'velocity' alpha + sigma = 1: off their paths the
  conversions return a wrong x_hat, so the public API refuses them, naming both."""
  path = FLOW if path_name == "flow" else paths.make_path("ddpm", T=10)
  msg = rf"prediction='{prediction}' does not fit the '{path_name}' path: expected one of"
  for make in (samplers.make_sampler, stepwise.make_python_loop_sampler):
    with pytest.raises(ValueError, match=msg):
      make(two_point_field, path, sampler="ddim", steps=2, sample_shape=(1,),
           prediction=prediction)
  x = jnp.ones((2, 1))
  with pytest.raises(ValueError, match=msg):
    paths.to_x_eps(x, x, 0.6, 0.8, prediction, path=path)
  for ok in path.predictions:  # the fitting ones still convert
    paths.to_x_eps(x, x, 0.6, 0.4 if path_name == "flow" else 0.8, ok, path=path)


# ----------------------------------------------------------------------------- extending


def test_a_new_sampler_is_one_registered_function(monkeypatch):
  """Heun with a second corrector pass; on v = lam x one step multiplies x by
  1 + z + z^2/2 + z^3/4, z = h lam (Heun alone stops at z^2/2)."""
  monkeypatch.setattr(samplers, "SAMPLERS", dict(samplers.SAMPLERS))  # restored after the test

  @samplers.register_sampler("heun2", paths=samplers.CONTINUOUS_PATHS, calls=3)
  def heun2(grid, variables, x, i, key, y_B):
    h = grid.t[i + 1] - grid.t[i]
    v_t = grid.velocity(variables, x, i, y_B)
    x_c = x + 0.5 * h * (v_t + grid.velocity(variables, x + h * v_t, i + 1, y_B))
    return x + 0.5 * h * (v_t + grid.velocity(variables, x_c, i + 1, y_B))

  lam, n = -0.7, 4
  sample = samplers.make_sampler(lambda v, x, t, y=None, train=False: lam * x, FLOW,
                                 sampler="heun2", steps=n, sample_shape=(1,))
  z = lam / n
  np.testing.assert_allclose(sample(None, jax.random.PRNGKey(0), 5, x_init=EPS5),
                             EPS5 * (1 + z + z**2 / 2 + z**3 / 4) ** n, rtol=1e-6)
  with pytest.raises(ValueError, match=r"needs the 'flow' path.*\['ddim', 'ddpm', 'dpmpp_2m'"):
    samplers.make_sampler(two_point_field, paths.make_path("ddpm", T=10), sampler="heun2")


def test_the_registry_names_its_samplers_and_refuses_a_second_registration():
  assert sorted(samplers.SAMPLERS) == ["ddim", "ddpm", "dpmpp_2m", "dpmpp_3m", "edm_heun",
                                       "euler", "heun"]
  with pytest.raises(ValueError, match=r"sampler: expected one of \['ddim', 'ddpm', 'dpmpp"):
    samplers.make_sampler(two_point_field, FLOW, sampler="rk4")
  with pytest.raises(ValueError, match="'euler' is already registered"):
    samplers.register_sampler("euler")(lambda grid, variables, x, i, key, y_B: x)
  assert samplers.SAMPLERS["euler"].step is solvers.euler


# ----------------------------------------------------------------------------- quality metrics


def test_energy_distance_matches_the_formula_and_point_masses():
  from jaxdl.generative import metrics
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(30, 2)), rng.normal(size=(20, 2)) + 0.5
  d = lambda a, b: np.linalg.norm(a[:, None] - b[None], axis=-1).mean()
  np.testing.assert_allclose(metrics.energy_distance(x, y), 2 * d(x, y) - d(x, x) - d(y, y),
                             rtol=1e-4)
  # Two point masses at 0 and 3 in 1-D: 2 * 3 - 0 - 0.
  np.testing.assert_allclose(metrics.energy_distance(np.zeros((5, 1)), np.full((7, 1), 3.0)), 6.0,
                             rtol=1e-6)


def test_exact_w2_equals_sorted_matching_in_one_dimension():
  from jaxdl.generative import metrics
  rng = np.random.default_rng(1)
  x, y = rng.normal(size=(200, 1)), rng.exponential(size=(200, 1))
  expected = np.sqrt(np.mean((np.sort(x[:, 0]) - np.sort(y[:, 0])) ** 2))
  np.testing.assert_allclose(metrics.wasserstein2(x, y), expected, rtol=1e-9)
  with pytest.raises(ValueError, match="equal-size"):
    metrics.wasserstein2(x, y[:10])
