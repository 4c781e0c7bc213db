"""How the `data` config section becomes a typed, checked, frozen `DataSource`.

A registry maps a dataset name (the section's `name` key) to a frozen dataclass whose fields are
the section's other keys, each declared once with its default and its range check:

  @register_source("moons")
  @dataclasses.dataclass(frozen=True)
  class Moons(DataSource):
    noise: float = setting(0.25, NONNEG)

    def build(self) -> Source: ...

`parse_data(section)` picks the class named by `section['name']`, refuses a key the class does not
have and a value of the wrong type (an int is accepted for a float), each with one line naming the
key, and constructs the class. Ranges are checked in `__post_init__`, so a source built directly
(`Moons(noise=-1)`) refuses bad values as a parsed one does: `data.noise: must be >= 0, got -1`.
`default_data_config(name)` writes the section back out from the same fields.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Callable, ClassVar

import ml_collections
from ml_collections import config_dict
import numpy as np

from jaxdl.config import require_finite


@dataclasses.dataclass(frozen=True)
class Split:
  """`num` examples; `gather(idx_B) -> dict of (B, ...) numpy arrays`."""
  num: int
  gather: Callable[[np.ndarray], dict[str, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Source:
  """What a `DataSource` builds: the train and eval splits and the `info` dict."""
  train: Split
  eval: Split
  info: dict[str, Any]


# A check maps a (set, well-typed) value to its error message, or to None when the value is fine.
Check = Callable[[Any], "str | None"]


def _bound(ok: Callable[[Any], bool], message: str) -> Check:
  return lambda v: None if ok(v) else f"{message}, got {v}"


POSITIVE = _bound(lambda v: v > 0, "must be positive")
NONNEG = _bound(lambda v: v >= 0, "must be >= 0")
OPEN_UNIT = _bound(lambda v: 0 < v < 1, "must be in (0, 1)")


def one_of(*choices: str) -> Check:
  return lambda v: None if v in choices else f"{v!r} is not one of {', '.join(choices)}"


def setting(default, check: Check | None = None):
  """A field with its default and its range check (skipped when the value is None)."""
  return dataclasses.field(default=default, metadata={"check": check})


@dataclasses.dataclass(frozen=True)
class DataSource:
  """A parsed `data` section: the keys every dataset reads, and `build() -> Source`.

  A subclass may redeclare a field to change its default (`batch_size: int = 1000`); the range
  check declared here still applies.
  """

  name: ClassVar[str] = ""  # set by @register_source
  batch_size: int = setting(128, POSITIVE)                # G, global rows per training step
  eval_batch_size: int | None = setting(None, POSITIVE)   # None: the whole eval split at once
  shuffle: bool = True                                    # False: every epoch in row order

  def __post_init__(self):
    require_finite(self, "data.")
    for f in dataclasses.fields(self):
      value, check = getattr(self, f.name), _check_of(type(self), f.name)
      error = None if value is None or check is None else check(value)
      if error:
        raise ValueError(f"data.{f.name}: {error}")

  def build(self) -> Source:
    raise NotImplementedError(f"data source {self.name!r} defines no build()")


def _check_of(cls, key: str) -> Check | None:
  """The nearest check declared for `key` along the class's bases."""
  for c in cls.__mro__:
    f = getattr(c, "__dataclass_fields__", {}).get(key)
    if f is not None and f.metadata.get("check") is not None:
      return f.metadata["check"]
  return None


SOURCES: dict[str, type[DataSource]] = {}


def register_source(name: str):
  """Class decorator: `SOURCES[name] = cls` for a frozen `DataSource` dataclass."""

  def deco(cls):
    # Own params, not inherited ones: a subclass left undecorated would silently lose its fields.
    params = vars(cls).get("__dataclass_params__") if isinstance(cls, type) else None
    if not (params is not None and params.frozen and issubclass(cls, DataSource)):
      raise TypeError(f"data source {name!r}: register a frozen DataSource dataclass (put the "
                      "decorator above @dataclasses.dataclass(frozen=True))")
    if name in SOURCES:
      raise ValueError(f"data source {name!r} is registered twice")
    cls.name = name
    SOURCES[name] = cls
    return cls

  return deco


def _types(cls) -> dict[str, tuple[type, bool]]:
  """Field name -> (value type, whether None is allowed)."""
  out = {}
  for key, hint in typing.get_type_hints(cls).items():
    if key not in cls.__dataclass_fields__ or typing.get_origin(hint) is ClassVar:
      continue
    optional = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
      args = typing.get_args(hint)
      optional = type(None) in args
      hint = next(a for a in args if a is not type(None))
    out[key] = (typing.get_origin(hint) or hint, optional)
  return out


def _check_type(key: str, value, t: type, optional: bool):
  if value is None:
    if optional:
      return
    raise ValueError(f"data.{key}: must be set (expected {t.__name__})")
  if t is float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  else:
    ok = isinstance(value, t) and not (t is int and isinstance(value, bool))
  if not ok:
    raise ValueError(f"data.{key}: expected {t.__name__}, got {value!r}")


def source_class(name) -> type[DataSource]:
  """The registered class of dataset `name`; ValueError naming `data.name` if there is none."""
  if not name:
    raise ValueError(f"data.name: must be set; expected one of {', '.join(SOURCES)}")
  if name not in SOURCES:
    raise ValueError(f"data.name: unknown dataset {name!r}; expected one of "
                     f"{', '.join(SOURCES)}")
  return SOURCES[name]


def parse_data(data_cfg) -> DataSource:
  """The `data` section (ConfigDict or mapping) as its registered, checked `DataSource`.

  A key left out takes the class default; an explicit None is accepted only by an optional field
  (`int | None`), so an unset placeholder of a required key is an error naming it.
  """
  section = data_cfg.to_dict() if hasattr(data_cfg, "to_dict") else dict(data_cfg)
  cls = source_class(section.get("name"))
  fields = _types(cls)
  unknown = sorted(set(section) - set(fields) - {"name"})
  if unknown:
    raise ValueError(f"data.{unknown[0]}: unknown key for dataset {cls.name!r}; expected one "
                     f"of {', '.join(sorted([*fields, 'name']))}")
  # A section read back from a run's config.json holds JSON arrays where tuples were written.
  kwargs = {k: tuple(v) if fields.get(k, (None,))[0] is tuple and isinstance(v, list) else v
            for k, v in section.items() if k != "name"}
  for key, value in kwargs.items():
    _check_type(key, value, *fields[key])
  return cls(**kwargs)


def default_data_config(name: str) -> ml_collections.ConfigDict:
  """A ConfigDict with every key dataset `name` reads, at its default value.

  A field whose default is None becomes a typed placeholder, so `--set data.n_eval=500` is still
  type-checked by the locked config.
  """
  cls = source_class(name)
  fields = _types(cls)
  cfg = ml_collections.ConfigDict()
  cfg.name = name
  for f in dataclasses.fields(cls):
    default = f.default
    if default is dataclasses.MISSING:
      factory = f.default_factory
      default = None if factory is dataclasses.MISSING else factory()
    cfg[f.name] = config_dict.placeholder(fields[f.name][0]) if default is None else default
  return cfg
