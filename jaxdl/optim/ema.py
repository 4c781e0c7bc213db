"""An exponential moving average of the parameters, kept in the optimizer state.

  ema_0 = theta_0,    ema_k = d ema_{k-1} + (1 - d) theta_k,    theta_k = theta_{k-1} + u_k

with d = `optim.ema_decay` and u_k the chain's final update. Diffusion and flow models sample from
the average (Ho et al., 2020; Karras et al., 2022): the last iterate carries the noise of the last
few hundred minibatches, the average of roughly 1 / (1 - d) iterates does not.

Kept as the last link of the optax chain, so the average is checkpointed, restored, sharded and
replicated exactly like the rest of the optimizer state, with no field added to the train state;
updates pass through unchanged, so training is identical with or without it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class EmaParamsState(NamedTuple):
  """The running average; `ema` has the structure and dtypes of the parameters."""

  ema: Any


def ema_params(decay: float) -> optax.GradientTransformation:
  """Tracks ema <- d ema + (1 - d)(params + updates); must be the chain's last transformation."""
  if not 0.0 <= decay < 1.0:
    raise ValueError(f"optim.ema_decay: must be in [0, 1), got {decay}")

  def init_fn(params):
    return EmaParamsState(ema=jax.tree.map(jnp.asarray, params))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("ema_params needs the parameters: call tx.update(updates, state, params)")
    ema = jax.tree.map(
        lambda e, p, u: (decay * e + (1.0 - decay) * (p + u).astype(e.dtype)).astype(e.dtype),
        state.ema, params, updates)
    return updates, EmaParamsState(ema=ema)

  return optax.GradientTransformation(init_fn, update_fn)


def find_ema(opt_state):
  """The averaged parameters inside an optimizer state, or None when the run kept none.

  Works on a live state (an `EmaParamsState` in the chain's tuple) and on one restored from a
  checkpoint without a target (named tuples come back as dicts keyed by field name).
  """
  if isinstance(opt_state, EmaParamsState):
    return opt_state.ema
  if isinstance(opt_state, dict):
    if set(opt_state) == {"ema"}:
      return opt_state["ema"]
    children = opt_state.values()
  elif isinstance(opt_state, (list, tuple)):
    children = opt_state
  else:
    return None
  for child in children:
    found = find_ema(child)
    if found is not None:
      return found
  return None
