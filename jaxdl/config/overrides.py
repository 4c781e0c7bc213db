"""`key.path=value` overrides on a locked experiment config (`apply_overrides`, `--set`):
the value parsed as a Python literal when it is one, a `data.name=KIND` switching its section
first; copies of a config with overrides (`variant_config`, `with_overrides`); `diff_configs`.
"""

from __future__ import annotations

import ast
from typing import Any, Sequence

import ml_collections

from jaxdl.config.settings import validate
from jaxdl.schema import SWITCHABLE, ConfigError, switch_section


def _parse_value(text: str) -> Any:
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    lowered = text.lower()
    if lowered in ("true", "false"):
      return lowered == "true"
    if lowered in ("none", "null"):
      return None
    return text


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str]) -> None:
  """Applies `key.path=value` overrides in place; raises ConfigError naming the key.

  `data.name=KIND` comes first, whatever its place: it re-writes the data section for that
  source (its own keys at their defaults, the experiment's batch size kept), so the source's
  keys can be set after it (`--set data.name=parquet --set data.path=f.parquet`).
  """
  items = []
  for item in overrides:
    if "=" not in item:
      raise ConfigError(f"override: {item!r} is not of the form key.path=value")
    key, text = item.split("=", 1)
    key = key.strip()
    if key.startswith("config."):  # accept the `--config.x=` spelling too
      key = key[len("config."):]
    items.append((key, text))
  items.sort(key=lambda kv: not _switches_section(config, *kv))
  for key, text in items:
    if _switches_section(config, key, text):
      section = key.rsplit(".", 1)[0]
      switched = switch_section(section, config[section], _parse_value(text))
      switched.lock()  # as locked as the section it replaces: a typo after it is still refused
      with config.unlocked():
        config[section] = switched
      continue
    _apply_override(config, key, text)


def variant_config(config, overrides: dict) -> ml_collections.ConfigDict:
  """A copy of `config` with `overrides` ({'model.num_layers': 4, ...}) applied and checked as
  `--set` would (an unknown key or a wrong type is a ConfigError naming it)."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.lock()
  apply_overrides(c, [f"{key}={value!r}" for key, value in overrides.items()])
  return c


def with_overrides(base: ml_collections.ConfigDict,
                   overrides: Sequence[str]) -> ml_collections.ConfigDict:
  """A copy of the loaded experiment config `base` with `key.path=value` `overrides` applied and
  validated: `load_config(spec, overrides)` for the spec `base` was loaded from without
  overrides (an experiment's `get_config` is a pure function of its arg), without reading the
  file again. Multi-run procedures (the sweep's points) take `base` from their caller."""
  c = ml_collections.ConfigDict(base.to_dict())
  c.lock()
  apply_overrides(c, overrides)
  validate(c)
  return c


def _switches_section(config, key: str, text: str) -> bool:
  """Whether `key=text` names another class for a switchable section (`data.name=parquet`)."""
  section, _, leaf = key.rpartition(".")
  return (leaf == "name" and section in SWITCHABLE and section in config
          and isinstance(config[section], ml_collections.ConfigDict)
          and config[section].get("name") != _parse_value(text))


def _apply_override(config: ml_collections.ConfigDict, key: str, text: str) -> None:
  """Sets one `key.path` of the locked config to the literal `text`."""
  *parents, leaf = key.split(".")
  node = config
  for i, part in enumerate(parents):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      raise ConfigError(f"{'.'.join(parents[:i + 1])}: unknown key")
    node = node[part]
  if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
    raise ConfigError(f"{key}: unknown key")
  value = _parse_value(text)
  current = node[leaf]
  expected = node.get_type(leaf)
  if isinstance(current, ml_collections.ConfigDict):
    raise ConfigError(f"{key}: is a section; set one of its keys instead")
  if isinstance(value, list) and isinstance(current, tuple):
    value = tuple(value)
  if isinstance(value, tuple) and isinstance(current, list):
    value = list(value)
  if isinstance(value, str) and expected in (int, float, bool):
    raise ConfigError(f"{key}: expected {expected.__name__}, got {text!r}")
  if expected is str and isinstance(value, (bool, int, float)):
    value = text.strip()  # a name that reads as a literal ('true', '1'): the key's check judges it
  try:
    node[leaf] = value
  except TypeError:
    raise ConfigError(
        f"{key}: expected {getattr(expected, '__name__', expected)}, got {text!r}") from None


def diff_configs(old: dict, new: dict, prefix: str = "") -> list[str]:
  """Dotted keys whose values differ between two nested dicts (JSON views of configs)."""
  keys = sorted(set(old) | set(new))
  out = []
  for k in keys:
    path = f"{prefix}{k}"
    a, b = old.get(k, "<missing>"), new.get(k, "<missing>")
    if isinstance(a, dict) and isinstance(b, dict):
      out += diff_configs(a, b, path + ".")
    elif a != b:
      out.append(f"{path}: {a!r} -> {b!r}")
  return out
