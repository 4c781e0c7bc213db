"""Gaussian probability paths x_t = alpha_t x + sigma_t eps and conversions between network outputs.

One family covers DDPM and rectified flow (Gao et al., 2024):

- DDPM (`DDPMPath`): discrete t = 0..T with t = 0 the data; alpha_t = sqrt(alpha_bar_t),
  sigma_t = sqrt(1 - alpha_bar_t). Schedules: linear beta 1e-4 -> 0.02 (Ho et al., 2020), with
  alpha_bar_t = prod_{s<=t} (1 - beta_s), and the cosine alpha_bar (Nichol & Dhariwal, 2021).
- Rectified flow (`FlowPath`): continuous t in [0, 1] with t = 0 the noise; alpha_t = t,
  sigma_t = 1 - t; the network learns v = E[x - eps | x_t].
- EDM (`EDMPath`, Karras et al., 2022): t = sigma, the noise level of x + sigma eps, from
  sigma_max down to 0, held in the network's coordinates c_in (x + sigma eps); see its docstring.

A network predicts one of
  'eps'      eps_hat = E[eps | x_t]
  'x0'       x_hat   = E[x | x_t]
  'v'        v_vp    = alpha eps - sigma x      (Salimans & Ho, 2022; variance-preserving paths)
  'velocity' v_flow  = x - eps = d x_t / dt           (rectified flow, alpha + sigma = 1)
  'edm'      F       = -v_vp                          (Karras et al.'s F_theta on `EDMPath`)
and `to_x_eps` / `from_x_eps` convert between them through the pair (x_hat, eps_hat), using
x_t = alpha x_hat + sigma eps_hat. Each path lists the predictions that fit it (`path.predictions`,
checked by `check_prediction`): 'v' needs alpha^2 + sigma^2 = 1 and 'velocity' alpha + sigma = 1,
so the flow takes ('velocity', 'x0'), DDPM ('eps', 'x0', 'v') and EDM ('edm', 'v', 'eps', 'x0');
'eps' on the flow would divide by alpha_0 = 0 at the first sampler step. The score follows from
Tweedie: grad log p_t(x_t) = -eps_hat / sigma. Every path also has the variance-exploding noise
level sigma_ve = sigma / alpha = exp(-lambda), lambda = log(alpha / sigma) the half log-SNR, in
which x_t / alpha = x_hat + sigma_ve eps_hat; the EDM and DPM-Solver++ samplers step in it.

The closed-form fields that tests and `jaxdl reproduce` check against (two-point data {-1, +1},
Gaussian data) are in `jaxdl.generative.closed_forms`.

Shapes: B batch, N steps of a time grid; arrays with trailing data dims are written x_B... .
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

PREDICTIONS = ("eps", "x0", "v", "velocity", "edm")
# Karras et al.'s (2022) exponent of the sigma^(1/rho) grid: the one default of every `rho`.
KARRAS_RHO = 7.0


# ----------------------------------------------------------------------------- schedules


def linear_beta_alpha_bar(T: int = 1000, beta_start: float = 1e-4, beta_end: float = 0.02):
  """alpha_bar_t = prod_{s=1..t} (1 - beta_s), beta linear from beta_start to beta_end.

  Returns a float64 numpy array of length T + 1 with alpha_bar_0 = 1 (t = 0 is the data).
  """
  betas_T = np.linspace(beta_start, beta_end, T, dtype=np.float64)
  return np.concatenate([[1.0], np.cumprod(1.0 - betas_T)])


def cosine_alpha_bar(T: int = 1000, s: float = 0.008, max_beta: float = 0.999):
  """alpha_bar_t = f(t) / f(0), f(t) = cos^2(pi/2 (t/T + s)/(1 + s)), betas clipped at max_beta.

  The clip keeps alpha_bar_T > 0 so that x_hat = (x_t - sigma eps)/alpha stays finite.
  Returns a float64 numpy array of length T + 1 with alpha_bar_0 = 1.
  """
  t_T1 = np.arange(T + 1, dtype=np.float64) / T
  f_T1 = np.cos(0.5 * math.pi * (t_T1 + s) / (1 + s)) ** 2
  betas_T = np.minimum(1.0 - f_T1[1:] / f_T1[:-1], max_beta)
  return np.concatenate([[1.0], np.cumprod(1.0 - betas_T)])


SCHEDULES = {"linear": linear_beta_alpha_bar, "cosine": cosine_alpha_bar}


# ----------------------------------------------------------------------------- paths


@dataclasses.dataclass(frozen=True, eq=False)
class DDPMPath:
  """Discrete variance-preserving path, t in {0, ..., T}; t = 0 is the data.

  Attributes:
    alpha_bar: float64 numpy array (T + 1,), alpha_bar[0] = 1, decreasing.
  """

  alpha_bar: np.ndarray
  name: str = "ddpm"
  continuous: bool = False
  predictions: ClassVar[tuple] = ("eps", "x0", "v")
  data_scale: ClassVar[float] = 1.0  # the path carries x itself (EDMPath: x / sigma_data)

  @property
  def T(self) -> int:
    return len(self.alpha_bar) - 1

  def alpha_sigma(self, t):
    """(alpha_t, sigma_t) = (sqrt(alpha_bar_t), sqrt(1 - alpha_bar_t)); t integer, numpy or jax."""
    if isinstance(t, jax.Array):
      # Square roots in float64 first: 1 - alpha_bar in float32 loses digits near t = 1.
      return (jnp.asarray(np.sqrt(self.alpha_bar), jnp.float32)[t],
              jnp.asarray(np.sqrt(1.0 - self.alpha_bar), jnp.float32)[t])
    ab = self.alpha_bar[np.asarray(t)]
    return np.sqrt(ab), np.sqrt(1.0 - ab)

  def model_time(self, t):
    """The time fed to the network: t / T in [0, 1]."""
    return t / self.T

  def sample_train_time(self, rng, batch: int):
    """t ~ uniform on {1, ..., T}."""
    return jax.random.randint(rng, (batch,), 1, self.T + 1)

  def time_grid(self, steps: int):
    """Integer times from T down to 0 (noise -> data), steps + 1 distinct values.

    steps = T is the full ancestral chain; fewer steps give an evenly spaced sub-sequence.
    """
    if not 1 <= steps <= self.T:
      raise ValueError(f"steps={steps}: a DDPM path with T={self.T} takes 1 <= steps <= {self.T}")
    return np.round(np.linspace(self.T, 0, steps + 1)).astype(np.int64)


@dataclasses.dataclass(frozen=True, eq=False)
class FlowPath:
  """Rectified-flow path, t in [0, 1]; t = 0 is noise, x_t = t x + (1 - t) eps."""

  name: str = "flow"
  continuous: bool = True
  predictions: ClassVar[tuple] = ("velocity", "x0")
  data_scale: ClassVar[float] = 1.0

  def alpha_sigma(self, t):
    return t, 1.0 - t

  def d_alpha_sigma(self, t):
    """(d alpha/dt, d sigma/dt) = (1, -1): the ODE velocity is x_hat - eps_hat."""
    del t
    return 1.0, -1.0

  def model_time(self, t):
    return t

  def sample_train_time(self, rng, batch: int):
    """t ~ U[0, 1]."""
    return jax.random.uniform(rng, (batch,))

  def time_grid(self, steps: int, t_end: float = 1.0):
    """steps + 1 evenly spaced times from 0 (noise) to t_end (data)."""
    if steps < 1:
      raise ValueError(f"steps={steps}: the number of sampler steps must be >= 1")
    return np.linspace(0.0, t_end, steps + 1)

  def time_of_sigma(self, sigma_ve):
    """The t whose sigma_ve = (1 - t) / t is `sigma_ve`: t = 1 / (1 + sigma_ve)."""
    return 1.0 / (1.0 + sigma_ve)


@dataclasses.dataclass(frozen=True, eq=False)
class EDMPath:
  """The EDM formulation (Karras et al., 2022) as a path of this family; t = sigma.

  Karras et al. noise the data as x + sigma eps and call the network on c_in (x + sigma eps)
  with c_in = 1/sqrt(sigma^2 + sd^2), sd = sigma_data. This path holds that network input:
    x_t = c_in (x + t eps) = alpha x' + sigma eps,   x' = x / sd (`data_scale` = sd),
    alpha_t = sd / sqrt(t^2 + sd^2),   sigma_t = t / sqrt(t^2 + sd^2),   alpha^2 + sigma^2 = 1,
  so the data end t = 0 has alpha = 1 and x_0 = x' (samplers return sd x_0), the noise end
  t = sigma_max has x_t ~ N(0, I) for data of variance sd^2, and sigma_ve = t / sd (the noise
  level of x' + sigma_ve eps, in the whitened units of x'). The network is fed
  c_noise = ln(t) / 4 (`model_time`). Its raw output F (prediction 'edm') gives Karras's
  denoiser D = c_skip (x + t eps) + c_out F, with (`edm_preconditioning`)
    c_skip = sd^2 / (t^2 + sd^2),  c_out = t sd / sqrt(t^2 + sd^2),  c_in = 1 / sqrt(t^2 + sd^2);
  on this path D / sd = alpha x_t + sigma F, i.e. F is minus the v prediction (`to_x_eps`).
  Training draws ln t ~ N(p_mean, p_std^2) (`sample_train_time`); the unweighted MSE of F is
  Karras's loss lambda(t) ||D - x||^2 with lambda = (t^2 + sd^2) / (t sd)^2 (`edm_loss_weight`).
  The time grid is Karras's: `karras_sigmas(steps, sigma_min, sigma_max, rho)` then t = 0.
  """

  sigma_data: float = 0.5
  sigma_min: float = 0.002
  sigma_max: float = 80.0
  p_mean: float = -1.2
  p_std: float = 1.2
  name: str = "edm"
  continuous: bool = True
  predictions: ClassVar[tuple] = ("edm", "v", "eps", "x0")

  def __post_init__(self):
    if not 0 < self.sigma_min < self.sigma_max or not math.isfinite(self.sigma_max):
      raise ValueError(f"sigma_min={self.sigma_min}, sigma_max={self.sigma_max}: expected "
                       "0 < sigma_min < sigma_max < inf")
    if not self.sigma_data > 0 or not self.p_std > 0:
      raise ValueError(f"sigma_data={self.sigma_data}, p_std={self.p_std}: both must be > 0")

  @property
  def data_scale(self) -> float:
    return self.sigma_data

  def alpha_sigma(self, t):
    """(sd, t) / sqrt(t^2 + sd^2)."""
    r = (jnp if isinstance(t, jax.Array) else np).sqrt(t**2 + self.sigma_data**2)
    return self.sigma_data / r, t / r

  def d_alpha_sigma(self, t):
    """(d alpha/dt, d sigma/dt) = (-sd t, sd^2) / (t^2 + sd^2)^(3/2)."""
    r3 = (t**2 + self.sigma_data**2) ** 1.5
    return -self.sigma_data * t / r3, self.sigma_data**2 / r3

  def model_time(self, t):
    """c_noise = ln(t) / 4 (-inf at t = 0: no sampler calls the network there)."""
    if isinstance(t, jax.Array):
      return jnp.log(t) / 4
    with np.errstate(divide="ignore"):
      return np.log(t) / 4

  def sample_train_time(self, rng, batch: int):
    """ln t ~ N(p_mean, p_std^2): log-normal noise levels."""
    return jnp.exp(self.p_mean + self.p_std * jax.random.normal(rng, (batch,)))

  def time_grid(self, steps: int, rho: float = KARRAS_RHO):
    """Karras's grid: `karras_sigmas(steps, sigma_min, sigma_max, rho)` then 0 (steps + 1 times)."""
    return np.append(karras_sigmas(steps, self.sigma_min, self.sigma_max, rho), 0.0)

  def time_of_sigma(self, sigma_ve):
    """t = sd sigma_ve."""
    return self.sigma_data * sigma_ve


def karras_sigmas(n: int, sigma_min: float, sigma_max: float, rho: float):
  """sigma_i = (sigma_max^(1/rho) + i/(n-1) (sigma_min^(1/rho) - sigma_max^(1/rho)))^rho,
  i = 0..n-1 (Karras et al., 2022, eq. 5): n noise levels from sigma_max down to sigma_min, float64;
  n = 1 gives [sigma_max]."""
  if not rho > 0:
    raise ValueError(f"rho={rho}: expected rho > 0 (Karras et al. use {KARRAS_RHO:g})")
  if not 0 < sigma_min < sigma_max < math.inf:
    raise ValueError(f"sigma_min={sigma_min}, sigma_max={sigma_max}: expected "
                     "0 < sigma_min < sigma_max < inf")
  ramp_n = np.linspace(0.0, 1.0, n) if n > 1 else np.zeros(1)
  lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
  return (hi + ramp_n * (lo - hi)) ** rho


def edm_preconditioning(sigma, sigma_data: float = 0.5):
  """(c_skip, c_out, c_in, c_noise) of Karras et al. (2022, table 1) at noise level sigma:
  sd^2/(sigma^2 + sd^2), sigma sd/sqrt(sigma^2 + sd^2), 1/sqrt(sigma^2 + sd^2), ln(sigma)/4."""
  xp = jnp if isinstance(sigma, jax.Array) else np
  r = xp.sqrt(sigma**2 + sigma_data**2)
  return sigma_data**2 / r**2, sigma * sigma_data / r, 1.0 / r, xp.log(sigma) / 4


def edm_loss_weight(sigma, sigma_data: float = 0.5):
  """lambda(sigma) = (sigma^2 + sd^2) / (sigma sd)^2 = 1 / c_out^2 (Karras et al., 2022)."""
  return (sigma**2 + sigma_data**2) / (sigma * sigma_data) ** 2


def make_path(name: str, *, T: int = 1000, schedule: str = "linear", **edm):
  """Builds a path by name: 'flow', 'ddpm' with schedule 'linear' | 'cosine' and T steps, or
  'edm' with `EDMPath`'s keywords (sigma_data, sigma_min, sigma_max, p_mean, p_std)."""
  if name == "flow":
    return FlowPath()
  if name == "ddpm":
    if schedule not in SCHEDULES:
      raise ValueError(f"schedule={schedule!r}: expected one of {sorted(SCHEDULES)}")
    return DDPMPath(alpha_bar=SCHEDULES[schedule](T))
  if name == "edm":
    return EDMPath(**edm)
  raise ValueError(f"path={name!r}: expected 'flow', 'ddpm' or 'edm'")


def add_noise(x, eps, alpha, sigma):
  """x_t = alpha x + sigma eps, alpha and sigma per example (B,) broadcast over data dims."""
  return _bc(alpha, x) * x + _bc(sigma, x) * eps


# ----------------------------------------------------------------------------- conversions


def _bc(a, x):
  """Broadcasts a per-example (B,) coefficient (or a scalar) against x_B...."""
  a = jnp.asarray(a, x.dtype)
  return a.reshape(a.shape + (1,) * (x.ndim - a.ndim))


def eps_to_x0(x_t, eps_hat, alpha, sigma):
  """x_hat = (x_t - sigma eps_hat) / alpha."""
  return (x_t - _bc(sigma, x_t) * eps_hat) / _bc(alpha, x_t)


def x0_to_eps(x_t, x_hat, alpha, sigma):
  """eps_hat = (x_t - alpha x_hat) / sigma."""
  return (x_t - _bc(alpha, x_t) * x_hat) / _bc(sigma, x_t)


def eps_to_score(eps_hat, sigma):
  """Tweedie: grad_x log p_t(x_t) = -eps_hat / sigma."""
  return -eps_hat / _bc(sigma, eps_hat)


def score_to_eps(score, sigma):
  """eps_hat = -sigma * score."""
  return -_bc(sigma, score) * score


def check_prediction(prediction: str, path=None) -> None:
  """Raises ValueError unless `prediction` is known and, given a path, one that fits it."""
  if prediction not in PREDICTIONS:
    raise ValueError(f"prediction={prediction!r}: expected one of {PREDICTIONS}")
  if path is not None and prediction not in path.predictions:
    raise ValueError(
        f"prediction={prediction!r} does not fit the {path.name!r} path: expected one of "
        f"{path.predictions} ('v' assumes alpha^2 + sigma^2 = 1, 'velocity' alpha + sigma = 1, "
        "'edm' the EDM path, and 'eps' on the flow divides by alpha_0 = 0)")


def to_x_eps(out, x_t, alpha, sigma, prediction: str, path=None):
  """Network output -> (x_hat, eps_hat), using x_t = alpha x_hat + sigma eps_hat.

  With `path`, a prediction that does not fit it is refused (`check_prediction`): the formulas
  below hold only on the paths named, and elsewhere return a wrong x_hat without an error.

  'eps': x_hat = (x_t - sigma eps)/alpha.       'x0': eps_hat = (x_t - alpha x)/sigma.
  'v' (needs alpha^2 + sigma^2 = 1): x_hat = alpha x_t - sigma v, eps_hat = sigma x_t + alpha v.
  'velocity' (needs alpha + sigma = 1): x_hat = x_t + sigma v, eps_hat = x_t - alpha v
  (for the flow: x_hat = x_t + (1 - t) v and eps_hat = x_t - t v).
  'edm' (the EDM path, F = -v): x_hat = alpha x_t + sigma F, eps_hat = sigma x_t - alpha F.
  """
  check_prediction(prediction, path)
  a, s = _bc(alpha, x_t), _bc(sigma, x_t)
  if prediction == "eps":
    return (x_t - s * out) / a, out
  if prediction == "x0":
    return out, (x_t - a * out) / s
  if prediction == "v":
    return a * x_t - s * out, s * x_t + a * out
  if prediction == "edm":
    return a * x_t + s * out, s * x_t - a * out
  if prediction == "velocity":
    return x_t + s * out, x_t - a * out
  raise ValueError(f"prediction={prediction!r}: expected one of {PREDICTIONS}")


def from_x_eps(x_hat, eps_hat, alpha, sigma, prediction: str, path=None):
  """(x_hat, eps_hat) -> what a network with `prediction` outputs (the inverse of `to_x_eps`).

  'v': alpha eps - sigma x.  'velocity': x - eps (the flow target).  'edm': sigma x - alpha eps.
  With `path`, a prediction that does not fit it is refused, as in `to_x_eps`.
  """
  check_prediction(prediction, path)
  a, s = _bc(alpha, x_hat), _bc(sigma, x_hat)
  if prediction == "eps":
    return eps_hat
  if prediction == "x0":
    return x_hat
  if prediction == "v":
    return a * eps_hat - s * x_hat
  if prediction == "velocity":
    return x_hat - eps_hat
  if prediction == "edm":
    return s * x_hat - a * eps_hat
  raise ValueError(f"prediction={prediction!r}: expected one of {PREDICTIONS}")


def flow_velocity_from_x0(x_t, x_hat, t):
  """v = (x_hat - x_t) / (1 - t) on the flow path."""
  return (x_hat - x_t) / (1.0 - _bc(t, x_t))


def flow_velocity_from_eps(x_t, eps_hat, t):
  """v = (x_t - eps_hat) / t on the flow path."""
  return (x_t - eps_hat) / _bc(t, x_t)
