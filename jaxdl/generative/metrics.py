"""Sample-quality distances between two point clouds.

- Energy distance (Szekely & Rizzo), the V-statistic
    ED(X, Y) = 2 mean_ij |x_i - y_j| - mean_ij |x_i - x_j| - mean_ij |y_i - y_j|  >= 0,
  zero only for equal empirical measures. Two independent draws of n points from one distribution
  still give E[ED] ~ (1/n + 1/m) E|X - X'|: that is the floor a perfect model cannot beat, so a
  result is always printed beside `energy_distance` of two fresh target draws.
- Exact W2 for equal-size samples: sqrt(min_perm mean_i |x_i - y_perm(i)|^2), by the Hungarian
  algorithm (scipy.optimize.linear_sum_assignment), O(n^3).
- Frechet distance (the W2^2 between Gaussians fitted to two feature clouds; FID when the
  features are an Inception net's, here a trained digits classifier's penultimate layer):
    FD = |mu_x - mu_y|^2 + tr(S_x + S_y - 2 (S_x^{1/2} S_y S_x^{1/2})^{1/2}).
  The trace of the square root is sum_i sqrt(lambda_i) over the eigenvalues of the symmetric PSD
  matrix S_x^{1/2} S_y S_x^{1/2} (eigh, float64), which avoids sqrtm's complex round-off. Two
  finite draws of one distribution still give FD > 0 (estimation bias ~ tr S / n): print it
  beside the two-draw floor, as for the energy distance.

Shapes: N, M points, D features (images are flattened).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


@jax.jit
def _sum_distances(a_nxD, b_MxD):
  d_nxM = jnp.sum((a_nxD[:, None, :] - b_MxD[None, :, :]) ** 2, axis=-1)
  return jnp.sum(jnp.sqrt(jnp.maximum(d_nxM, 0.0)))


def _mean_pairwise_distance(a_NxD, b_MxD, block: int = 1024):
  """mean_ij |a_i - b_j|, in blocks of rows to bound memory."""
  total = 0.0
  for s in range(0, a_NxD.shape[0], block):
    total += float(_sum_distances(a_NxD[s:s + block], b_MxD))
  return total / (a_NxD.shape[0] * b_MxD.shape[0])


def energy_distance(x_NxD, y_MxD) -> float:
  """V-statistic energy distance 2 E|X - Y| - E|X - X'| - E|Y - Y'| between two samples."""
  x_NxD = jnp.asarray(x_NxD, jnp.float32).reshape(len(x_NxD), -1)
  y_MxD = jnp.asarray(y_MxD, jnp.float32).reshape(len(y_MxD), -1)
  if x_NxD.shape[1] != y_MxD.shape[1]:
    raise ValueError(f"energy_distance: feature dims differ, {x_NxD.shape[1]} vs {y_MxD.shape[1]}")
  xy = _mean_pairwise_distance(x_NxD, y_MxD)
  xx = _mean_pairwise_distance(x_NxD, x_NxD)
  yy = _mean_pairwise_distance(y_MxD, y_MxD)
  return 2.0 * xy - xx - yy


def wasserstein2(x_NxD, y_NxD) -> float:
  """Exact W2 between two equal-size empirical measures via an optimal assignment (needs scipy)."""
  try:
    from scipy.optimize import linear_sum_assignment
  except ImportError as e:  # pragma: no cover - scipy ships with scikit-learn
    raise ImportError("wasserstein2 needs scipy (pip install scipy)") from e
  x = np.asarray(x_NxD, np.float64).reshape(len(x_NxD), -1)
  y = np.asarray(y_NxD, np.float64).reshape(len(y_NxD), -1)
  if x.shape != y.shape:
    raise ValueError(f"wasserstein2 needs equal-size samples; got {x.shape} and {y.shape}")
  cost_NxN = np.sum((x[:, None, :] - y[None, :, :]) ** 2, axis=-1)
  rows, cols = linear_sum_assignment(cost_NxN)
  return float(np.sqrt(cost_NxN[rows, cols].mean()))


def _psd_sqrt(cov_DxD):
  """Symmetric square root of a PSD matrix (eigenvalues clipped at 0 against round-off)."""
  lam_D, q_DxD = np.linalg.eigh(cov_DxD)
  return (q_DxD * np.sqrt(np.clip(lam_D, 0.0, None))) @ q_DxD.T


def frechet_gaussian(mu_x_D, cov_x_DxD, mu_y_D, cov_y_DxD) -> float:
  """W2^2 between N(mu_x, S_x) and N(mu_y, S_y):
  |mu_x - mu_y|^2 + tr(S_x + S_y - 2 (S_x^1/2 S_y S_x^1/2)^1/2)."""
  mu_x, mu_y = np.asarray(mu_x_D, np.float64), np.asarray(mu_y_D, np.float64)
  cov_x, cov_y = np.asarray(cov_x_DxD, np.float64), np.asarray(cov_y_DxD, np.float64)
  root_x = _psd_sqrt(cov_x)
  cross_DxD = root_x @ cov_y @ root_x
  lam_D = np.linalg.eigvalsh((cross_DxD + cross_DxD.T) / 2)
  trace_root = float(np.sum(np.sqrt(np.clip(lam_D, 0.0, None))))
  return float(np.sum((mu_x - mu_y) ** 2) + np.trace(cov_x) + np.trace(cov_y) - 2 * trace_root)


def frechet_distance(x_NxD, y_MxD) -> float:
  """Frechet distance between Gaussians fitted (mean, unbiased covariance) to two samples."""
  x = np.asarray(x_NxD, np.float64).reshape(len(x_NxD), -1)
  y = np.asarray(y_MxD, np.float64).reshape(len(y_MxD), -1)
  if x.shape[1] != y.shape[1]:
    raise ValueError(f"frechet_distance: feature dims differ, {x.shape[1]} vs {y.shape[1]}")
  if min(len(x), len(y)) < 2:
    raise ValueError(f"frechet_distance: needs >= 2 points per sample, got {len(x)} and {len(y)}")
  return frechet_gaussian(x.mean(0), np.cov(x, rowvar=False), y.mean(0), np.cov(y, rowvar=False))
