"""Optimizers as optax chains, built by name from a config.

(Foundation stub: Adam with a constant schedule and optional clipping. The full family lives here
once the optimizer issue lands.)
"""

from __future__ import annotations

import optax


def make_optimizer(optim_cfg, total_steps: int):
  """Returns `(tx, schedule)` for `optim_cfg`; `schedule(step) -> lr`."""
  del total_steps
  schedule = optax.constant_schedule(optim_cfg.lr)
  parts = []
  if optim_cfg.get("clip_norm") is not None:
    parts.append(optax.clip_by_global_norm(optim_cfg.clip_norm))
  parts.append(optax.adam(schedule))
  return optax.chain(*parts), schedule
