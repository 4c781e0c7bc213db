"""The update rules of the Gaussian-path samplers (registered in `jaxdl.generative.samplers`).

Step i goes from t = t_i to s = t_{i+1}, with (alpha, sigma) the path's coefficients; every rule
works on the pair (x_hat, eps_hat) the network's output converts to (`grid.predict`):

  'ddim'   x_s = alpha_s x_hat + sqrt(sigma_s^2 - c^2) eps_hat + c z,
           c^2 = eta^2 sigma_s^2 (1 - SNR_t / SNR_s), SNR = alpha^2 / sigma^2   (Song et al., 2021)
           eta = 0 is deterministic; eta = 1 has the variance of the ancestral step. On the flow
           path DDIM with eta = 0 is exactly the Euler step.
  'ddpm'   ancestral: x_s ~ q(x_s | x_t, x = x_hat) = N(mean, var) with alpha_ts = alpha_t/alpha_s,
           sigma_ts^2 = sigma_t^2 - alpha_ts^2 sigma_s^2,
           mean = alpha_ts sigma_s^2/sigma_t^2 x_t + alpha_s sigma_ts^2/sigma_t^2 x_hat,
           var = sigma_ts^2 sigma_s^2 / sigma_t^2      (Ho et al., 2020, on any sub-sequence).
  'euler'  x_s = x_t + h v(x_t, t), h = s - t, v = alpha' x_hat + sigma' eps_hat
           (flow: x_hat - eps_hat).
  'heun'   x' = x_t + h v(x_t, t); x_s = x_t + h/2 (v(x_t, t) + v(x', s)).

EDM-Heun and DPM-Solver++ step in the noise level sigma_ve = sigma / alpha = exp(-lambda) of any
Gaussian path (`spacings.sigma_ve`), in which the probability-flow ODE of y = x_t / alpha reads
dy / d sigma_ve = eps_hat (`paths`); the state the scan carries stays x_t = alpha y. Every
coefficient that depends only on the grid is computed once on the host, in float64
(`*_coefficients`, the rules' `prepare`), and read as grid.coef[name][i].

'edm_heun' (Karras et al., 2022, algorithm 2). Optional churn first raises the noise level to
  sig^ = sig_t (1 + gamma_t), gamma_t = min(S_churn / N, sqrt 2 - 1) where S_min <= sig_t <= S_max
  (else 0; sig_t in the data's units, sigma_data sig_t on EDM), adding fresh noise:
  y^ = y + sqrt(sig^^2 - sig_t^2) S_noise z. Then Euler in sig,
    y' = y^ + (sig_s - sig^) eps_hat(y^)   <=>   x' = alpha_s x_hat + sigma_s eps_hat   (DDIM),
  and, unless sig_s = 0 or the step starts from pure noise (the flow's sig^ = inf, DDPM's t = T),
  the trapezoidal correction
    y_s = y' + (sig_s - sig^) / 2 (eps_hat(y', s) - eps_hat(y^))   (second order).
  N steps cost 2N - 1 network calls on a grid that ends at sigma = 0 (one fewer again on the
  flow from t = 0 and on DDPM from t = T). The churned level must be a time of the path:
  continuous paths only.

'dpmpp_2m' / 'dpmpp_3m' (Lu et al., 2022, DPM-Solver++ multistep, data prediction): with
  h = lambda_s - lambda_t and D_i = x_hat at step i,
    x_s = (sigma_s / sigma_t) x_t - alpha_s expm1(-h) D,
  D = D_i (first order), D = (1 + 1/(2r)) D_i - 1/(2r) D_{i-1}, r = h_{i-1} / h (2M), or for 3M
  the phi_2 / phi_3 exponential-integrator corrections on the divided differences of D_i, D_{i-1},
  D_{i-2} (as k-diffusion's `sample_dpmpp_3m_sde` at eta = 0). The previous D's are the scan's
  history; a step uses only as many as follow finite steps, so the first step, the step after the
  flow's pure-noise end (h = inf) and the last step to sigma = 0 (h = inf: x_s = D_i) are lower
  order. One network call per step.

Shapes: N steps; x_B... a batch of samples.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.generative import paths as paths_lib
from jaxdl.generative import spacings


def ddim_update(x_hat, eps_hat, alpha_t, sigma_t, alpha_s, sigma_s, eta=0.0, z=None):
  """One DDIM step t -> s: x_s = alpha_s x_hat + sqrt(sigma_s^2 - c^2) eps_hat + c z.

  c^2 = eta^2 sigma_s^2 (1 - (alpha_t sigma_s)^2 / (alpha_s sigma_t)^2); with eta = 0 (z unused)
  the step keeps x_hat and eps_hat and mixes them again at the new noise level.
  """
  b = paths_lib._bc
  ratio = (alpha_t * sigma_s) / (alpha_s * sigma_t)
  c2 = eta**2 * sigma_s**2 * jnp.maximum(1.0 - ratio**2, 0.0)
  x_s = b(alpha_s, x_hat) * x_hat + b(jnp.sqrt(jnp.maximum(sigma_s**2 - c2, 0.0)), x_hat) * eps_hat
  if z is not None:
    x_s = x_s + b(jnp.sqrt(c2), x_hat) * z
  return x_s


def ancestral_mean_var(x_t, x_hat, alpha_t, sigma_t, alpha_s, sigma_s):
  """Mean and variance of the Gaussian posterior q(x_s | x_t, x = x_hat) for s < t in noise."""
  b = paths_lib._bc
  alpha_ts = alpha_t / alpha_s
  sigma_ts2 = sigma_t**2 - alpha_ts**2 * sigma_s**2
  mean = (b(alpha_ts * sigma_s**2 / sigma_t**2, x_t) * x_t
          + b(alpha_s * sigma_ts2 / sigma_t**2, x_t) * x_hat)
  return mean, sigma_ts2 * sigma_s**2 / sigma_t**2


def ddpm(grid, variables, x, i, key, y_B):
  """Ancestral: x_s ~ q(x_s | x_t, x = x_hat) = N(mean, var)."""
  x_hat, _, _ = grid.predict(variables, x, i, y_B)
  mean, var = ancestral_mean_var(x, x_hat, grid.alpha[i], grid.sigma[i],
                                 grid.alpha[i + 1], grid.sigma[i + 1])
  z = jax.random.normal(key, x.shape, x.dtype)
  return mean + jnp.sqrt(jnp.maximum(var, 0.0)) * z


def ddim(grid, variables, x, i, key, y_B):
  """x_s = alpha_s x_hat + sqrt(sigma_s^2 - c^2) eps_hat + c z (z unused when eta = 0)."""
  x_hat, eps_hat, _ = grid.predict(variables, x, i, y_B)
  z = jax.random.normal(key, x.shape, x.dtype) if grid.eta > 0 else None
  return ddim_update(x_hat, eps_hat, grid.alpha[i], grid.sigma[i],
                     grid.alpha[i + 1], grid.sigma[i + 1], grid.eta, z)


def euler(grid, variables, x, i, key, y_B):
  """x_s = x_t + h v(x_t, t), h = s - t."""
  h = grid.t[i + 1] - grid.t[i]
  return x + h * grid.velocity(variables, x, i, y_B)


def heun(grid, variables, x, i, key, y_B):
  """x' = x_t + h v(x_t, t); x_s = x_t + h/2 (v(x_t, t) + v(x', s))."""
  h = grid.t[i + 1] - grid.t[i]
  v_t = grid.velocity(variables, x, i, y_B)
  x_e = x + h * v_t
  return x + 0.5 * h * (v_t + grid.velocity(variables, x_e, i + 1, y_B))


def edm_heun_coefficients(path, t_N1, alpha_N1, sigma_N1, settings):
  """Per-step constants of 'edm_heun': the churned time and scales, and which steps correct
  (`settings`: the sampler's `SamplerSettings`, whose churn keys it reads)."""
  n = len(t_N1) - 1
  sig_N1 = spacings.sigma_ve(path, t_N1)
  sig_N, finite_N = sig_N1[:-1], np.isfinite(sig_N1[:-1])
  s_tmax = math.inf if settings.s_tmax is None else settings.s_tmax
  level_N = sig_N * path.data_scale  # S_min, S_max are in the data's units (Karras's sigma)
  in_range_N = finite_N & (level_N >= settings.s_tmin) & (level_N <= s_tmax)
  gamma_N = np.where(in_range_N, min(settings.s_churn / n, math.sqrt(2) - 1), 0.0)
  churn = bool(np.any(gamma_N > 0))
  if churn and not path.continuous:
    raise ValueError(f"s_churn={settings.s_churn}: churn raises sigma to levels between the "
                     f"grid's times, which the discrete {path.name!r} path does not have; use "
                     "s_churn=0 or a continuous path")
  sig_hat_N = sig_N * (1 + gamma_N)
  heun_N = finite_N & (sig_N1[1:] > 0)
  if not path.continuous and t_N1[0] >= path.T:
    # DDPM's x_T is pure noise up to alpha_T (sig_T = 157 on the linear schedule, 2e4 on the
    # cosine): the trapezoid over that first step would scale the network's eps error by half its
    # length, as on the flow's sigma = inf end, so it is taken by Euler (DDIM's first step).
    heun_N[0] = False
  out = {"churn": churn, "heun": heun_N}
  with np.errstate(invalid="ignore"):  # inf * 0 on the flow's pure-noise step, masked below
    out["half_h"] = np.where(out["heun"], (sigma_N1[1:] - alpha_N1[1:] * sig_hat_N) / 2, 0.0)
  if churn:
    t_hat_N = np.where(gamma_N > 0, path.time_of_sigma(np.where(finite_N, sig_hat_N, 1.0)),
                       t_N1[:-1])
    alpha_hat_N, sigma_hat_N = (np.asarray(a, np.float64) for a in path.alpha_sigma(t_hat_N))
    out.update(t_hat=t_hat_N, alpha_hat=alpha_hat_N, sigma_hat=sigma_hat_N,
               scale=np.where(gamma_N > 0, alpha_hat_N / alpha_N1[:-1], 1.0),
               noise=np.where(gamma_N > 0, alpha_hat_N * settings.s_noise
                              * np.sqrt(np.maximum(sig_hat_N**2 - sig_N**2, 0.0)), 0.0))
  return out


def edm_heun_calls(coef, steps: int) -> int:
  """Network calls of N steps of 'edm_heun': N, plus one for each step with Heun's correction."""
  return steps + int(np.sum(coef["heun"]))


def edm_heun(grid, variables, x, i, key, y_B):
  """Churn (optional), Euler in sigma_ve, then Heun's correction unless the step is an end."""
  c = grid.coef
  if c["churn"]:
    z = jax.random.normal(key, x.shape, x.dtype)
    x = c["scale"][i] * x + c["noise"][i] * z
    x_hat, eps_hat = grid.predict_at(variables, x, c["t_hat"][i], c["alpha_hat"][i],
                                     c["sigma_hat"][i], y_B)
  else:
    x_hat, eps_hat, _ = grid.predict(variables, x, i, y_B)
  x_e = grid.alpha[i + 1] * x_hat + grid.sigma[i + 1] * eps_hat

  def correct():
    _, eps_e, _ = grid.predict(variables, x_e, i + 1, y_B)
    return x_e + c["half_h"][i] * (eps_e - eps_hat)

  # A cond, not a select: the last step must not call the network at sigma = 0.
  return jax.lax.cond(c["heun"][i], correct, lambda: x_e)


def _multistep_weights(h, h1, h2, order):
  """Weights (u0, u1, u2) of D_i, D_{i-1}, D_{i-2} in the correction D of one step, divided by
  -expm1(-h) for the first-order part and with the 3M terms added as they are (see the module
  docstring); h1, h2 the previous steps' h."""
  b = -math.expm1(-h)
  if order == 1:
    return b, 0.0, 0.0
  r0 = h1 / h
  if order == 2:
    return b * (1 + 1 / (2 * r0)), -b / (2 * r0), 0.0
  r1 = h2 / h
  phi2 = math.expm1(-h) / h + 1
  phi3 = phi2 / h - 0.5
  # d1_0 = (D0 - D1)/r0, d1_1 = (D1 - D2)/r1, d1 = d1_0 + (d1_0 - d1_1) r0/(r0 + r1),
  # d2 = (d1_0 - d1_1)/(r0 + r1); the update adds phi2 d1 - phi3 d2: linear in (D0, D1, D2).
  def correction(d0, d1, d2):
    d1_0, d1_1 = (d0 - d1) / r0, (d1 - d2) / r1
    return (phi2 * (d1_0 + (d1_0 - d1_1) * r0 / (r0 + r1))
            - phi3 * (d1_0 - d1_1) / (r0 + r1))
  return (b + correction(1, 0, 0), correction(0, 1, 0), correction(0, 0, 1))


def multistep_coefficients(order: int):
  """`prepare` of DPM-Solver++(order M): per step the weights w_i of
  x_s = w0 x_t + w1 D_i + w2 D_{i-1} + w3 D_{i-2}."""
  def prepare(path, t_N1, alpha_N1, sigma_N1, settings):
    del path, t_N1, settings
    with np.errstate(divide="ignore"):
      lam_N1 = np.log(alpha_N1) - np.log(sigma_N1)
    h_N = np.diff(lam_N1)
    n = len(h_N)
    w_Nx4 = np.zeros((n, 4))
    for i in range(n):
      k = 1  # the order this step can take: 1 + the finite steps just before it
      while np.isfinite(h_N[i]) and k < order and i - k >= 0 and np.isfinite(h_N[i - k]):
        k += 1
      h = h_N[i]
      u = ((1.0, 0.0, 0.0) if not np.isfinite(h)
           else _multistep_weights(h, h_N[i - 1] if k > 1 else None,
                                   h_N[i - 2] if k > 2 else None, k))
      w_Nx4[i] = (sigma_N1[i + 1] / sigma_N1[i], *(alpha_N1[i + 1] * np.asarray(u)))
    return {"w": w_Nx4}
  return prepare


def dpmpp(grid, variables, x, hist, i, key, y_B):
  """x_s = w0 x_t + w1 D_i + w2 D_{i-1} (+ w3 D_{i-2}); the history shifts by one."""
  del key
  x_hat, _, _ = grid.predict(variables, x, i, y_B)
  w = grid.coef["w"][i]
  x_s = w[0] * x + w[1] * x_hat
  for k, d in enumerate(hist):
    x_s = x_s + w[2 + k] * d
  return x_s, (x_hat,) + tuple(hist[:-1])


def init_history(x, history: int):
  """The scan's history at step 0: `history` arrays of x's shape, unused (weight 0) there."""
  return tuple(jnp.zeros_like(x) for _ in range(history))
