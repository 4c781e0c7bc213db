"""Run extension: does a new config replay every learning rate a restored run already took?

Each side is a whole experiment config (`optim` and `train.steps`; a ConfigDict, or the plain
dict saved with a run), or a run's already parsed `(OptimConfig, train.steps)` pair, which is not
parsed again (`jaxdl.train.resume` passes `(Run.optim, Run.train.steps)`). Each schedule is
parsed (when given as a config) and built once, then compared exactly on
t = 0 .. restored_step - 1. A WSD schedule with W given in steps is the same function of t
before its decay starts, whatever T is, so a run restored in its stable phase extends exactly;
a cosine schedule depends on T at every t > 0 and is refused. The configs are parsed with
`strict=False`: the old one is the record of a run already made, and the new one is parsed
strictly when its optimizer is built.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdl.optim.configs import OptimConfig, parse_optim
from jaxdl.schema import plain


def _schedule_of(cfg) -> tuple[str, optax.Schedule]:
  """(schedule name, `step -> lr`) of a whole experiment config or an `(OptimConfig, T)` pair."""
  if isinstance(cfg, tuple) and isinstance(cfg[0], OptimConfig):
    optim, steps = cfg
  else:
    cfg = plain(cfg)
    optim, steps = parse_optim(cfg["optim"], strict=False), cfg["train"]["steps"]
  return optim.schedule.name, optim.schedule_fn(int(steps))


def _first_diff(old: optax.Schedule, new: optax.Schedule, restored_step: int) -> int | None:
  if restored_step <= 0:
    return None
  t = jnp.arange(restored_step)
  # One compiled program for both schedules: evaluated op by op, a schedule compiled each of its
  # dozen operations on its own (about 30 ms of CPU apiece) at every resume.
  diff = np.asarray(jax.jit(lambda t: old(t) != new(t))(t))
  return int(np.argmax(diff)) if diff.any() else None


def first_changed_step(old_cfg, new_cfg, restored_step: int) -> int | None:
  """First t < restored_step whose lr differs between the two configs' schedules, or None."""
  return _first_diff(_schedule_of(old_cfg)[1], _schedule_of(new_cfg)[1], restored_step)


def extension_problem(old_cfg, new_cfg, restored_step: int) -> str | None:
  """None when the new config replays every lr already taken; else a one-line reason (for the
  CLI's error) naming the first changed step and its two lrs."""
  (name, old), (_, new) = _schedule_of(old_cfg), _schedule_of(new_cfg)
  t = _first_diff(old, new, restored_step)
  if t is None:
    return None
  why = {"wsd": "the checkpoint is past the start of the old decay, or the warmup or decay moved "
                "(give schedule.warmup_steps in steps)",
         }.get(name, f"a {name} schedule depends on train.steps at every step")
  return (f"train.steps: the new schedule changes the lr of steps already taken (first at step "
          f"{t}: {float(old(t)):.6g} -> {float(new(t)):.6g}); {why}; only a wsd schedule "
          f"restored in its stable phase can be extended exactly")


def extension_check(old_cfg, new_cfg, restored_step: int) -> bool:
  """True when switching `old_cfg` -> `new_cfg` keeps the lr of every step already taken.

  `restored_step` is the number of updates taken (the checkpoint's step): True for a WSD run
  restored in its stable phase and extended, False for cosine (every lr after t = 0 depends on T).
  """
  return first_changed_step(old_cfg, new_cfg, restored_step) is None
