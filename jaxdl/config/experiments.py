"""Experiment files: finding one by name or path (`resolve_experiment`, `list_experiments`),
importing it, and `load_config` (its `get_config(arg)`, then `--set` overrides, then
`validate`); `parse_arg`, the experiments' reading of their `:ARG`; `default_workdir`.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import pathlib
import types
from typing import Sequence

import ml_collections

from jaxdl.config.overrides import _parse_value, apply_overrides
from jaxdl.config.settings import validate
from jaxdl.schema import ConfigError


def experiments_dir() -> pathlib.Path:
  """The directory searched for bare experiment names ($JAXDL_EXPERIMENTS overrides)."""
  env = os.environ.get("JAXDL_EXPERIMENTS")
  if env:
    return pathlib.Path(env)
  return pathlib.Path(__file__).resolve().parent.parent.parent / "experiments"


def list_experiments() -> list[tuple[str, str]]:
  """Returns (name, one-line description) for every experiment file, sorted by name."""
  out = []
  for path in sorted(experiments_dir().glob("*.py")):
    if path.name.startswith("_"):
      continue
    try:
      doc = ast.get_docstring(ast.parse(path.read_text(), filename=str(path))) or ""
    except (SyntaxError, ValueError, OSError, UnicodeDecodeError) as e:
      # One broken file must not hide the others: it is listed with its error instead.
      out.append((path.stem, f"(cannot be read: {_one_line(e)})"))
      continue
    out.append((path.stem, doc.strip().splitlines()[0] if doc.strip() else ""))
  return out


def _one_line(e: BaseException) -> str:
  """`Type: message (line N)` of an exception, on one line."""
  if isinstance(e, SyntaxError):
    return f"SyntaxError: {e.msg} (line {e.lineno})"
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def resolve_experiment(spec: str) -> tuple[pathlib.Path, str | None]:
  """Splits `path_or_name[:arg]` and finds the experiment file."""
  arg = None
  base = spec
  if ":" in spec and not pathlib.Path(spec).exists():
    base, arg = spec.rsplit(":", 1)
  candidates = [pathlib.Path(base)]
  if not base.endswith(".py"):
    candidates.append(experiments_dir() / f"{base}.py")
  for path in candidates:
    if path.is_file():
      return path, arg or None
  names = ", ".join(name for name, _ in list_experiments())
  raise ConfigError(f"experiment: {base!r} not found; known experiments: {names}")


def default_workdir(spec: str, config) -> str:
  """`runs/<config.name>[-<arg>]`, the run directory when none is given.

  The experiment's `:ARG` is part of the name (commas as '-', `moons_mlp:bn,smoke` ->
  `runs/moons_mlp-bn-smoke`), so runs of differently configured variants never share a
  workdir: `jaxdl train moons_mlp` then `jaxdl train moons_mlp:bn` are two runs.
  """
  _, arg = resolve_experiment(spec)
  parts = [config.name] + [a.strip() for a in (arg or "").split(",") if a.strip()]
  return os.path.join("runs", "-".join(parts).replace(os.sep, "_"))


def load_module(path: pathlib.Path) -> types.ModuleType:
  """Imports an experiment file as a module.

  An experiment imports only jaxdl: shared setup lives in the library (`jaxdl.course`), never in
  another experiment or a helper file beside it, so its directory is not put on `sys.path`.
  """
  spec = importlib.util.spec_from_file_location(f"jaxdl_experiment_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # noqa: BLE001 -- any error of the user's file is a bad input
    raise ConfigError(f"experiment: {path} cannot be loaded: {_one_line(e)}") from e
  if not hasattr(module, "get_config"):
    raise ConfigError(f"experiment: {path} defines no get_config(arg=None)")
  return module


def load_config(spec: str, overrides: Sequence[str] = ()) -> tuple[ml_collections.ConfigDict,
                                                                  types.ModuleType]:
  """Loads an experiment, applies overrides and validates; returns (config, module)."""
  path, arg = resolve_experiment(spec)
  module = load_module(path)
  try:
    config = module.get_config(arg) if arg is not None else module.get_config()
  except (ValueError, KeyError) as e:
    raise ConfigError(f"experiment: {path.stem} rejects arg {arg!r}: {e}") from None
  except Exception as e:  # noqa: BLE001 -- a crashing get_config is the file's error, one line
    raise ConfigError(f"experiment: {path.stem}: get_config({arg!r}) raised "
                      f"{_one_line(e)}") from e
  if "name" not in config:
    raise ConfigError(f"experiment: {path.stem}: get_config() must set `name`")
  config.lock()
  apply_overrides(config, overrides)
  validate(config)
  return config, module


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parses an experiment argument such as 'bn,smoke' or 'smoke,steps=50' against `defaults`.

  A bare name sets a bool default to True; `key=value` parses the value as a Python literal and
  must match the default's type. An unknown name raises ValueError listing the known ones, so a
  typo in `:ARG` is an error, not a silently different run.

  Example: `parse_arg('bn,smoke', bn=False, smoke=False)` -> {bn: True, smoke: False -> True}.
  """
  out = ml_collections.ConfigDict(defaults)
  for item in (arg or "").split(","):
    item = item.strip()
    if not item:
      continue
    key, has_value, text = item.partition("=")
    if key not in defaults:
      raise ValueError(f"unknown arg {key!r}; expected some of {', '.join(defaults)} "
                       f"(comma-separated)")
    if not has_value:
      if not isinstance(defaults[key], bool):
        raise ValueError(f"arg {key!r} needs a value ({key}=...)")
      out[key] = True
      continue
    value = _parse_value(text)
    if type(value) is not type(defaults[key]) and not (isinstance(defaults[key], float) and
                                                          isinstance(value, int)):
      raise ValueError(f"arg {key}: expected {type(defaults[key]).__name__}, got {text!r}")
    out[key] = type(defaults[key])(value)
  return out
