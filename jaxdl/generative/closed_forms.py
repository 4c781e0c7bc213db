"""Exact denoisers and flow fields where the data distribution is known: the closed forms the
samplers, losses and likelihoods are tested against (and the course's claims measure with).

Shapes: y, x_t points on the path; t the flow time (x_t = t x + (1 - t) eps); alpha, sigma a
Gaussian path's coefficients (x_t = alpha x + sigma eps); data N(mu, s^2) per coordinate, or
the two points x = +-1 with probability 1/2 each.
"""

from __future__ import annotations

import jax.numpy as jnp



def two_point_posterior_mean(y, t):
  """E[x | x_t = y] for data x = +-1 (prob 1/2 each) on the flow path: tanh(t y / (1 - t)^2).

  Given x, x_t ~ N(t x, (1 - t)^2); Bayes' rule gives the odds exp(2 t y / (1 - t)^2).
  """
  return jnp.tanh(t * y / (1.0 - t) ** 2)


def two_point_posterior_velocity(y, t):
  """The exact flow field v*(y, t) = E[x - eps | x_t = y] = (x_hat(y, t) - y) / (1 - t)."""
  return (two_point_posterior_mean(y, t) - y) / (1.0 - t)


def gaussian_flow_velocity(y, t, mu, s):
  """Exact flow field for data N(mu, s^2) per coordinate and eps ~ N(0, 1).

  x_t ~ N(t mu, var_t) with var_t = t^2 s^2 + (1 - t)^2, and
  x_hat = mu + t s^2 (y - t mu)/var_t, eps_hat = (1 - t)(y - t mu)/var_t, v = x_hat - eps_hat.
  """
  var = t**2 * s**2 + (1.0 - t) ** 2
  r = (y - t * mu) / var
  return mu + (t * s**2 - (1.0 - t)) * r


def gaussian_flow_solution(eps, t, mu, s):
  """The ODE dy/dt = gaussian_flow_velocity from y(0) = eps: y(t) = t mu + sqrt(var_t) eps."""
  return t * mu + jnp.sqrt(t**2 * s**2 + (1.0 - t) ** 2) * eps


def gaussian_eps_posterior(x_t, alpha, sigma, mu, s):
  """E[eps | x_t] for data N(mu, s^2) on any Gaussian path:
  sigma (x_t - alpha mu) / (alpha^2 s^2 + sigma^2)."""
  return sigma * (x_t - alpha * mu) / (alpha**2 * s**2 + sigma**2)
