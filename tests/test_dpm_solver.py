"""Tests for DPM-Solver++ (2M, 3M) and the time spacings, with the exact denoiser of Gaussian data
N(mu, s0^2) in place of a network (no training)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdl.generative import closed_forms, paths, samplers, spacings, stepwise
from test_edm import MU, S0, gaussian_eps  # the exact denoiser of N(MU, S0^2)

Z = np.linspace(-2.5, 2.5, 11, dtype=np.float32)[:, None]
FLOW = paths.FlowPath()
DDPM = paths.make_path("ddpm", T=1000)
EDM = paths.EDMPath()


def flow_field(variables, x, t_1, y=None, train=False):
  return closed_forms.gaussian_flow_velocity(x, t_1[:, None], MU, S0)


def ode_errors(path, sampler, ns, **kw):
  """max |x_N - (MU + S0 z)| per N, from the exact marginal at the grid's first time (on the flow
  t = 0, x = z), whose probability-flow ODE ends at MU + S0 z."""
  mu_w, s_w = MU / path.data_scale, S0 / path.data_scale
  apply, prediction = (flow_field, "velocity") if path.name == "flow" else (gaussian_eps(path),
                                                                             "eps")
  errs = []
  for n in ns:
    t0 = spacings.time_grid(path, n, kw.get("spacing"))[0]
    a0, s0 = (float(v) for v in path.alpha_sigma(t0))
    x_init = a0 * mu_w + np.sqrt(a0**2 * s_w**2 + s0**2) * Z
    sample = samplers.make_sampler(apply, path, sampler=sampler, steps=n, sample_shape=(1,),
                                   prediction=prediction, **kw)
    errs.append(float(np.max(np.abs(sample(None, jax.random.PRNGKey(0), len(Z), x_init=x_init)
                                     - (MU + S0 * Z)))))
  return np.array(errs)


# ----------------------------------------------------------------------------- convergence


@pytest.mark.parametrize("path,spacing,ns,last_error,low", [
    (DDPM, "karras", (16, 32, 64), 6e-3, 3.5),   # measured 7.5e-2, 2.0e-2, 4.2e-3: 3.8, 4.7
    (EDM, None, (16, 32, 64), 5e-3, 3.5),        # Karras grid from 80: 8.4e-2 .. 4.1e-3: 4.6, 4.5
    (FLOW, "time", (64, 128, 256), 5e-4, 2.8),   # 3.1, 3.3: the first lambda-steps do not shrink
])
def test_dpmpp_2m_converges_at_second_order(path, spacing, ns, last_error, low):
  """Error ratio ~4 when N doubles, within [low, 5.2]; the last error below `last_error`."""
  errs = ode_errors(path, "dpmpp_2m", ns, spacing=spacing)
  ratios = errs[:-1] / errs[1:]
  assert errs[-1] < last_error, errs
  assert np.all((ratios > low) & (ratios < 5.2)), (errs, ratios)


def test_dpmpp_3m_converges_and_beats_2m_at_equal_calls():
  """3M's first steps are lower order, so its global order stays near 2 (measured 2.9 and 3.9 for
  N = 32 -> 64 -> 128 on sigma_max = 10); at 64 calls its error is below 2M's."""
  path = paths.EDMPath(sigma_max=10.0)
  e3 = ode_errors(path, "dpmpp_3m", (32, 64))
  e2 = ode_errors(path, "dpmpp_2m", (64,))
  assert e3[1] < e3[0] and e3[1] < 0.5 * e2[0], (e3, e2)


def test_logsnr_spacing_converges_on_ddpm_and_flow():
  assert ode_errors(DDPM, "dpmpp_2m", (32,), spacing="logsnr")[0] < 0.01
  assert ode_errors(FLOW, "dpmpp_2m", (32,), spacing="logsnr")[0] < 1e-3


# ----------------------------------------------------------------------------- the grids


def test_spacings_are_uniform_in_their_variable():
  lam = lambda path, t: -np.log(spacings.sigma_ve(path, t))
  t = spacings.time_grid(FLOW, 8, "logsnr")
  assert t[0] == 0.0 and t[-1] == 1.0
  np.testing.assert_allclose(np.diff(lam(FLOW, t[1:-1])), np.diff(lam(FLOW, t[1:-1]))[0],
                             rtol=1e-9)
  t = spacings.time_grid(DDPM, 10, "logsnr")  # integers: uniform up to rounding
  assert t[0] == 1000 and t[-2] == 1 and t[-1] == 0 and t.dtype == np.int64
  d = np.diff(lam(DDPM, t[:-1]))
  assert np.all(np.abs(d / d.mean() - 1) < 0.2), d
  t = spacings.time_grid(EDM, 6, "karras", rho=3.0)
  np.testing.assert_allclose(np.diff(t[:-1] ** (1 / 3)), np.diff(t[:-1] ** (1 / 3))[0],
                             rtol=1e-9)
  np.testing.assert_allclose(t[[0, -2, -1]], [80.0, 0.002, 0.0], rtol=1e-12)


# ----------------------------------------------------------------------------- equivalences


def test_history_in_the_scan_equals_the_python_loop():
  kw = dict(sampler="dpmpp_3m", steps=12, sample_shape=(1,), prediction="eps",
            spacing="logsnr")
  apply = gaussian_eps(DDPM)
  key = jax.random.PRNGKey(4)
  np.testing.assert_allclose(samplers.make_sampler(apply, DDPM, **kw)(None, key, 8),
                             stepwise.make_python_loop_sampler(apply, DDPM, **kw)(None, key, 8),
                             atol=1e-5)


def conditional_field(variables, x, t_B, y=None, train=False):
  """A toy conditional velocity: pull towards class centre y (null class 3 pulls to 0)."""
  centres = jnp.array([-2.0, 0.0, 2.0, 0.0])
  c = centres[y][:, None] if y is not None else 0.0
  return c - x * (1 - t_B[:, None])


def test_guidance_works_with_dpmpp():
  """w = 1 is the conditional sampler, w = 0 the unconditional one, and the sample is affine in
  w (the update is linear in the network outputs)."""
  kw = dict(sampler="dpmpp_2m", steps=8, sample_shape=(1,), num_classes=3, t_end=0.99)
  key = jax.random.PRNGKey(0)
  run = lambda **g: samplers.make_sampler(conditional_field, FLOW, **kw, **g)
  cond, uncond = run()(None, key, 8, y=2), run()(None, key, 8)
  np.testing.assert_allclose(run(guidance=1.0)(None, key, 8, y=2), cond, atol=1e-5)
  np.testing.assert_allclose(run(guidance=0.0)(None, key, 8, y=2), uncond, atol=1e-5)
  np.testing.assert_allclose(run(guidance=3.0)(None, key, 8, y=2) - uncond, 3 * (cond - uncond),
                             atol=1e-4)


# ----------------------------------------------------------------------------- bad input


def test_bad_input_is_one_line_each():
  apply = gaussian_eps(DDPM)
  make = lambda **kw: samplers.make_sampler(apply, DDPM, sample_shape=(1,), prediction="eps",
                                            **kw)
  with pytest.raises(ValueError, match=r"^steps: sampler 'dpmpp_2m' is of order 2 and takes "
                                       r"steps >= 2, got 1$"):
    make(sampler="dpmpp_2m", steps=1)
  with pytest.raises(ValueError, match=r"^steps: sampler 'dpmpp_3m' is of order 3"):
    make(sampler="dpmpp_3m", steps=2)
  with pytest.raises(ValueError, match=r"^spacing: expected one of 'time', 'logsnr'"):
    make(sampler="dpmpp_2m", steps=4, spacing="cosine")
  with pytest.raises(ValueError, match=r"^rho: must be > 0, got -1.0$"):
    make(sampler="dpmpp_2m", steps=4, spacing="karras", rho=-1.0)
  with pytest.raises(ValueError, match=r"^steps=400 with spacing='logsnr' puts two grid points"):
    make(sampler="dpmpp_2m", steps=400, spacing="logsnr")
