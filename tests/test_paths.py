"""Tests for jaxdl.generative.paths and closed_forms: schedules, conversions, exact fields (the
DDIM step by hand is the claim ddim_by_hand of `jaxdl reproduce`)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdl.generative import closed_forms, paths


def test_linear_schedule_is_the_cumulative_product_of_linear_betas():
  ab = paths.linear_beta_alpha_bar(1000)
  betas = 1e-4 + (0.02 - 1e-4) * np.arange(1000) / 999
  assert ab.shape == (1001,) and ab[0] == 1.0
  np.testing.assert_allclose(ab[1], 1 - 1e-4, rtol=1e-12)
  np.testing.assert_allclose(ab[1:], np.cumprod(1 - betas), rtol=1e-12)
  # Known value for Ho et al.'s schedule: alpha_bar_T ~ 4.04e-5.
  np.testing.assert_allclose(ab[-1], 4.04e-5, rtol=0.01)


def test_cosine_schedule_matches_the_cosine_formula_where_unclipped():
  T, s = 1000, 0.008
  ab = paths.cosine_alpha_bar(T)
  f = lambda t: math.cos(0.5 * math.pi * (t / T + s) / (1 + s)) ** 2
  for t in (1, 250, 500, 900):
    np.testing.assert_allclose(ab[t], f(t) / f(0), rtol=1e-10)
  assert np.all(np.diff(ab) < 0) and ab[-1] > 0  # clipping at beta = 0.999 keeps it positive


@pytest.mark.parametrize("prediction,path_name", [
    ("eps", "ddpm"), ("x0", "ddpm"), ("v", "ddpm"), ("eps", "flow"), ("x0", "flow"),
    ("velocity", "flow")])
def test_conversions_round_trip(prediction, path_name):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(16, 3)), jnp.float32)
  eps = jnp.asarray(rng.normal(size=(16, 3)), jnp.float32)
  if path_name == "ddpm":
    path = paths.make_path("ddpm", T=1000, schedule="cosine")
    alpha, sigma = (jnp.asarray(a, jnp.float32) for a in path.alpha_sigma(rng.integers(1, 990, 16)))
  else:
    t = jnp.asarray(rng.uniform(0.05, 0.95, 16), jnp.float32)
    alpha, sigma = t, 1 - t
  x_t = paths.add_noise(x, eps, alpha, sigma)
  out = paths.from_x_eps(x, eps, alpha, sigma, prediction)
  x_hat, eps_hat = paths.to_x_eps(out, x_t, alpha, sigma, prediction)
  np.testing.assert_allclose(x_hat, x, atol=2e-4)
  np.testing.assert_allclose(eps_hat, eps, atol=2e-4)


def test_vp_v_target_and_score():
  x, eps, a, s = 0.3, -1.2, 0.6, 0.8
  np.testing.assert_allclose(paths.from_x_eps(jnp.array([x]), jnp.array([eps]), a, s, "v"),
                             [a * eps - s * x], rtol=1e-6)
  np.testing.assert_allclose(paths.score_to_eps(paths.eps_to_score(jnp.array([eps]), s), s), [eps],
                             rtol=1e-6)


def test_flow_velocity_identities():
  """v = x_hat - eps_hat = (x_hat - x_t)/(1 - t) = (x_t - eps_hat)/t and x_hat = x_t + (1 - t) v."""
  rng = np.random.default_rng(1)
  x_hat, eps_hat = (jnp.asarray(rng.normal(size=(8, 2)), jnp.float32) for _ in range(2))
  t = jnp.asarray(rng.uniform(0.1, 0.9, 8), jnp.float32)
  x_t = t[:, None] * x_hat + (1 - t[:, None]) * eps_hat
  v = x_hat - eps_hat
  np.testing.assert_allclose(paths.flow_velocity_from_x0(x_t, x_hat, t), v, atol=1e-5)
  np.testing.assert_allclose(paths.flow_velocity_from_eps(x_t, eps_hat, t), v, atol=1e-5)
  np.testing.assert_allclose(x_t + (1 - t[:, None]) * v, x_hat, atol=1e-5)


def test_two_point_posterior_is_bayes_rule():
  """E[x | x_t = y] from the two Gaussian likelihoods N(y; +-t, (1 - t)^2), written out."""
  y = np.linspace(-2, 2, 9)
  for t in (0.1, 0.5, 0.8):
    lik_p = np.exp(-(y - t) ** 2 / (2 * (1 - t) ** 2))
    lik_m = np.exp(-(y + t) ** 2 / (2 * (1 - t) ** 2))
    expected = (lik_p - lik_m) / (lik_p + lik_m)
    np.testing.assert_allclose(closed_forms.two_point_posterior_mean(y, t), expected, atol=1e-6)
    np.testing.assert_allclose(closed_forms.two_point_posterior_velocity(y, t),
                               (expected - y) / (1 - t), atol=1e-5)


def test_gaussian_flow_solution_solves_the_ode():
  """d/dt of the closed form equals the exact field at the closed form (central difference)."""
  eps = jnp.linspace(-2, 2, 5)
  for t in (0.1, 0.5, 0.9):
    h = 1e-3
    dy = (closed_forms.gaussian_flow_solution(eps, t + h, 1.5, 0.5)
          - closed_forms.gaussian_flow_solution(eps, t - h, 1.5, 0.5)) / (2 * h)
    y = closed_forms.gaussian_flow_solution(eps, t, 1.5, 0.5)
    v = closed_forms.gaussian_flow_velocity(y, t, 1.5, 0.5)
    np.testing.assert_allclose(dy, v, atol=2e-3)


def test_bad_path_settings():
  with pytest.raises(ValueError, match="schedule"):
    paths.make_path("ddpm", schedule="quadratic")
  with pytest.raises(ValueError, match="path"):
    paths.make_path("ve")
  with pytest.raises(ValueError, match="prediction"):
    paths.to_x_eps(jnp.zeros(2), jnp.zeros(2), 1.0, 0.0, "score")
  with pytest.raises(ValueError, match="steps"):
    paths.make_path("ddpm", T=10).time_grid(11)


def test_ddpm_alpha_sigma_under_jit_matches_numpy():
  path = paths.make_path("ddpm", T=100)
  a, s = jax.jit(path.alpha_sigma)(jnp.array([1, 50, 100]))
  np.testing.assert_allclose(a, np.sqrt(path.alpha_bar[[1, 50, 100]]), rtol=1e-6)
  np.testing.assert_allclose(s, np.sqrt(1 - path.alpha_bar[[1, 50, 100]]), rtol=1e-5)
