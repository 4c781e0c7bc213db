"""Experiment configs: load `experiments/<name>.py`, apply dotted overrides, validate.

An experiment is a Python file defining `get_config(arg=None) -> ml_collections.ConfigDict`.
It is named on the command line as a path (`experiments/moons_mlp.py`), a bare name
(`moons_mlp`), and optionally `:ARG` (`moons_mlp:smoke`, `moons_mlp:bn`), the argument passed to
`get_config`.

Overrides are `key.path=value` strings. The value is parsed as a Python literal when it is one
(`3e-3`, `500`, `True`, `(64, 64)`, `None`) and taken as a string otherwise. The config is locked:
an unknown key, or a value whose type does not match the field, raises `ConfigError` with a
one-line message naming the key, before anything is built or compiled.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import pathlib
import sys
import types
from typing import Any, Sequence

import ml_collections


class ConfigError(ValueError):
  """A bad experiment name, key or value; the message is one line naming it."""


def experiments_dir() -> pathlib.Path:
  """The directory searched for bare experiment names ($JAXDL_EXPERIMENTS overrides)."""
  env = os.environ.get("JAXDL_EXPERIMENTS")
  if env:
    return pathlib.Path(env)
  return pathlib.Path(__file__).resolve().parent.parent / "experiments"


def list_experiments() -> list[tuple[str, str]]:
  """Returns (name, one-line description) for every experiment file, sorted by name."""
  out = []
  for path in sorted(experiments_dir().glob("*.py")):
    if path.name.startswith("_"):
      continue
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    out.append((path.stem, doc.strip().splitlines()[0] if doc.strip() else ""))
  return out


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


def load_module(path: pathlib.Path) -> types.ModuleType:
  """Imports an experiment file as a module.

  The experiment's directory is on `sys.path` while it loads, so experiments can share setup
  from `_name.py` helpers next to them (files starting with `_` are not experiments).
  """
  spec = importlib.util.spec_from_file_location(f"jaxdl_experiment_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  folder = str(path.resolve().parent)
  sys.path.insert(0, folder)
  try:
    spec.loader.exec_module(module)
  finally:
    sys.path.remove(folder)
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
  if "name" not in config:
    raise ConfigError(f"experiment: {path.stem}: get_config() must set `name`")
  config.lock()
  apply_overrides(config, overrides)
  validate(config)
  return config, module


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
  """Applies `key.path=value` overrides in place; raises ConfigError naming the key."""
  for item in overrides:
    if "=" not in item:
      raise ConfigError(f"override: {item!r} is not of the form key.path=value")
    key, text = item.split("=", 1)
    key = key.strip()
    if key.startswith("config."):  # accept the `--config.x=` spelling too
      key = key[len("config."):]
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
    try:
      node[leaf] = value
    except TypeError:
      raise ConfigError(
          f"{key}: expected {getattr(expected, '__name__', expected)}, got {text!r}") from None


def _require(cond: bool, key: str, message: str) -> None:
  if not cond:
    raise ConfigError(f"{key}: {message}")


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks the engine's own keys (each sub-package validates its section when built)."""
  train = config.get("train")
  if train is None:
    return  # a custom-run experiment (e.g. an optimizer toy) owns its own keys
  _require(train.steps > 0, "train.steps", f"must be positive, got {train.steps}")
  for key in ("eval_every", "log_every", "ckpt_every"):
    if key in train:
      _require(train[key] >= 0, f"train.{key}", f"must be >= 0, got {train[key]}")
  if "keep_ckpts" in train:
    _require(train.keep_ckpts >= 1, "train.keep_ckpts", f"must be >= 1, got {train.keep_ckpts}")
  if "precision" in train:
    _require(train.precision in ("fp32", "bf16", "fp16"), "train.precision",
             f"expected one of fp32, bf16, fp16, got {train.precision!r}")
  if "best_mode" in train:
    _require(train.best_mode in ("min", "max"), "train.best_mode",
             f"expected 'min' or 'max', got {train.best_mode!r}")
  if "parallel" in config:
    _require(config.parallel.strategy in ("jit", "pmap", "fsdp"), "parallel.strategy",
             f"expected 'jit', 'pmap' or 'fsdp', got {config.parallel.strategy!r}")
    _require(config.parallel.get("devices", 0) >= 0, "parallel.devices",
             f"must be >= 0 (0 = all devices), got {config.parallel.get('devices')}")
  if "data" in config and "batch_size" in config.data:
    _require(config.data.batch_size > 0, "data.batch_size",
             f"must be positive, got {config.data.batch_size}")


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


def base_config() -> ml_collections.ConfigDict:
  """The engine's keys with their defaults; experiments start from this and fill in the rest."""
  c = ml_collections.ConfigDict()
  c.name = ""
  c.description = ""
  c.seed = 0
  c.task = "classification"
  c.train = ml_collections.ConfigDict(dict(
      steps=1000,
      eval_every=100,        # 0 disables periodic evaluation (the final step is always evaluated)
      log_every=10,
      ckpt_every=100,        # 0: only the final checkpoint
      keep_ckpts=3,
      best_metric="",        # e.g. 'eval/accuracy'; '' keeps only the latest checkpoints
      best_mode="max",
      patience=0,            # early stopping after this many evals without improvement; 0 = off
      precision="fp32",
      label_smoothing=0.0,
      async_checkpoint=True,
      plot=True,
      # Spike guard: on loss (or grad norm) > spike_factor x the rolling median of the last
      # spike_window steps, rewind to the last checkpoint and skip the offending batch.
      doctor=False,           # run `jaxdl doctor`'s preflight before training; stop if it fails
      spike_guard=False,
      spike_factor=5.0,
      spike_window=20,
      spike_watch="loss",     # loss | grad_norm | either
      max_rewinds=3,
  ))
  # devices: how many devices to use (0 = all); the global batch is split across them.
  # fsdp: size of the fsdp mesh axis under strategy 'fsdp' (0 = all devices; jaxdl.train.fsdp).
  c.parallel = ml_collections.ConfigDict(dict(strategy="jit", devices=0, fsdp=0))
  return c
