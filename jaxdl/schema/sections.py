"""Parsing a config section to its checked object, and writing a class's defaults back out.

`Registry` / `registrar` (a section that picks its class by its `name` key), `subsection` (a
section held inside another), `switch_section` (`--set PATH.name=...`), `hints` / `defaults` /
`types_of` (a section class's keys), `coerce`, `parse_section`, `default_section`, `plain`.
Imports only `jaxdl.schema.checks`.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import inspect
import numbers
import types
import typing
from typing import Any, Callable

import ml_collections
from ml_collections import config_dict

from jaxdl.schema.checks import ConfigError, Settings, _check_of, fail


class Registry(dict):
  """A registry {name: builder} of builders that are no `Settings` (Flax model classes, builder
  functions): it carries their section's `prefix` and `kind`, and `Settings`' defaults for the
  rest, so `parse_section` refuses and names their keys as it does for `Settings` classes."""

  off_values = Settings.off_values
  unset_hints = Settings.unset_hints
  none_is_default = Settings.none_is_default

  def __init__(self, prefix: str, kind: str):
    super().__init__()
    self.prefix, self.kind = prefix, kind


def _meta(cls, registry: dict | None):
  """Where `cls`'s section attributes (prefix, kind, off_values, ...) are read: the class for a
  `Settings` class, else its `Registry`."""
  if isinstance(cls, type) and issubclass(cls, Settings):
    return cls
  if isinstance(registry, Registry):
    return registry
  raise TypeError(f"{cls!r}: a section class is a Settings, or registered in a schema.Registry")


def subsection(registry: dict, default: type, *, flat: bool = False):
  """A field holding a section of `registry`'s classes, the one its `name` key picks (else
  `default`): the nested section named like the field (`optim.schedule.*`), or with `flat`, the
  keys of the owner's own section besides the owner's fields (`optim.name`, `optim.b1`, ... beside
  `optim.lr`). `parse_section` and `default_section` read and write it with the owner."""
  return dataclasses.field(default_factory=default,
                           metadata={"registry": registry, "flat": flat})


def _subsections(cls) -> dict:
  """Field name -> dataclasses.Field of the `subsection` fields of `cls`."""
  if not dataclasses.is_dataclass(cls):
    return {}
  return {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("registry") is not None}


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
  """Key -> annotation of a section class (annotations resolved; ClassVars left out).

  A section class is a dataclass (a `Settings` class, a Flax module: its `parent` and `name`
  are Flax's own, not keys), or a builder function: its named parameters and, when it forwards
  `**fields` to a class, that class's keys (`builder.model_class`). An annotation that does not
  resolve is `Any` (the key is not type-checked).

  Read-only, cached per class: resolving string annotations (`typing.get_type_hints` compiles
  each one) costs about a millisecond a class, and every config load, `--set` and model
  construction asks again (28 CPU-s of the test suite, sampled)."""
  if dataclasses.is_dataclass(cls):
    resolved = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if not f.metadata.get("runtime")]
    if "parent" in names:  # a Flax module
      names = [n for n in names if n not in ("parent", "name")]
    return types.MappingProxyType({n: resolved.get(n, Any) for n in names})
  try:
    resolved = typing.get_type_hints(cls)
  except (NameError, TypeError):
    resolved = {}
  params = inspect.signature(cls).parameters.values()
  out = {p.name: resolved.get(p.name, Any) for p in params
         if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
  if any(p.kind == p.VAR_KEYWORD for p in params):
    out.update({k: v for k, v in hints(cls.model_class).items() if k not in out})
  return types.MappingProxyType(out)


def defaults(cls) -> dict:
  """Key -> default of a section class (see `hints`); a key without a default is left out."""
  if dataclasses.is_dataclass(cls):
    own = hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
      if f.name not in own:
        continue
      if f.default is not dataclasses.MISSING:
        out[f.name] = f.default
      elif f.default_factory is not dataclasses.MISSING:
        out[f.name] = f.default_factory()
    return out
  out = {}
  for p in inspect.signature(cls).parameters.values():
    if p.kind == p.VAR_KEYWORD:
      out.update({k: v for k, v in defaults(cls.model_class).items() if k not in out})
    elif p.default is not p.empty:
      out[p.name] = p.default
  return out


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
  if isinstance(value, numbers.Number) and type(value) not in (int, float, bool, complex):
    value = value.item()  # a numpy scalar, e.g. a size read from a dataset's info
  if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
    return float(value)
  if t is list and isinstance(value, (list, tuple)):
    return tuple(value)
  if t in (int, bool, str) and type(value) is t:
    if t is int and not -2**63 <= value < 2**63:
      raise ConfigError(f"{key}: {value} does not fit in a 64-bit integer")
    return value
  if t not in (int, float, bool, str, list) and isinstance(t, type) and isinstance(value, t):
    return value  # a field of another type (a Flax model's `jnp.dtype`) holding one
  expected = "tuple" if t is list else getattr(t, "__name__", t)  # fields hold tuples
  raise ConfigError(f"{key}: expected {expected}, got {value!r}")


def _refusal(meta, name: str, key: str, value, registry: dict) -> str:
  """The one-line error for a key the chosen class `name` does not have."""
  owners = [n for n, c in registry.items() if key in hints(c)]
  hint = meta.unset_hints.get(key, f"use one that has it ({', '.join(map(repr, owners))})")
  return (f"{meta.prefix}{key}: {meta.kind} {name!r} has no {key.replace('_', ' ')} "
          f"(got {value!r}); {hint}, or leave it unset")


def _registry_meta(registry: dict):
  """Prefix and kind of a registry's sections: the `Registry`'s own, else its first class's."""
  return registry if isinstance(registry, Registry) else next(iter(registry.values()))


def _pick(registry: dict, name):
  """`registry[name]`, else the one-line error naming `{prefix}name`."""
  meta = _registry_meta(registry)
  if not name:
    fail(meta.prefix, "name", f"must be set; expected one of {', '.join(registry)}")
  if name not in registry:
    fail(meta.prefix, "name", f"unknown {meta.kind} {name!r}; expected one of "
         f"{', '.join(registry)}")
  return registry[name]


def parse_section(section, schema, *, default: str | None = None, strict: bool = True):
  """A config section (ConfigDict or mapping) as its checked, frozen settings object.

  `schema` is a section class (a `Settings` class; see `hints` for the others), or a registry
  {name: class} from which `section['name']` (else `default`) picks one; a registry of classes
  that are no `Settings` (Flax models) is a `Registry`. A key is type-checked against its field
  (`coerce`) and a key the class lacks is refused in one line naming it; in a registry, a key that
  only other classes have is accepted when it is None (unset) or the class's `off_values` entry
  (e.g. `weight_decay=0`); None for a key of the class is an error unless its field is optional
  or the class says `none_is_default`. A `subsection` field is parsed from its nested section or,
  flat, from the section's keys that are not the class's own (`optim.name`, `optim.b1`).
  With `strict=False` such keys are dropped instead: for the record of a past run (its
  `config.json`), written before they were errors. A key left out takes the class default.
  """
  given = plain(section) if section is not None else {}
  registry, name = None, None
  if isinstance(schema, dict):
    registry = schema
    name = given.get("name") or default
    cls = _pick(registry, name)
  else:
    cls = schema
  meta = _meta(cls, registry)
  name = name or cls.name
  own = hints(cls)
  subs = _subsections(cls)
  kwargs = {}
  flat = next((k for k, f in subs.items() if f.metadata["flat"]), None)
  if flat is not None:
    sub_registry = subs[flat].metadata["registry"]
    inner = {k: given.pop(k) for k in list(given) if k not in own or k == flat}
    known = set(types_of(sub_registry)) | {"name"}
    for key in inner:
      if key not in known and strict:
        fail(meta.prefix, key, f"unknown key; expected one of "
             f"{', '.join(sorted((set(own) - {flat}) | known))}")
    kwargs[flat] = parse_section({k: v for k, v in inner.items() if k in known}, sub_registry,
                                 default=_default_name(subs[flat]), strict=strict)
  for key, value in given.items():
    if key == "name" and registry is not None:
      continue
    if key in subs:
      kwargs[key] = parse_section(value, subs[key].metadata["registry"],
                                  default=_default_name(subs[key]), strict=strict)
    elif key in own:
      if value is None and meta.none_is_default:
        continue  # a placeholder of the registry's section: the class's default
      try:
        kwargs[key] = coerce(meta.prefix + key, value, own[key])
      except ConfigError:
        owner = getattr(cls, "model_class", cls)  # a builder function names its class
        check = _check_of(owner, key) if isinstance(owner, type) else None
        if check is None or not check.explains_type:
          raise
        fail(meta.prefix, key, check.message(value))  # a check that explains a wrong type too
    elif registry is not None and any(key in hints(c) for c in registry.values()):
      if strict and value is not None and meta.off_values.get(key, object()) != value:
        raise ConfigError(_refusal(meta, name, key, value, registry))
    elif strict:
      what = f" for {meta.kind} {name!r}" if registry is not None else ""
      fail(meta.prefix, key, f"unknown key{what}; expected one of {', '.join(sorted(own))}")
  return cls(**kwargs)


def _default_name(field: dataclasses.Field) -> str:
  """The registered name of a `subsection` field's default class."""
  return field.default_factory.name


def default_section(schema, name: str | None = None, /, **overrides) -> ml_collections.ConfigDict:
  """A ConfigDict with every key of a section class at its default (`overrides` replace some).

  `schema` is a section class, or a registry and the `name` of its class (written as the
  section's `name`; a registered `Settings` class writes its own). A key whose default is None
  becomes a typed placeholder, so `--set data.n_eval=500` is still type-checked by the locked
  config. A `subsection` is written with the name of its default class, the keys that every
  class of its registry has at that class's defaults, and the other classes' keys as
  placeholders (None: the chosen class's default).
  """
  if isinstance(schema, dict):
    meta, cls = _registry_meta(schema), _pick(schema, name)
  else:
    meta, cls, name = schema, schema, schema.name
  own = hints(cls)
  unknown = sorted(set(overrides) - set(own) - {"name"})
  if unknown:
    fail(meta.prefix, unknown[0], f"unknown key; expected one of {', '.join(sorted(own))}")
  cfg = ml_collections.ConfigDict()
  subs = _subsections(cls)
  if name and "name" not in own and not any(f.metadata["flat"] for f in subs.values()):
    cfg.name = name  # (a flat subsection writes the name of its own class)
  values = {**defaults(cls), **overrides}
  for key, hint in own.items():
    if key in subs:
      registry = subs[key].metadata["registry"]
      if subs[key].metadata["flat"]:
        _write_registry_keys(cfg, registry, values[key])
      else:
        cfg[key] = _write_registry_keys(ml_collections.ConfigDict(), registry, values[key])
    elif key in values:
      _put(cfg, key, values[key], config_type(hint))
  return cfg


def _write_registry_keys(cfg, registry: dict, chosen) -> ml_collections.ConfigDict:
  """Writes a `subsection` into `cfg` and returns it: `chosen`'s name, the keys every class of
  the registry has at `chosen`'s values, every other key of the registry as a typed
  placeholder."""
  cfg.name = chosen.name
  shared = set.intersection(*(set(hints(c)) for c in registry.values()))
  for key, t in types_of(registry).items():
    _put(cfg, key, getattr(chosen, key) if key in shared else None, t)
  return cfg


def _put(cfg: ml_collections.ConfigDict, key: str, value, t) -> None:
  """`cfg[key] = value`, a typed placeholder for None (so `--set` still checks the type)."""
  if value is None:
    cfg[key] = config_dict.placeholder(t) if t not in (Any, object) else None
  else:
    cfg[key] = value


def plain(cfg) -> dict:
  """A plain nested dict of a ConfigDict (references resolved) or of a mapping."""
  if hasattr(cfg, "to_dict"):
    return cfg.to_dict()
  return {k: plain(v) if isinstance(v, dict) or hasattr(v, "to_dict") else v
          for k, v in dict(cfg).items()}
