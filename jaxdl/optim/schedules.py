"""Learning-rate schedules `step -> lr`, built from optax pieces.

Notation: t the update index (0 for the first update), T the total number of updates
(`train.steps`), eta0 the peak lr (`optim.lr`), W warmup steps, D decay steps, f the final
fraction (`optim.schedule.final_frac`).

- constant:      eta0
- step:          eta0 * gamma^floor(t / s), s = step_every_frac * T
- cosine:        eta0 / 2 * (1 + cos(pi t / T))
- warmup_cosine: eta0 * t / W for t < W, then cosine from eta0 down to f * eta0 at t = T
- wsd:           warmup to eta0 over W steps, stable at eta0, then decay over the last
                 D = decay_frac * T steps to f * eta0, with u = (t - (T - D)) / D in [0, 1]:
                   linear  eta0 - (eta0 - f eta0) u
                   cosine  f eta0 + (eta0 - f eta0) (1 + cos(pi u)) / 2
                   1-sqrt  f eta0 + (eta0 - f eta0) (1 - sqrt(u))

Warmup is linear from 0 (optax's convention: lr 0 at t = 0, eta0 at t = W). Any schedule may
have a warmup (W > 0); the main schedule then starts at t = W and runs over T - W steps.

Run extension: a WSD schedule is the same function of t for every t before the decay starts,
whatever T is (as long as W is given in steps), so a run restored in its stable phase can be
continued with a larger T and replays exactly; a cosine schedule depends on T at every t > 0.
`extension_check` measures this instead of assuming it.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

SCHEDULES = ("constant", "step", "cosine", "warmup_cosine", "wsd")
DECAY_SHAPES = ("linear", "cosine", "1-sqrt")


def resolve_warmup(sched_cfg, total_steps: int) -> int:
  """Warmup steps W: `warmup_steps` when given, else round(warmup_frac * T)."""
  w = sched_cfg.get("warmup_steps")
  if w is None:
    w = int(round(float(sched_cfg.get("warmup_frac", 0.0) or 0.0) * total_steps))
  return int(w)


def validate_schedule(sched_cfg, total_steps: int) -> None:
  """Raises ValueError naming the offending `optim.schedule.*` key."""
  name = sched_cfg.name
  if name not in SCHEDULES:
    raise ValueError(f"optim.schedule.name: unknown schedule {name!r}; "
                     f"expected one of {list(SCHEDULES)}")
  if total_steps <= 0:
    raise ValueError(f"train.steps: must be positive, got {total_steps}")
  w_steps, w_frac = sched_cfg.get("warmup_steps"), sched_cfg.get("warmup_frac", 0.0)
  if w_steps is not None and w_steps < 0:
    raise ValueError(f"optim.schedule.warmup_steps: must be >= 0, got {w_steps}")
  if w_steps is None and not 0.0 <= (w_frac or 0.0) <= 1.0:
    raise ValueError(f"optim.schedule.warmup_frac: must be in [0, 1], got {w_frac}")
  w = resolve_warmup(sched_cfg, total_steps)
  if w > 0 and w >= total_steps:
    key = "warmup_steps" if w_steps is not None else "warmup_frac"
    raise ValueError(f"optim.schedule.{key}: warmup of {w} steps is not shorter than the run "
                     f"({total_steps} steps)")
  final = sched_cfg.get("final_frac", 0.1)
  if not 0.0 <= final <= 1.0:
    raise ValueError(f"optim.schedule.final_frac: must be in [0, 1], got {final}")
  if name == "wsd":
    df = sched_cfg.get("decay_frac", 0.2)
    if not 0.0 < df <= 1.0:
      raise ValueError(f"optim.schedule.decay_frac: must be in (0, 1], got {df}")
    shape = sched_cfg.get("decay_shape", "linear")
    if shape not in DECAY_SHAPES:
      raise ValueError(f"optim.schedule.decay_shape: unknown shape {shape!r}; "
                       f"expected one of {list(DECAY_SHAPES)}")
    d = _decay_steps(df, total_steps)
    if w + d > total_steps:
      raise ValueError(f"optim.schedule.decay_frac: warmup ({w}) + decay ({d}) steps exceed "
                       f"the run ({total_steps} steps)")
  if name == "step":
    every, gamma = sched_cfg.get("step_every_frac", 0.3), sched_cfg.get("gamma", 0.5)
    if not 0.0 < every <= 1.0:
      raise ValueError(f"optim.schedule.step_every_frac: must be in (0, 1], got {every}")
    if not 0.0 < gamma <= 1.0:
      raise ValueError(f"optim.schedule.gamma: must be in (0, 1], got {gamma}")


def _decay_steps(decay_frac: float, total_steps: int) -> int:
  return max(1, int(round(decay_frac * total_steps)))


def step_decay(peak: float, every: int, gamma: float) -> optax.Schedule:
  """eta0 * gamma^floor(t / every)."""
  return optax.exponential_decay(peak, transition_steps=max(1, every), decay_rate=gamma,
                                 staircase=True)


def decay_to(peak: float, end: float, steps: int, shape: str) -> optax.Schedule:
  """Decay from `peak` at t = 0 to `end` at t = steps (then flat), with the given shape."""
  if shape == "linear":
    return optax.linear_schedule(peak, end, steps)
  if shape == "cosine":
    return optax.cosine_decay_schedule(peak, steps, alpha=end / peak if peak else 0.0)

  def one_minus_sqrt(t):
    # optax has no 1-sqrt shape; this is the one hand-written piece.
    u = jnp.clip(jnp.asarray(t, jnp.float32) / steps, 0.0, 1.0)
    return end + (peak - end) * (1.0 - jnp.sqrt(u))

  return one_minus_sqrt


def wsd(peak: float, total_steps: int, warmup_steps: int, decay_steps: int,
        final_frac: float = 0.0, shape: str = "linear") -> optax.Schedule:
  """Warmup-stable-decay: join of linear warmup, constant and `decay_to` pieces."""
  stable_end = total_steps - decay_steps
  pieces = [optax.constant_schedule(peak), decay_to(peak, final_frac * peak, decay_steps, shape)]
  bounds = [stable_end]
  if warmup_steps > 0:
    pieces.insert(0, optax.linear_schedule(0.0, peak, warmup_steps))
    bounds.insert(0, warmup_steps)
  return optax.join_schedules(pieces, bounds)


def make_schedule(optim_cfg, total_steps: int) -> optax.Schedule:
  """The `step -> lr` schedule named by `optim_cfg.schedule.name` (validated first)."""
  sc = optim_cfg.schedule
  validate_schedule(sc, total_steps)
  peak = float(optim_cfg.lr)
  w = resolve_warmup(sc, total_steps)
  final = float(sc.get("final_frac", 0.1))
  if sc.name == "wsd":
    return wsd(peak, total_steps, w, _decay_steps(sc.get("decay_frac", 0.2), total_steps),
               final, sc.get("decay_shape", "linear"))
  if sc.name == "warmup_cosine":
    return optax.warmup_cosine_decay_schedule(0.0, peak, w, total_steps, end_value=final * peak)
  rest = total_steps - w
  if sc.name == "constant":
    main = optax.constant_schedule(peak)
  elif sc.name == "cosine":
    main = optax.cosine_decay_schedule(peak, max(1, rest), alpha=0.0)
  else:  # step
    every = int(round(sc.get("step_every_frac", 0.3) * total_steps))
    main = step_decay(peak, every, sc.get("gamma", 0.5))
  if w == 0:
    return main
  return optax.join_schedules([optax.linear_schedule(0.0, peak, w), main], [w])


def _schedule_of(cfg) -> optax.Schedule:
  """The schedule of a whole experiment config (ConfigDict, or the plain dict saved with a run).
  Missing optim keys take `default_optim_config()`'s values, as in `make_optimizer`."""
  from jaxdl.optim import default_optim_config  # the package imports this module first
  if not isinstance(cfg, ml_collections.ConfigDict):
    cfg = ml_collections.ConfigDict(cfg)
  optim = default_optim_config()
  optim.update(cfg.optim.to_dict())
  return make_schedule(optim, int(cfg.train.steps))


def first_changed_step(old_cfg, new_cfg, restored_step: int) -> int | None:
  """First t < restored_step whose lr differs between the two configs' schedules, or None.

  Both configs are whole experiment configs (`optim` and `train.steps`).
  """
  if restored_step <= 0:
    return None
  old, new = _schedule_of(old_cfg), _schedule_of(new_cfg)
  t = jnp.arange(restored_step)
  diff = np.asarray(old(t)) != np.asarray(new(t))
  return int(np.argmax(diff)) if diff.any() else None


def extension_problem(old_cfg, new_cfg, restored_step: int) -> str | None:
  """None when the new config replays every lr already taken; else a one-line reason (for the
  CLI's error) naming the first changed step and its two lrs."""
  t = first_changed_step(old_cfg, new_cfg, restored_step)
  if t is None:
    return None
  lr_old, lr_new = float(_schedule_of(old_cfg)(t)), float(_schedule_of(new_cfg)(t))
  name = dict(dict(old_cfg["optim"]).get("schedule") or {}).get("name", "warmup_cosine")
  why = {"wsd": "the checkpoint is past the start of the old decay, or the warmup or decay moved "
                "(give schedule.warmup_steps in steps)",
         }.get(name, f"a {name} schedule depends on train.steps at every step")
  return (f"train.steps: the new schedule changes the lr of steps already taken (first at step "
          f"{t}: {lr_old:.6g} -> {lr_new:.6g}); {why}; only a wsd schedule restored in its stable "
          f"phase can be extended exactly")


def extension_check(old_cfg, new_cfg, restored_step: int) -> bool:
  """True when switching `old_cfg` -> `new_cfg` keeps the lr of every step already taken.

  `restored_step` is the number of updates taken (the checkpoint's step). Exact comparison of the
  two schedules on t = 0 .. restored_step - 1: True for a WSD run restored in its stable phase
  and extended, False for cosine (every lr after t = 0 depends on T).
  """
  return first_changed_step(old_cfg, new_cfg, restored_step) is None


def linear_scaled_lr(base_lr: float, base_batch: int, batch: int) -> float:
  """Linear scaling rule (SGD): eta * k for batch * k."""
  return base_lr * batch / base_batch


def sqrt_scaled_lr(base_lr: float, base_batch: int, batch: int) -> float:
  """Square-root scaling rule (Adam): eta * sqrt(k) for batch * k."""
  return base_lr * math.sqrt(batch / base_batch)
