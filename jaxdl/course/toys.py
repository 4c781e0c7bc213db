"""Small measurements of optimizer behaviour through the public `make_optimizer` API.

Used by the optimizer experiments and by `jaxdl reproduce`. Each function takes an `optim`
ConfigDict (any rule, any schedule) and returns plain numbers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdl.optim import make_optimizer


def quadratic_loss(theta, coeffs=(1 / 20, 1.0)):
  """L(theta) = sum_i a_i theta_i^2 (default theta1^2 / 20 + theta2^2)."""
  return jnp.sum(jnp.asarray(coeffs, jnp.float32) * jnp.square(theta))


def run_toy_quadratic(optim_cfg, theta0=(-8.5, 1.8), steps: int = 16,
                      coeffs=(1 / 20, 1.0)) -> np.ndarray:
  """Trajectory of `optim_cfg` on `quadratic_loss`: array (steps + 1, 2), row 0 is theta0."""
  tx, _ = make_optimizer(optim_cfg, steps)
  theta = jnp.asarray(theta0, jnp.float32)
  grad_fn = jax.grad(lambda th: quadratic_loss(th, coeffs))

  def step(carry, _):
    th, st = carry
    updates, st = tx.update(grad_fn(th), st, th)
    th = optax.apply_updates(th, updates)
    return (th, st), th

  _, path = jax.lax.scan(step, (theta, tx.init(theta)), None, length=steps)
  return np.concatenate([np.asarray(theta)[None], np.asarray(path)], axis=0)


def noisy_quiet_weights(optim_cfg, n: int = 1000, steps: int = 1000,
                        rms=(10.0, 0.01), seed: int = 0) -> dict:
  """Two groups of `n` weights from 1 whose gradients are pure Gaussian noise of RMS
  `rms[0]` ('noisy') and `rms[1]` ('quiet'); the loss itself is flat, so weight decay is the
  only pull towards 0. Returns the group means after `steps` updates and their history.

  The optimizer sees the parameters as {'noisy': (n,), 'quiet': (n,)}; its decay mask must
  select them (e.g. `decay_mask=['.*']`).
  """
  tx, _ = make_optimizer(optim_cfg, steps)
  params = {"noisy": jnp.ones((n,), jnp.float32), "quiet": jnp.ones((n,), jnp.float32)}
  key = jax.random.PRNGKey(seed)

  def step(carry, t):
    p, st = carry
    kn, kq = jax.random.split(jax.random.fold_in(key, t))
    grads = {"noisy": rms[0] * jax.random.normal(kn, (n,)),
             "quiet": rms[1] * jax.random.normal(kq, (n,))}
    updates, st = tx.update(grads, st, p)
    p = optax.apply_updates(p, updates)
    return (p, st), jnp.stack([p["noisy"].mean(), p["quiet"].mean()])

  (p, _), hist = jax.lax.scan(step, (params, tx.init(params)), jnp.arange(steps))
  return {"noisy": float(p["noisy"].mean()), "quiet": float(p["quiet"].mean()),
          "history": np.asarray(hist)}
