"""How one `optim` config section becomes a typed, checked, frozen dataclass.

A registry maps a name (the section's `name` key) to a frozen dataclass; the section's other keys
are that class's fields, each declared once with its default and its range check:

  @register_optimizer("adam")
  @dataclasses.dataclass(frozen=True)
  class Adam(Optimizer):
    b2: float = setting(0.999, UNIT)

`parse_section` turns a plain dict into the named class: a key of the class is type-checked
(an int is accepted for a float) and passed on; a key that only other classes of the registry
have is refused with one line naming it, unless it is None (unset) or its `off_values` entry
(e.g. `weight_decay=0`, which every optimizer honours). Ranges are checked in `__post_init__`,
so a class built directly (`Adam(b2=1.5)`) refuses bad values as a parsed one does:
`optim.b2: must be in [0, 1), got 1.5`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Callable, ClassVar, NamedTuple

from jaxdl.config import require_finite


class Check(NamedTuple):
  """A range check: `ok(value)` must hold, else `{key}: {message}, got {value!r}`."""

  ok: Callable[[Any], bool]
  message: str


NONNEG = Check(lambda v: v >= 0, "must be a number >= 0")
POSITIVE = Check(lambda v: v > 0, "must be > 0")
UNIT = Check(lambda v: 0 <= v < 1, "must be in [0, 1)")
FRACTION = Check(lambda v: 0 <= v <= 1, "must be in [0, 1]")
OPEN_FRACTION = Check(lambda v: 0 < v <= 1, "must be in (0, 1]")


def one_of(choices) -> Check:
  return Check(lambda v: v in choices, f"must be one of {list(choices)}")


def setting(default, check: Check | None = None):
  """A dataclass field with its default and range check (skipped when the value is None)."""
  return dataclasses.field(default=default, metadata={"check": check})


@dataclasses.dataclass(frozen=True)
class Checked:
  """Checks every field's `setting` range after construction; errors name `prefix + key`."""

  prefix: ClassVar[str] = ""

  def __post_init__(self):
    require_finite(self, self.prefix)
    for f in dataclasses.fields(self):
      check, value = f.metadata.get("check"), getattr(self, f.name)
      if check is not None and value is not None and not check.ok(value):
        self.fail(f.name, f"{check.message}, got {value!r}")

  def fail(self, key: str, message: str):
    raise ValueError(f"{self.prefix}{key}: {message}")


@dataclasses.dataclass(frozen=True)
class Section(Checked):
  """A registered class of one registry; `name` is set by the registering decorator."""

  name: ClassVar[str] = ""
  kind: ClassVar[str] = ""              # 'optimizer', 'schedule': used in error messages
  off_values: ClassVar[dict] = {}       # key -> value that means "off" for classes without it
  unset_hints: ClassVar[dict] = {}      # key -> what to do instead, for classes without it


def registrar(registry: dict, kind: str) -> Callable:
  """`register(name)`: a class decorator that fills `registry[name]` and sets `cls.name`."""

  def register(name: str):
    def deco(cls):
      if not (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen):
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
  return list if t is tuple else t


def hints(cls) -> dict:
  """Field name -> annotation of a dataclass (annotations resolved)."""
  resolved = typing.get_type_hints(cls)
  return {f.name: resolved[f.name] for f in dataclasses.fields(cls)}


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
  """`value` as the field type (int -> float, list -> tuple); ValueError naming `key` if not."""
  optional = type(None) in typing.get_args(hint)
  if value is None:
    if optional:
      return None
    raise ValueError(f"{key}: must be set, got None")
  t = config_type(hint)
  if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
    return float(value)
  if t is list and isinstance(value, str):
    return (value,)
  if t is list and isinstance(value, (list, tuple)):
    return tuple(value)
  if t in (int, bool, str) and type(value) is t:
    return value
  raise ValueError(f"{key}: expected {t.__name__}, got {value!r}")


def refusal(cls, key: str, value, registry: dict) -> str:
  """The one-line error for a key the chosen class does not have."""
  owners = [n for n, c in registry.items() if key in hints(c)]
  hint = cls.unset_hints.get(key, f"use one that has it ({', '.join(map(repr, owners))})")
  return (f"{cls.prefix}{key}: {cls.kind} {cls.name!r} has no {key.replace('_', ' ')} "
          f"(got {value!r}); {hint}, or leave it unset")


def parse_section(section: dict, registry: dict, default: str, *, strict: bool = True):
  """The registered class named by `section['name']` (else `default`) built from the section.

  `section` holds only keys of this registry (the caller refuses unknown keys). With
  `strict=False`, keys the chosen class does not have are dropped instead of refused: for the
  record of a past run (its `config.json`), written before such keys were errors.
  """
  name = section.get("name", default)
  if name not in registry:
    base = next(iter(registry.values()))
    raise ValueError(f"{base.prefix}name: unknown {base.kind} {name!r}; "
                     f"expected one of {list(registry)}")
  cls = registry[name]
  own = hints(cls)
  kwargs = {}
  for key, value in section.items():
    if key == "name" or value is None:  # None: the class's default
      continue
    if key in own:
      kwargs[key] = coerce(cls.prefix + key, value, own[key])
    elif strict and cls.off_values.get(key, object()) != value:
      raise ValueError(refusal(cls, key, value, registry))
  return cls(**kwargs)


def plain(cfg) -> dict:
  """A plain nested dict of a ConfigDict (references resolved) or of a mapping."""
  if hasattr(cfg, "to_dict"):
    return cfg.to_dict()
  return {k: plain(v) if isinstance(v, dict) or hasattr(v, "to_dict") else v
          for k, v in dict(cfg).items()}
