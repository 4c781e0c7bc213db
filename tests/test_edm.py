"""Tests for the EDM path, its preconditioning and the EDM Heun sampler, with the exact denoiser
of Gaussian data N(mu, s0^2) in place of a network (no training)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdl.generative import closed_forms, losses, paths, samplers, spacings, stepwise
from jaxdl.schema import ConfigError

MU, S0 = 0.7, 0.4
Z = np.linspace(-2.5, 2.5, 11, dtype=np.float32)[:, None]  # quantiles of the noise
EDM = paths.EDMPath()


def gaussian_eps(path):
  """The exact E[eps | x_t] on `path` for data N(MU, S0^2), as a denoiser apply_fn: the path
  carries x / data_scale; the model time is c_noise = ln(sigma)/4 on EDM, t / T on DDPM."""
  mu_w, s_w = MU / path.data_scale, S0 / path.data_scale
  if path.name == "ddpm":
    coefficients = lambda tm: path.alpha_sigma(jnp.round(tm * path.T).astype(jnp.int32))
  else:
    coefficients = lambda tm: path.alpha_sigma(jnp.exp(4 * tm))

  def apply(variables, x, tm_1, y=None, train=False):
    alpha, sigma = coefficients(tm_1)
    return closed_forms.gaussian_eps_posterior(x, alpha, sigma, mu_w, s_w)
  return apply


def ode_errors(path, sampler, ns, **kw):
  """max |x_N - (MU + S0 z)| for each N: x_init is the exact marginal at the grid's first time,
  alpha mu' + sqrt(alpha^2 s'^2 + sigma^2) z, whose probability-flow ODE ends at MU + S0 z."""
  mu_w, s_w = MU / path.data_scale, S0 / path.data_scale
  errs = []
  for n in ns:
    t0 = spacings.time_grid(path, n, kw.get("spacing"))[0]
    a0, s0 = (float(v) for v in path.alpha_sigma(t0))
    x_init = a0 * mu_w + np.sqrt(a0**2 * s_w**2 + s0**2) * Z
    sample = samplers.make_sampler(gaussian_eps(path), path, sampler=sampler, steps=n,
                                   sample_shape=(1,), prediction="eps", **kw)
    errs.append(float(np.max(np.abs(sample(None, jax.random.PRNGKey(0), len(Z), x_init=x_init)
                                     - (MU + S0 * Z)))))
  return np.array(errs)


# ----------------------------------------------------------------------------- the formulas


def test_preconditioning_constants_equal_the_paper_and_the_path_conversion():
  sd = 0.5
  sigma = np.array([0.002, 0.05, 0.5, 1.0, 7.0, 80.0])
  c_skip, c_out, c_in, c_noise = paths.edm_preconditioning(sigma, sd)
  np.testing.assert_allclose(c_skip, sd**2 / (sigma**2 + sd**2), rtol=1e-12)
  np.testing.assert_allclose(c_out, sigma * sd / np.sqrt(sigma**2 + sd**2), rtol=1e-12)
  np.testing.assert_allclose(c_in, 1 / np.sqrt(sigma**2 + sd**2), rtol=1e-12)
  np.testing.assert_allclose(c_noise, np.log(sigma) / 4, rtol=1e-12)
  np.testing.assert_allclose(EDM.model_time(sigma), c_noise, rtol=1e-12)
  # The path holds x_t = c_in (x + sigma eps) with x / sd as its data; D = c_skip (x + sigma eps)
  # + c_out F must equal sd times the path's x_hat of the 'edm' output F.
  rng = np.random.default_rng(0)
  x, eps, f = rng.normal(size=(3, 6)).astype(np.float32)
  alpha, sig = EDM.alpha_sigma(sigma)
  x_t = c_in * (x + sigma * eps)
  np.testing.assert_allclose(x_t, alpha * x / sd + sig * eps, rtol=1e-10)
  x_t32 = x_t.astype(np.float32)  # float32, as the sampler
  x_hat, _ = paths.to_x_eps(f, x_t32, alpha, sig, "edm", path=EDM)
  np.testing.assert_allclose(sd * x_hat, c_skip * (x + sigma * eps) + c_out * f, rtol=1e-5,
                             atol=1e-6)
  # The EDM weighting: lambda ||D - x||^2 is the unweighted ||F - F_target||^2 of the loss.
  f_target = paths.from_x_eps(x / sd, eps, alpha, sig, "edm", path=EDM)
  d = c_skip * (x + sigma * eps) + c_out * f
  np.testing.assert_allclose(paths.edm_loss_weight(sigma, sd) * (d - x) ** 2, (f - f_target) ** 2,
                             rtol=2e-5)
  np.testing.assert_allclose(paths.edm_loss_weight(sigma, sd),
                             (sigma**2 + sd**2) / (sigma * sd) ** 2, rtol=1e-12)


def test_karras_grid_and_log_normal_training_levels():
  n, lo, hi, rho = 18, 0.002, 80.0, 7.0
  i = np.arange(n)
  expected = (hi ** (1 / rho) + i / (n - 1) * (lo ** (1 / rho) - hi ** (1 / rho))) ** rho
  np.testing.assert_allclose(EDM.time_grid(n), np.append(expected, 0.0), rtol=1e-12)
  log_sigma = np.log(np.asarray(EDM.sample_train_time(jax.random.PRNGKey(0), 20000)))
  assert abs(log_sigma.mean() + 1.2) < 0.03 and abs(log_sigma.std() - 1.2) < 0.03


def test_a_perfect_edm_prediction_has_zero_loss_and_the_data_enter_whitened():
  """With out = F_target the loss is 0; the path sees x / sigma_data."""
  path = paths.EDMPath(sigma_data=0.25)
  x = jnp.asarray(np.random.default_rng(1).normal(size=(8, 3)), jnp.float32)
  k_t, k_n = jax.random.PRNGKey(1), jax.random.PRNGKey(2)
  sigma_B = path.sample_train_time(k_t, 8)
  eps = jax.random.normal(k_n, x.shape, jnp.float32)
  a, s = path.alpha_sigma(sigma_B)
  f_target = paths.from_x_eps(x / 0.25, eps, a, s, "edm")
  loss, _, _ = losses.denoising_loss(lambda x_t, tm: (f_target, None), x, k_t, k_n, path,
                                     prediction="edm")
  assert float(loss) < 1e-10


# ----------------------------------------------------------------------------- the sampler


def test_edm_heun_converges_to_the_exact_marginal_at_second_order():
  """Karras grid sigma 80 -> 0.002 -> 0: error ratio 4 when N doubles (measured 4.6, 4.4 for
  N = 16 -> 32 -> 64; tolerance [3.5, 5.2])."""
  errs = ode_errors(EDM, "edm_heun", (16, 32, 64))
  ratios = errs[:-1] / errs[1:]
  assert errs[-1] < 5e-3, errs
  assert np.all((ratios > 3.5) & (ratios < 5.2)), (errs, ratios)


def test_euler_runs_on_the_edm_path_and_converges_at_first_order():
  """Euler on the EDM path steps with d alpha/dt and d sigma/dt at its own grid point (these vary
  along the EDM path; a whole-grid array here once broadcast x to (B, ..., N + 1)). Error ratio 2
  when N doubles (measured 0.209, 0.107, 0.054 for N = 16, 32, 64: 1.95, 1.98)."""
  errs = ode_errors(EDM, "euler", (16, 32, 64))
  ratios = errs[:-1] / errs[1:]
  assert errs[-1] < 0.07, errs
  assert np.all((ratios > 1.5) & (ratios < 2.6)), (errs, ratios)


def test_edm_heun_runs_on_ddpm_and_flow_paths_and_equals_its_python_loop():
  """On DDPM (Karras spacing) the same closed form; on the flow from t = 0 its first step is
  Euler (sigma = inf there). The scan and the Python loop agree."""
  errs = ode_errors(paths.make_path("ddpm", T=1000), "edm_heun", (16, 32), spacing="karras")
  assert errs[-1] < 0.02 and errs[0] / errs[1] > 3.5, errs
  field = lambda v, x, t, y=None, train=False: closed_forms.gaussian_flow_velocity(  # noqa: E731
      x, t[:, None], MU, S0)
  kw = dict(sampler="edm_heun", steps=16, sample_shape=(1,))
  flow = paths.FlowPath()
  x = samplers.make_sampler(field, flow, **kw)(None, jax.random.PRNGKey(0), 11, x_init=Z)
  assert float(np.max(np.abs(x - (MU + S0 * Z)))) < 3e-3
  y = stepwise.make_python_loop_sampler(field, flow, **kw)(None, jax.random.PRNGKey(0), 11,
                                                           x_init=Z)
  np.testing.assert_allclose(x, y, atol=1e-6)


def test_churn_keeps_the_marginal():
  """S_churn = 40 over all noise levels: stochastic, and still N(MU, S0^2) (2,000 draws: the mean
  within 0.03, the std within 0.03)."""
  sample = samplers.make_sampler(gaussian_eps(EDM), EDM, sampler="edm_heun", steps=32,
                                 sample_shape=(1,), prediction="eps", s_churn=40.0, s_tmin=0.05,
                                 s_tmax=50.0, s_noise=1.0)
  x = np.asarray(sample(None, jax.random.PRNGKey(0), 2000))
  assert abs(x.mean() - MU) < 0.03 and abs(x.std() - S0) < 0.03, (x.mean(), x.std())
  assert not np.allclose(x[:5], np.asarray(sample(None, jax.random.PRNGKey(1), 2000))[:5])


# ----------------------------------------------------------------------------- bad input


def test_bad_input_is_one_line_each():
  apply = gaussian_eps(EDM)
  make = lambda prediction="eps", **kw: samplers.make_sampler(
      apply, EDM, sample_shape=(1,), prediction=prediction, **kw)
  with pytest.raises(ValueError, match=r"^sampler='heun' cannot run on the 'edm' path: .*edm_heun"):
    make(sampler="heun", steps=4)
  with pytest.raises(ValueError, match=r"^steps: sampler 'edm_heun' is of order 2"):
    make(sampler="edm_heun", steps=1)
  with pytest.raises(ValueError, match=r"^rho: must be > 0, got 0.0$"):
    make(sampler="edm_heun", steps=4, rho=0.0)
  with pytest.raises(ValueError, match=r"^s_churn: must be >= 0, got -1.0$"):
    make(sampler="edm_heun", steps=4, s_churn=-1.0)
  with pytest.raises(ValueError, match=r"^s_churn: churn is an option of 'edm_heun', not 'dpmpp"):
    make(sampler="dpmpp_2m", steps=4, s_churn=1.0)
  with pytest.raises(ValueError, match=r"^s_churn=1.0: .*discrete 'ddpm' path"):
    samplers.make_sampler(apply, paths.make_path("ddpm", T=100), sampler="edm_heun", steps=4,
                          prediction="eps", s_churn=1.0)
  with pytest.raises(ValueError, match=r"^sigma_min=80.0, sigma_max=1.0: expected 0 < sigma_min"):
    paths.EDMPath(sigma_min=80.0, sigma_max=1.0)
  with pytest.raises(ValueError, match=r"prediction='velocity' does not fit the 'edm' path"):
    make(sampler="edm_heun", steps=4, prediction="velocity")
  from jaxdl.generative.settings import EDMSettings
  with pytest.raises(ConfigError, match=r"^gen.sigma_min: must be < sigma_max = 1.0, got 2.0$"):
    EDMSettings(sigma_min=2.0, sigma_max=1.0)
  with pytest.raises(ConfigError, match=r"^gen.rho: must be > 0, got -7.0$"):
    EDMSettings(rho=-7.0)
  with pytest.raises(ConfigError, match=r"^gen.spacing: expected one of 'time', 'logsnr'"):
    EDMSettings(spacing="cosine")
