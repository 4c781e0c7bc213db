"""Datasets for jaxdl: embedded (no download) and user files, fed through grain.

    ds = make_dataset(config)            # reads config.data.* and config.seed
    ds.info                              # kind, num_classes, vocab_size, input_shape, num_train,
                                         # num_eval (+ name, steps_per_epoch)
    it = ds.train_iter(process_index, process_count)   # infinite; this process's rows of each
                                                       # global batch
    it.get_state() / it.set_state(state)               # small JSON dict; exact resume
    for batch in ds.eval_batches(): ...                # fixed order, padded, batch['mask']

Batches are dicts of numpy arrays: supervised {'x', 'y'} ('binary' y float32 0/1, 'classification'
y int32), language modelling {'x', 'y'} int32 (B, T) with y the next byte, generative {'x'} (+ 'y'
when labelled). The stream and its sharding rule are described in `jaxdl.data.pipeline`; the
datasets in `jaxdl.data.sources`. Experiments start from `default_data_config(name)`, which lists
every key the dataset reads, so command-line overrides are type-checked by the locked config.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from jaxdl.data.pipeline import Dataset, EvalBatches, TrainIterator
from jaxdl.data.sources import BUILDERS, KINDS, TOY2D, decode, sample_toy2d

__all__ = ["make_dataset", "default_data_config", "sample_toy2d", "decode", "Dataset",
           "TrainIterator", "EvalBatches", "DATASETS"]

DATASETS = tuple(BUILDERS)

_COMMON = {"name": "", "batch_size": 128, "eval_batch_size": None, "shuffle": True}
_LM = {"context_length": 128, "val_frac": 0.1, "max_eval_windows": 512, "batch_size": 32,
       "eval_batch_size": 64}
# Every key each dataset reads, with its default. None marks an optional int (placeholder).
_DEFAULTS: dict[str, dict[str, Any]] = {
    "moons": {"n": 1000, "n_eval": None, "noise": 0.25, "data_seed": 42, "batch_size": 1000},
    "digits": {"scale": "unit"},
    "toy2d": {"distribution": "moons", "n": 10_000, "n_eval": None, "data_seed": 0,
              "batch_size": 256},
    "text": {**_LM, "max_bytes": 2_000_000},
    "textfile": {**_LM, "path": ""},
    "npz": {"path": "", "kind": "classification", "eval_frac": 0.1, "data_seed": 0},
}
_OPTIONAL_INTS = ("n_eval", "eval_batch_size")
_CHOICES = {"scale": ("unit", "symmetric"), "distribution": TOY2D, "kind": KINDS}


def _defaults(name: str) -> dict[str, Any]:
  if name not in _DEFAULTS:
    raise ValueError(f"data.name: unknown dataset {name!r}; expected one of "
                     f"{', '.join(DATASETS)}")
  return {**_COMMON, **_DEFAULTS[name], "name": name}


def default_data_config(name: str) -> ml_collections.ConfigDict:
  """A ConfigDict with every key dataset `name` reads, at its default value."""
  cfg = ml_collections.ConfigDict()
  for k, v in _defaults(name).items():
    cfg[k] = ml_collections.config_dict.placeholder(int) if v is None else v
  return cfg


def _check_type(key: str, value, default):
  if value is None:
    if key in _OPTIONAL_INTS:
      return
    raise ValueError(f"data.{key}: must be set (expected {type(default).__name__})")
  expected = int if key in _OPTIONAL_INTS else type(default)
  ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
  if expected is float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  if not ok:
    raise ValueError(f"data.{key}: expected {expected.__name__}, got {value!r}")


def _check_values(cfg: dict[str, Any]):
  for key, choices in _CHOICES.items():
    if key in cfg and cfg[key] not in choices:
      raise ValueError(f"data.{key}: {cfg[key]!r} is not one of {', '.join(choices)}")
  for key in ("batch_size", "n", "n_eval", "eval_batch_size", "context_length", "max_bytes"):
    if cfg.get(key) is not None and cfg[key] < 1:
      raise ValueError(f"data.{key}: must be positive, got {cfg[key]}")
  for key in ("noise", "max_eval_windows"):
    if cfg.get(key) is not None and cfg[key] < 0:
      raise ValueError(f"data.{key}: must be >= 0, got {cfg[key]}")
  for key in ("val_frac", "eval_frac"):
    if key in cfg and not 0.0 < cfg[key] < 1.0:
      raise ValueError(f"data.{key}: must be in (0, 1), got {cfg[key]}")


def data_settings(config) -> dict[str, Any]:
  """config.data as a plain dict with defaults filled in, every key and value checked."""
  data = config.data
  data = data.to_dict() if hasattr(data, "to_dict") else dict(data)
  if not data.get("name"):
    raise ValueError(f"data.name: must be set; expected one of {', '.join(DATASETS)}")
  defaults = _defaults(data["name"])
  unknown = sorted(set(data) - set(defaults))
  if unknown:
    raise ValueError(f"data.{unknown[0]}: unknown key for dataset {data['name']!r}; expected "
                     f"one of {', '.join(sorted(defaults))}")
  cfg = {**defaults, **data}
  for k, v in cfg.items():
    _check_type(k, v, defaults[k])
  _check_values(cfg)
  return cfg


def make_dataset(config) -> Dataset:
  """Builds `config.data.name` with `config.data.*`; training order is seeded by `config.seed`."""
  cfg = data_settings(config)
  seed = config.get("seed", 0) if hasattr(config, "get") else 0
  if not isinstance(seed, int) or isinstance(seed, bool):
    raise ValueError(f"seed: expected int, got {seed!r}")
  source = BUILDERS[cfg["name"]](cfg)
  num_train = source.train.num
  if cfg["batch_size"] > num_train:
    raise ValueError(f"data.batch_size: {cfg['batch_size']} is larger than the training set "
                     f"({num_train} examples of dataset {cfg['name']!r})")
  return Dataset(source, batch_size=cfg["batch_size"], eval_batch_size=cfg["eval_batch_size"],
                 seed=seed, shuffle=cfg["shuffle"], name=cfg["name"])
