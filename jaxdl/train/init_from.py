"""`init_from`: a fresh run's parameters taken from a trained base (fine-tuning).

The config's top-level `init_from` (default '': off) names

  a jaxdl workdir        its latest checkpoint's params (`jaxdl.train.checkpoint.load_state`);
                         a LoRA run's adapters folded into its base first (`lora.merge`:
                         W' = W + (alpha / r) A B), so a fine-tuned run can be a base in turn
  a Hugging Face folder  config.json + safetensors (`jaxdl.models.hf.load_hf`; the run's model
                         section must describe the same architecture: `model_section_of_hf`)

Only a fresh start reads it: a run resuming its own checkpoint continues from that. Every
parameter of the run's model that is not a LoRA adapter (`jaxdl.models.lora.is_adapter`) is
replaced by the base's leaf at the same path, which must exist with the same shape; adapters keep
their fresh initialization (B = 0, so step 0 computes the base model exactly), and the optimizer
state is initialized again from the new parameters (a parameter average starts at the base). A
missing path, a shape that differs, or base parameters the model has no place for are one-line
ValueErrors naming `init_from`.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np

from jaxdl.config import parse_root
from jaxdl.models import lora
from jaxdl.schema import ConfigError

KEY = "init_from"


def check(config) -> None:
  """A one-line ValueError, before anything is built, when `init_from` names nothing usable."""
  path = parse_root(config).init_from
  full = os.path.expanduser(path)
  if path and not (os.path.isdir(os.path.join(full, "checkpoints")) or
                   os.path.isfile(os.path.join(full, "config.json"))):
    raise ConfigError(f"{KEY}: {path!r} is neither a jaxdl workdir (with checkpoints/) nor a "
                     "Hugging Face model folder (with config.json); train the base there first "
                     f"(e.g. `jaxdl train bpe_gpt --workdir {path}`)")


def base_params(path: str) -> dict:
  """The params tree of the base at `path` (module docstring), as host arrays."""
  full = os.path.expanduser(path)
  if os.path.isdir(os.path.join(full, "checkpoints")):
    from jaxdl.train.checkpoint import load_state  # pylint: disable=g-import-not-at-top
    try:
      _, state = load_state(full)
    except FileNotFoundError as e:
      raise ConfigError(f"{KEY}: {path!r} has no checkpoint yet ({e})") from None
    params = jax.device_get(state["params"])
    if lora.split(params)[0]:  # a LoRA run: its adapters folded into the weights they adapt
      import ml_collections  # pylint: disable=g-import-not-at-top
      from jaxdl.models import build_model  # pylint: disable=g-import-not-at-top
      with open(os.path.join(full, "config.json")) as f:
        config = ml_collections.ConfigDict(json.load(f))
      _, params = lora.merge(build_model(config.model), jax.tree.map(jax.numpy.asarray, params))
    return jax.device_get(params)
  if os.path.isfile(os.path.join(full, "config.json")):
    from jaxdl.models import hf  # pylint: disable=g-import-not-at-top
    _, params = hf.load_hf(full)
    return jax.device_get(params)
  raise ConfigError(f"{KEY}: {path!r} is neither a jaxdl workdir (with checkpoints/) nor a "
                   "Hugging Face model folder (with config.json)")


def merge_base(fresh, base, path: str):
  """`fresh` (the run's initial params) with every non-adapter leaf taken from `base`."""
  flat_base = {lora.path_str(p): x for p, x in jax.tree_util.tree_leaves_with_path(base)}
  used = set()

  def take(p, x):
    name = lora.path_str(p)
    if lora.is_adapter(name):
      return x
    if name not in flat_base:
      raise ConfigError(f"{KEY}: {path!r} has no parameter {name!r} (shape {tuple(x.shape)}); "
                       "the model section must describe the base's architecture")
    b = flat_base[name]
    if tuple(b.shape) != tuple(x.shape):
      raise ConfigError(f"{KEY}: {path!r}'s {name!r} has shape {tuple(b.shape)}, the model's "
                       f"{tuple(x.shape)}; the model section must describe the base's "
                       "architecture")
    used.add(name)
    return np.asarray(b).astype(x.dtype)

  out = jax.tree_util.tree_map_with_path(take, fresh)
  extra = sorted(set(flat_base) - used)
  if extra:
    raise ConfigError(f"{KEY}: {path!r} has parameters this model has no place for ("
                     f"{', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}); merge a LoRA "
                     "base's adapters first, or describe the base's architecture")
  return out


def apply(state, tx, path: str):
  """`state` (a fresh TrainState, placed where it lives) with the base's params and the
  optimizer state initialized from them, each leaf keeping its sharding."""
  params = merge_base(jax.device_get(state.params), base_params(path), path)
  params = jax.tree.map(lambda a, x: jax.device_put(a, x.sharding), params, state.params)
  shardings = jax.tree.map(lambda x: x.sharding, state.opt_state)
  opt_state = jax.jit(tx.init, out_shardings=shardings)(params)
  return dataclasses.replace(state, params=params, opt_state=opt_state)


def model_section_of_hf(path: str) -> dict:
  """The `model` section (name 'gpt' and its plain-valued fields) describing the Hugging Face
  model at `path`, for a run that fine-tunes it with `init_from=path`."""
  from jaxdl.models import hf  # pylint: disable=g-import-not-at-top
  model, _ = hf.load_hf(os.path.expanduser(path))
  section = {"name": "gpt"}
  for f in dataclasses.fields(model):
    value = getattr(model, f.name)
    if f.name not in ("parent", "name") and (value is None or isinstance(
        value, (bool, int, float, str, tuple))):
      section[f.name] = value
  return section
