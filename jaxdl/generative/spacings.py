"""Time grids of the samplers: where the N + 1 points from noise to data fall on a path.

A grid keeps the path's two ends (noise first, data last) and spaces the points between evenly in
one variable of the noise level sigma_ve = sigma / alpha (`paths`):

  'time'     t itself: the path's own grid (`path.time_grid`; on EDM t = sigma_ve)
  'logsnr'   lambda = -log sigma_ve, half the log signal-to-noise ratio (Lu et al., 2022)
  'karras'   sigma_ve^(1/rho), rho = `paths.KARRAS_RHO` by default (Karras et al., 2022, eq. 5)

over the finite, nonzero noise levels the grid visits:
  DDPM   N points from t = T down to t = 1, then t = 0 (alpha_bar = 1: the data); the points are
         rounded to the nearest integer time, and two of them meeting is refused;
  flow   t = 0 (pure noise, sigma_ve = inf) and t = t_end kept; the N - 1 points between span
         the noise levels of the time-uniform grid's first and last inner points;
  EDM    N points from sigma_max down to sigma_min, then sigma = 0 ('karras' is its own grid).
"""

from __future__ import annotations

import numpy as np

from jaxdl.generative import paths as paths_lib

SPACINGS = ("time", "logsnr", "karras")


def sigma_ve(path, t_N1):
  """sigma / alpha at each time (inf where alpha = 0), float64: the noise level the grids and
  the EDM / DPM-Solver++ rules (`solvers`) step in."""
  alpha, sigma = (np.asarray(a, np.float64) for a in path.alpha_sigma(np.asarray(t_N1)))
  with np.errstate(divide="ignore"):
    return sigma / alpha


def spaced_sigmas(n: int, hi: float, lo: float, spacing: str, rho: float):
  """n noise levels from hi down to lo, evenly spaced in sigma ('time'), log sigma ('logsnr') or
  sigma^(1/rho) ('karras'); float64."""
  if spacing == "karras":
    return paths_lib.karras_sigmas(n, lo, hi, rho) if n > 1 else np.array([hi])
  if spacing == "logsnr":
    return np.exp(np.linspace(np.log(hi), np.log(lo), n))
  return np.linspace(hi, lo, n)


def time_grid(path, steps: int, spacing: str | None = None, *,
              rho: float = paths_lib.KARRAS_RHO, t_end: float = 1.0):
  """The N + 1 = steps + 1 times of a sampler on `path` (see the module docstring); spacing
  None is the path's own grid ('time' on DDPM and the flow, 'karras' on EDM)."""
  if spacing is not None and spacing not in SPACINGS:
    raise ValueError(f"spacing={spacing!r}: expected one of {SPACINGS}")
  if path.name == "edm":
    if t_end != 1.0:
      raise ValueError(f"t_end={t_end}: the EDM path's grid always ends at sigma = 0")
    if spacing in (None, "karras"):
      return path.time_grid(steps, rho)
    return np.append(spaced_sigmas(steps, path.sigma_max, path.sigma_min, spacing, rho), 0.0)
  uniform = path.time_grid(steps, t_end) if path.continuous else path.time_grid(steps)
  if spacing in (None, "time") or steps < 2:
    return uniform
  if path.continuous:  # the flow: keep t = 0 and t_end, space the N - 1 points between
    sig = sigma_ve(path, uniform)
    inner = spaced_sigmas(steps - 1, sig[1], sig[-2], spacing, rho)
    return np.concatenate([[uniform[0]], path.time_of_sigma(inner), [uniform[-1]]])
  # DDPM: N levels from t = T to t = 1 by interpolating log sigma_ve(t), then the data t = 0.
  t_T = np.arange(1, path.T + 1)
  log_sig_T = np.log(sigma_ve(path, t_T))
  sig_N = spaced_sigmas(steps, np.exp(log_sig_T[-1]), np.exp(log_sig_T[0]), spacing, rho)
  t_N = np.round(np.interp(np.log(sig_N), log_sig_T, t_T)).astype(np.int64)
  t_N1 = np.append(t_N, 0)
  if np.any(np.diff(t_N1) >= 0):
    raise ValueError(f"steps={steps} with spacing={spacing!r} puts two grid points on one "
                     f"integer time of this T={path.T} DDPM path; use fewer steps")
  return t_N1
