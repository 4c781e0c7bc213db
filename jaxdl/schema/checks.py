"""Declaring a setting: `setting(default, check)`, the range checks, `Settings` (checks its
fields on construction) and `ConfigError`, the one-line error (exit 2).

The bottom of the bottom layer: it imports no other jaxdl module and no jax.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, ClassVar, NamedTuple


class ConfigError(ValueError):
  """A bad experiment name, key or value; the message is one line naming it (exit code 2)."""


class Check(NamedTuple):
  """A range check: `ok(value)` must hold, else `{prefix}{key}: {message}, got {value!r}`.

  `message` may instead be a function of the value returning the whole message (a check that
  parses, like `data.augment`, says which part failed). With `explains_type`, that function also
  explains a value of the wrong type (a setting whose old spelling was a bool, `model.remat`)
  instead of the generic "expected T".
  """

  ok: Callable[[Any], bool]
  message: str | Callable[[Any], str]
  explains_type: bool = False


POSITIVE = Check(lambda v: v > 0, "must be > 0")
NONNEG = Check(lambda v: v >= 0, "must be >= 0")
UNIT = Check(lambda v: 0 <= v < 1, "must be in [0, 1)")
FRACTION = Check(lambda v: 0 <= v <= 1, "must be in [0, 1]")
OPEN_FRACTION = Check(lambda v: 0 < v <= 1, "must be in (0, 1]")
OPEN_UNIT = Check(lambda v: 0 < v < 1, "must be in (0, 1)")


def at_least(bound, why: str = "") -> Check:
  """`value >= bound` (`why` says what the bound means, e.g. '1 = none')."""
  return Check(lambda v: v >= bound, f"must be >= {bound}" + (f" ({why})" if why else ""))


def greater_than(bound, why: str = "") -> Check:
  return Check(lambda v: v > bound, f"must be > {bound}" + (f" ({why})" if why else ""))


def one_of(*choices) -> Check:
  """`value in choices`."""
  return Check(lambda v: v in choices,
               f"expected one of {', '.join(map(repr, choices))}")


def each(check: Check) -> Check:
  """`check` on every item of a sequence (widths, channels, an image shape)."""
  return Check(lambda v: isinstance(v, (tuple, list)) and all(check.ok(x) for x in v),
               f"every item {check.message}")


def setting(default, check: Check | None = None, *, run_choice: bool = False):
  """A dataclass field with its default and range check (the check is skipped for None).

  `run_choice`: a model setting of how a run trains or computes, not of what the model is (its
  parameters' paths and shapes and the function they compute do not depend on it: dropout,
  remat, dtypes, LoRA adapters, which start at zero), so a run fine-tuning a base may set it
  over the base's (`run_choices`; `jaxdl.train.init_from`)."""
  if isinstance(default, (list, dict, set)):
    raise TypeError("setting: a mutable default; use a tuple")
  return dataclasses.field(default=default, metadata={"check": check, "run_choice": run_choice})


def run_choices(cls) -> tuple[str, ...]:
  """The fields of a settings or model class declared with `setting(..., run_choice=True)`."""
  return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("run_choice"))


def runtime(default=None):
  """A dataclass field the run sets, never a config key (`hints` leaves it out): e.g. how the
  mesh strategy splits a model's sequence (`jaxdl.train.mesh`, through `apply_precision`)."""
  return dataclasses.field(default=default, metadata={"runtime": True})


def _check_of(cls, key: str) -> Check | None:
  """The nearest check declared for `key` along the class's bases (a subclass may redeclare a
  field only to change its default)."""
  for c in cls.__mro__:
    f = getattr(c, "__dataclass_fields__", {}).get(key)
    if f is not None and f.metadata.get("check") is not None:
      return f.metadata["check"]
  return None


def fail(prefix: str, key: str, message: str):
  raise ConfigError(f"{prefix}{key}: {message}")


def check_fields(obj, prefix: str) -> None:
  """Refuses a non-finite float (`1e400` parses as inf) or a value outside its field's check,
  one line naming `prefix + key`."""
  for f in dataclasses.fields(obj):
    if f.name in ("parent", "name") and prefix == "model.":
      continue  # flax's own fields
    value = getattr(obj, f.name)
    items = value if isinstance(value, (tuple, list)) else (value,)
    if any(isinstance(v, float) and not math.isfinite(v) for v in items):
      fail(prefix, f.name, f"must be a finite number, got {value!r}")
    check = _check_of(type(obj), f.name)
    if check is not None and value is not None and not check.ok(value):
      message = check.message
      fail(prefix, f.name, message(value) if callable(message) else f"{message}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Settings:
  """A parsed config section: checks every field after construction (`check_fields`)."""

  prefix: ClassVar[str] = ""            # 'train.', 'optim.', ...: errors name prefix + key
  name: ClassVar[str] = ""              # a registered class's name (set by `registrar`)
  kind: ClassVar[str] = ""              # 'optimizer', 'dataset', ...: used in error messages
  off_values: ClassVar[dict] = {}       # key -> value meaning "off", for classes without it
  unset_hints: ClassVar[dict] = {}      # key -> what to do instead, for classes without it
  # A registry whose sections hold the keys of all its classes (the optimizers' b1, b2, ...)
  # writes them as None placeholders: there None means "this class's default", not "unset".
  none_is_default: ClassVar[bool] = False

  def __post_init__(self):
    check_fields(self, self.prefix)

  def fail(self, key: str, message: str):
    fail(self.prefix, key, message)
