"""The one way to declare a setting: its type, default and check, and the one-line error.

Every config section (`train`, `parallel`, `data`, `model`, `optim`, `optim.schedule`, `gen`,
`reflow`, `distill`) is a frozen dataclass whose fields are the section's keys, each declared once:

  @dataclasses.dataclass(frozen=True)
  class TrainSettings(Settings):
    prefix: ClassVar[str] = "train."
    steps: int = setting(1000, POSITIVE)
    precision: str = setting("fp32", one_of("fp32", "bf16", "fp16"))

`Settings.__post_init__` type-checks nothing (the locked ConfigDict and `parse_section` do that)
but checks every field's range and refuses non-finite floats, so a class built directly
(`TrainSettings(steps=-5)`) fails as a parsed one does: `train.steps: must be > 0, got -5`.

A section chooses one of several classes by its `name` key (the optimizer, the schedule, the
dataset): those classes are registered in a dict by `registrar(registry, kind)`, and
`parse_section(section, registry)` builds the named one. `default_section(cls)` writes a class's
fields back out as the ConfigDict that experiments start from and `--set` overrides.

Flax model classes are dataclasses too: their fields use `setting(...)` and their
`__post_init__` calls `check_fields(self, "model.")`.

This module is the bottom layer: it imports no other jaxdl module and no jax.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import math
import types
import typing
from typing import Any, Callable, ClassVar, NamedTuple

import ml_collections
from ml_collections import config_dict


class ConfigError(ValueError):
  """A bad experiment name, key or value; the message is one line naming it (exit code 2)."""


class Check(NamedTuple):
  """A range check: `ok(value)` must hold, else `{prefix}{key}: {message}, got {value!r}`.

  `message` may instead be a function of the value returning the whole message (a check that
  parses, like `data.augment`, says which part failed).
  """

  ok: Callable[[Any], bool]
  message: str | Callable[[Any], str]


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


def setting(default, check: Check | None = None):
  """A dataclass field with its default and range check (the check is skipped for None)."""
  if isinstance(default, (list, dict, set)):
    raise TypeError("setting: a mutable default; use a tuple")
  return dataclasses.field(default=default, metadata={"check": check})


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


# Section path -> the registry whose `name` key picks the section's class, for the sections a
# `--set PATH.name=...` may switch to another class with other keys (`switch_section`).
SWITCHABLE: dict[str, dict] = {}


def switchable_registry(path: str) -> dict:
  """The registry of section `path` ('data'): filled by `registrar`, read by `switch_section`."""
  return SWITCHABLE.setdefault(path, {})


def switch_section(path: str, section, name: str):
  """Section `path` re-written for class `name` of its registry: that class's keys at their
  defaults, except the keys the section's current class has too, which keep the section's values
  (a data section's batch size; a text source's context length when another text source
  replaces it). None when `path` is not a switchable section."""
  registry = SWITCHABLE.get(path)
  if not registry:
    return None
  base = next(iter(registry.values()))
  if name not in registry:
    fail(base.prefix, "name", f"unknown {base.kind} {name!r}; expected one of "
         f"{', '.join(registry)}")
  current = registry.get(section.get("name"))
  shared = set(hints(registry[name])) & set(hints(current) if current else ())
  return default_section(registry[name], **{k: section[k] for k in shared if k in section})


def registrar(registry: dict, kind: str, base: type | None = None) -> Callable:
  """`register(name)`: a class decorator that fills `registry[name]` and sets `cls.name`."""

  def register(name: str):
    def deco(cls):
      # Own params, not inherited ones: a subclass left undecorated would silently lose fields.
      params = vars(cls).get("__dataclass_params__") if isinstance(cls, type) else None
      if not (params is not None and params.frozen and (base is None or issubclass(cls, base))):
        raise TypeError(f"{kind} {name!r}: register a frozen dataclass (put the decorator above "
                        "@dataclasses.dataclass(frozen=True))")
      if name in registry:
        raise ValueError(f"{kind} {name!r} is registered twice")
      cls.name = name
      types_of({**registry, name: cls})  # a key shared by two classes must have one type
      registry[name] = cls
      return cls

    return deco

  return register


def config_type(hint) -> type:
  """The ConfigDict type of a field annotation: Optional stripped, tuples as lists."""
  if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
    hint = next(a for a in typing.get_args(hint) if a is not type(None))
  t = typing.get_origin(hint) or hint
  return list if t in (tuple, list, collections.abc.Sequence) else t


@functools.cache
def hints(cls) -> collections.abc.Mapping:
  """Field name -> annotation of a dataclass (annotations resolved; ClassVars left out).

  Read-only, cached per class: resolving string annotations (`typing.get_type_hints` compiles
  each one) costs about a millisecond a class, and every config load, `--set` and model
  construction asks again (28 CPU-s of the test suite, sampled)."""
  resolved = typing.get_type_hints(cls)
  return types.MappingProxyType(
      {f.name: resolved.get(f.name, Any) for f in dataclasses.fields(cls)})


def types_of(registry: dict, base=None) -> dict:
  """Key -> ConfigDict type over every class of a registry (minus `base`'s fields)."""
  skip = set(hints(base)) if base is not None else set()
  out = {}
  for name, cls in registry.items():
    for key, hint in hints(cls).items():
      t = config_type(hint)
      if key in skip:
        continue
      if out.setdefault(key, t) is not t:
        raise TypeError(f"{cls.kind} {name!r}: key {key!r} is {t.__name__} here and "
                        f"{out[key].__name__} in another {cls.kind}")
  return out


def coerce(key: str, value, hint):
  """`value` as the field type (int -> float, list -> tuple); ConfigError naming `key` if not.

  Refuses a bool where a number is expected and an int beyond int64 (`2**63`, `1e26` as int).
  """
  optional = type(None) in typing.get_args(hint)
  t = config_type(hint)
  if value is None:
    if optional:
      return None
    raise ConfigError(f"{key}: must be set (expected {getattr(t, '__name__', t)})")
  if t is Any or t is object:
    return tuple(value) if isinstance(value, list) else value
  if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
    return float(value)
  if t is list and isinstance(value, (list, tuple)):
    return tuple(value)
  if t in (int, bool, str) and type(value) is t:
    if t is int and not -2**63 <= value < 2**63:
      raise ConfigError(f"{key}: {value} does not fit in a 64-bit integer")
    return value
  expected = "tuple" if t is list else getattr(t, "__name__", t)  # fields hold tuples
  raise ConfigError(f"{key}: expected {expected}, got {value!r}")


def _refusal(cls, key: str, value, registry: dict) -> str:
  """The one-line error for a key the chosen class does not have."""
  owners = [n for n, c in registry.items() if key in hints(c)]
  hint = cls.unset_hints.get(key, f"use one that has it ({', '.join(map(repr, owners))})")
  return (f"{cls.prefix}{key}: {cls.kind} {cls.name!r} has no {key.replace('_', ' ')} "
          f"(got {value!r}); {hint}, or leave it unset")


def parse_section(section, schema, *, default: str | None = None, strict: bool = True):
  """A config section (ConfigDict or mapping) as its checked, frozen settings object.

  `schema` is a `Settings` class, or a registry {name: class} from which `section['name']`
  (else `default`) picks one. A key is type-checked against its field (`coerce`) and a key the
  class lacks is refused in one line naming it; in a registry, a key that only other classes have
  is accepted when it is None (unset) or the class's `off_values` entry (e.g. `weight_decay=0`);
  None for a key of the class is an error unless its field is optional or the class says
  `none_is_default`.
  With `strict=False` such keys are dropped instead: for the record of a past run (its
  `config.json`), written before they were errors. A key left out takes the class default.
  """
  given = plain(section) if section is not None else {}
  registry = None
  if isinstance(schema, dict):
    registry = schema
    base = next(iter(registry.values()))
    name = given.get("name", default)
    if not name:
      fail(base.prefix, "name", f"must be set; expected one of {', '.join(registry)}")
    if name not in registry:
      fail(base.prefix, "name", f"unknown {base.kind} {name!r}; expected one of "
           f"{', '.join(registry)}")
    cls = registry[name]
  else:
    cls = schema
  own = hints(cls)
  kwargs = {}
  for key, value in given.items():
    if key == "name" and registry is not None:
      continue
    if key in own:
      if value is None and cls.none_is_default:
        continue  # a placeholder of the registry's section: the class's default
      kwargs[key] = coerce(cls.prefix + key, value, own[key])
    elif registry is not None and any(key in hints(c) for c in registry.values()):
      if strict and value is not None and cls.off_values.get(key, object()) != value:
        raise ConfigError(_refusal(cls, key, value, registry))
    elif strict:
      what = f" for {cls.kind} {cls.name!r}" if registry is not None else ""
      fail(cls.prefix, key, f"unknown key{what}; expected one of "
           f"{', '.join(sorted(k for k in own if k != 'parent'))}")
  return cls(**kwargs)


def default_section(cls, **overrides) -> ml_collections.ConfigDict:
  """A ConfigDict with every field of `cls` at its default (`overrides` replace some).

  A field whose default is None becomes a typed placeholder, so `--set data.n_eval=500` is still
  type-checked by the locked config. A registered class also writes its `name`.
  """
  own = hints(cls)
  unknown = sorted(set(overrides) - set(own) - {"name"})
  if unknown:
    fail(cls.prefix, unknown[0], f"unknown key; expected one of {', '.join(sorted(own))}")
  cfg = ml_collections.ConfigDict()
  if cls.name and "name" not in own:
    cfg.name = cls.name
  for f in dataclasses.fields(cls):
    if not f.init or f.name in ("parent",):
      continue
    if f.name in overrides:
      value = overrides[f.name]
    elif f.default is not dataclasses.MISSING:
      value = f.default
    elif f.default_factory is not dataclasses.MISSING:
      value = f.default_factory()
    else:
      continue
    t = config_type(own[f.name])
    if value is None:
      cfg[f.name] = config_dict.placeholder(t) if t not in (Any, object) else None
    else:
      cfg[f.name] = value
  return cfg


def plain(cfg) -> dict:
  """A plain nested dict of a ConfigDict (references resolved) or of a mapping."""
  if hasattr(cfg, "to_dict"):
    return cfg.to_dict()
  return {k: plain(v) if isinstance(v, dict) or hasattr(v, "to_dict") else v
          for k, v in dict(cfg).items()}
