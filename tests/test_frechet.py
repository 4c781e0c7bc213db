"""Frechet distance (metrics.frechet_gaussian / frechet_distance) against closed forms.

For Gaussians the distance is W2^2 = |mu_x - mu_y|^2 + tr(S_x + S_y - 2 (S_x^1/2 S_y S_x^1/2)^1/2).
Closed forms used: with S_x = a I the cross term is sqrt(a) sum_i sqrt(lambda_i(S_y)) for any S_y;
with diagonal covariances the distance is |dmu|^2 + sum_i (sqrt(a_i) - sqrt(b_i))^2.
"""

import numpy as np
import pytest

from jaxdl.generative import metrics


def _random_cov(rng, d):
  a = rng.normal(size=(d, d))
  return a @ a.T / d + 0.1 * np.eye(d)


def test_frechet_gaussian_matches_closed_forms():
  rng = np.random.default_rng(0)
  mu_x, mu_y = rng.normal(size=4), rng.normal(size=4)
  cov_y = _random_cov(rng, 4)  # not diagonal: the isotropic case's cross term is still closed
  lam = np.linalg.eigvalsh(cov_y)
  expected = (np.sum((mu_x - mu_y) ** 2) + 4 * 2.0 + lam.sum()
              - 2 * np.sqrt(2.0) * np.sqrt(lam).sum())
  np.testing.assert_allclose(metrics.frechet_gaussian(mu_x, 2.0 * np.eye(4), mu_y, cov_y),
                             expected, rtol=1e-10)
  a, b = rng.uniform(0.1, 2, 4), rng.uniform(0.1, 2, 4)
  np.testing.assert_allclose(metrics.frechet_gaussian(mu_x, np.diag(a), mu_y, np.diag(b)),
                             np.sum((mu_x - mu_y) ** 2) + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2),
                             rtol=1e-10)
  cov_x = _random_cov(rng, 4)  # general case: symmetric in its arguments, zero on itself
  np.testing.assert_allclose(metrics.frechet_gaussian(mu_x, cov_x, mu_y, cov_y),
                             metrics.frechet_gaussian(mu_y, cov_y, mu_x, cov_x), rtol=1e-8)
  assert abs(metrics.frechet_gaussian(mu_x, cov_x, mu_x, cov_x)) < 1e-8


def test_frechet_distance_of_samples_converges_to_the_gaussians_distance():
  rng = np.random.default_rng(1)
  mu_x, mu_y = np.zeros(3), np.array([1.0, -0.5, 0.25])
  cov_x, cov_y = _random_cov(rng, 3), _random_cov(rng, 3)
  x = rng.multivariate_normal(mu_x, cov_x, 50_000)
  y = rng.multivariate_normal(mu_y, cov_y, 50_000)
  exact = metrics.frechet_gaussian(mu_x, cov_x, mu_y, cov_y)
  # Sampling error of the fitted moments at n = 5e4: ~1e-2 relative here.
  np.testing.assert_allclose(metrics.frechet_distance(x, y), exact, rtol=0.03)
  with pytest.raises(ValueError, match="feature dims differ"):
    metrics.frechet_distance(x, y[:, :2])
