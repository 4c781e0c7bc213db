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

Each schedule is a frozen dataclass registered in `SCHEDULES` by `@register_schedule(name)`:
its fields are its `optim.schedule.*` keys with their defaults (written only here; every schedule
has `warmup_steps` and `warmup_frac`), checked on construction; `build(peak, total_steps)` checks
what depends on T and returns the `step -> lr` function. The peak eta0 is `optim.lr`, a key of
the optimizer section (scaling rules and the lr range test change it without touching the
schedule). Adding a schedule is one such class plus its test against its formula.

Run extension (`jaxdl.optim.extension`): a WSD schedule is the same function of t for every t
before the decay starts, whatever T is (as long as W is given in steps), so a run restored in its
stable phase can be continued with a larger T and replays exactly; a cosine schedule depends on
T at every t > 0.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax.numpy as jnp
import optax

from jaxdl.schema import (FRACTION, NONNEG, OPEN_FRACTION, Settings, one_of, registrar,
                                setting)

DECAY_SHAPES = ("linear", "cosine", "1-sqrt")


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


def with_warmup(peak: float, warmup: int, main: optax.Schedule) -> optax.Schedule:
  """Linear warmup 0 -> eta0 over W steps, then `main` (restarted at t = W)."""
  if warmup == 0:
    return main
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), main], [warmup])


SCHEDULES: dict[str, type] = {}
register_schedule = registrar(SCHEDULES, "schedule")


@dataclasses.dataclass(frozen=True)
class Schedule(Settings):
  """A learning-rate schedule; every schedule has a linear warmup of W steps (maybe 0)."""

  prefix: ClassVar[str] = "optim.schedule."
  kind: ClassVar[str] = "schedule"
  none_is_default: ClassVar[bool] = True
  # W in steps; wins over warmup_frac. Give it for runs that may be extended: a fraction moves
  # with train.steps.
  warmup_steps: int | None = setting(None, NONNEG)
  warmup_frac: float = setting(0.05, FRACTION)  # W = round(warmup_frac * T)

  def warmup(self, total_steps: int) -> int:
    """W: `warmup_steps` when given, else round(warmup_frac * T)."""
    if self.warmup_steps is not None:
      return int(self.warmup_steps)
    return int(round(self.warmup_frac * total_steps))

  def check_steps(self, total_steps: int) -> None:
    """Checks what depends on T (the warmup must be shorter than the run)."""
    if total_steps <= 0:
      raise ValueError(f"train.steps: must be positive, got {total_steps}")
    w = self.warmup(total_steps)
    if w > 0 and w >= total_steps:
      key = "warmup_steps" if self.warmup_steps is not None else "warmup_frac"
      self.fail(key, f"warmup of {w} steps is not shorter than the run ({total_steps} steps)")

  def build(self, peak: float, total_steps: int) -> optax.Schedule:
    """The `step -> lr` function for peak eta0 = `peak` over T = `total_steps` updates."""
    total_steps = int(total_steps)
    self.check_steps(total_steps)
    return self.make(float(peak), total_steps, self.warmup(total_steps))

  def make(self, peak: float, total_steps: int, warmup: int) -> optax.Schedule:
    """The schedule, once T and W are known and checked."""
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class _ToFinal(Schedule):
  final_frac: float = setting(0.1, FRACTION)  # f: final lr / peak


@register_schedule("constant")
@dataclasses.dataclass(frozen=True)
class Constant(Schedule):

  def make(self, peak, total_steps, warmup):
    return with_warmup(peak, warmup, optax.constant_schedule(peak))


@register_schedule("step")
@dataclasses.dataclass(frozen=True)
class Step(Schedule):
  step_every_frac: float = setting(0.3, OPEN_FRACTION)  # s = step_every_frac * T
  gamma: float = setting(0.5, OPEN_FRACTION)

  def make(self, peak, total_steps, warmup):
    every = int(round(self.step_every_frac * total_steps))
    return with_warmup(peak, warmup, step_decay(peak, every, self.gamma))


@register_schedule("cosine")
@dataclasses.dataclass(frozen=True)
class Cosine(Schedule):

  def make(self, peak, total_steps, warmup):
    main = optax.cosine_decay_schedule(peak, max(1, total_steps - warmup), alpha=0.0)
    return with_warmup(peak, warmup, main)


@register_schedule("warmup_cosine")
@dataclasses.dataclass(frozen=True)
class WarmupCosine(_ToFinal):

  def make(self, peak, total_steps, warmup):
    return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, total_steps,
                                              end_value=self.final_frac * peak)


@register_schedule("wsd")
@dataclasses.dataclass(frozen=True)
class Wsd(_ToFinal):
  decay_frac: float = setting(0.2, OPEN_FRACTION)  # D = round(decay_frac * T), at least 1
  decay_shape: str = setting("linear", one_of(*DECAY_SHAPES))

  def decay_steps(self, total_steps: int) -> int:
    return max(1, int(round(self.decay_frac * total_steps)))

  def check_steps(self, total_steps):
    super().check_steps(total_steps)
    w, d = self.warmup(total_steps), self.decay_steps(total_steps)
    if w + d > total_steps:
      self.fail("decay_frac", f"warmup ({w}) + decay ({d}) steps exceed the run "
                              f"({total_steps} steps)")

  def make(self, peak, total_steps, warmup):
    return wsd(peak, total_steps, warmup, self.decay_steps(total_steps), self.final_frac,
               self.decay_shape)


def linear_scaled_lr(base_lr: float, base_batch: int, batch: int) -> float:
  """Linear scaling rule (SGD): eta * k for batch * k."""
  return base_lr * batch / base_batch


def sqrt_scaled_lr(base_lr: float, base_batch: int, batch: int) -> float:
  """Square-root scaling rule (Adam): eta * sqrt(k) for batch * k."""
  return base_lr * math.sqrt(batch / base_batch)


__all__ = ["SCHEDULES", "Schedule", "register_schedule", "DECAY_SHAPES", "step_decay",
           "decay_to", "wsd", "with_warmup", "linear_scaled_lr", "sqrt_scaled_lr"]
