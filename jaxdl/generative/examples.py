"""The course's worked examples, measured through the public samplers (for `jaxdl reproduce`).

Two-point data x = +-1 (probability 1/2 each), eps ~ N(0, 1), flow path x_t = t x + (1 - t) eps:
the exact field is v*(y, t) = (tanh(t y / (1 - t)^2) - y) / (1 - t)
(`paths.two_point_posterior_velocity`). A DDPM step by hand: alpha_bar_t = 0.36, x_t = 1.0,
eps_hat = 0.5, alpha_bar_prev = 0.64.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.generative import paths, samplers

EPS5 = (-1.3, -0.2, 0.05, 0.5, 2.0)


def _exact_two_point(variables, x, t_B, y=None, train=False):
  del variables, y, train
  return paths.two_point_posterior_velocity(x, t_B[:, None])


def two_point_flow(sampler="euler", steps=1, t_end=1.0, eps=EPS5):
  """Integrates the exact two-point field from `eps` with `make_sampler`; returns the trajectory
  (steps + 1, len(eps)) as numpy, noise first."""
  sample = samplers.make_sampler(_exact_two_point, paths.FlowPath(), sampler=sampler, steps=steps,
                                 sample_shape=(1,), t_end=t_end, return_trajectory=True)
  x_init = jnp.asarray(eps, jnp.float32)[:, None]
  _, traj = sample(None, jax.random.PRNGKey(0), len(eps), x_init=x_init)
  return np.asarray(traj[:, :, 0])


def ddim_by_hand(alpha_bar_t=0.36, x_t=1.0, eps_hat=0.5, alpha_bar_prev=0.64) -> dict:
  """x_hat = (x_t - sqrt(1 - ab) eps)/sqrt(ab), score = -eps/sqrt(1 - ab),
  x_prev = sqrt(ab_prev) x_hat + sqrt(1 - ab_prev) eps (DDIM, eta = 0)."""
  a_t, s_t = math.sqrt(alpha_bar_t), math.sqrt(1 - alpha_bar_t)
  a_p, s_p = math.sqrt(alpha_bar_prev), math.sqrt(1 - alpha_bar_prev)
  x, e = jnp.array([x_t]), jnp.array([eps_hat])
  x_hat = paths.eps_to_x0(x, e, a_t, s_t)
  return {"x_hat": float(x_hat[0]), "score": float(paths.eps_to_score(e, s_t)[0]),
          "x_prev": float(samplers.ddim_update(x_hat, e, a_t, s_t, a_p, s_p, eta=0.0)[0])}


def all_examples() -> dict:
  """Every worked-example number with the course's expected value."""
  one = two_point_flow("euler", 1)[-1]
  two = two_point_flow("euler", 2, eps=(0.5,))[:, 0]
  ode = two_point_flow("heun", 400, t_end=0.999)[-1]
  return {
      "one_euler_step": {"measured": one.tolist(), "expected": [0.0] * 5, "tol": 1e-6},
      "two_euler_steps": {"measured": two[1:].tolist(), "expected": [0.25, 0.462], "tol": 5e-4},
      "exact_ode_to_0.999": {"measured": ode.tolist(), "expected": [-1, -1, 1, 1, 1],
                             "tol": 3e-3},
      "ddim_by_hand": {"measured": ddim_by_hand(),
                       "expected": {"x_hat": 1.0, "score": -0.625, "x_prev": 1.1}, "tol": 1e-6},
  }
