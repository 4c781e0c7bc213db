"""Flax linen model families, built by name from a config.

The fields of a model class are its config schema: `build_model(model_cfg)` looks up
`model_cfg.name` in `MODELS` and returns `MODELS[name](**fields)`, fields = the section minus
`name`. Each key is a field name (one spelling, one default: the class field's); a key the model
does not have is a ValueError naming it. `dtype` / `param_dtype` may be given by name ('float32',
'bf16', ...) and sequences arrive as tuples (Flax fields must be hashable).

Every model is called as `model.apply(variables, x, train=..., rngs=..., mutable=...)` with
`train` explicit, and has a `dtype` (compute dtype) field the loop sets from the precision policy.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Callable

import flax.linen as nn

MODELS: dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str):
  """Registers a model under `name`: an `nn.Module` class (its fields are the config keys), a
  function of keyword fields, or a function `builder(model_cfg)` of the whole section."""

  def wrap(builder):
    MODELS[name] = builder
    return builder

  return wrap


def model_keys(builder) -> list[str] | None:
  """The config keys `builder` accepts besides 'name': a module's init fields, or a function's
  named parameters (plus `builder.model_class`'s fields when it forwards `**fields` to one).
  None for a function `builder(model_cfg)` that reads the whole section itself."""
  if isinstance(builder, type) and issubclass(builder, nn.Module):
    return [f.name for f in dataclasses.fields(builder)
            if f.init and f.name not in ("parent", "name")]
  params = list(inspect.signature(builder).parameters.values())
  if len(params) == 1 and params[0].kind == params[0].POSITIONAL_OR_KEYWORD and (
      params[0].default is params[0].empty):
    return None
  keys = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
  if any(p.kind == p.VAR_KEYWORD for p in params):
    keys += [k for k in model_keys(builder.model_class) if k not in keys]
  return keys


def model_config(name: str, **overrides):
  """The `model` section of model `name`: every field of its class at its default, so any field
  can be `--set`; `overrides` replace some (an unknown one is a ConfigError naming it).

  A field whose default is None becomes a typed placeholder; dtypes are written by name.
  """
  import ml_collections
  from ml_collections import config_dict

  from jaxdl.schema import ConfigError
  if name not in MODELS:
    raise ConfigError(f"model.name: unknown model {name!r}; expected one of {sorted(MODELS)}")
  builder = MODELS[name]
  cls = builder if isinstance(builder, type) else getattr(builder, "model_class", None)
  keys = model_keys(builder)
  if keys is None or cls is None:
    raise ConfigError(f"model.name: model {name!r} reads its section itself; write the section")
  unknown = sorted(set(overrides) - set(keys))
  if unknown:
    raise ConfigError(f"model.{unknown[0]}: unknown key for model {name!r}; expected one of "
                      f"{sorted(keys)}")
  fields = {f.name: f for f in dataclasses.fields(cls)}
  cfg = ml_collections.ConfigDict()
  cfg.name = name
  for key in keys:
    if key in overrides:
      value = overrides[key]
    elif key in fields and fields[key].default is not dataclasses.MISSING:
      value = fields[key].default
    else:
      value = inspect.signature(builder).parameters[key].default
    if key in ("dtype", "param_dtype") and value is not None and not isinstance(value, str):
      import numpy as np
      value = np.dtype(value).name
    if value is None:
      hint = fields[key].type if key in fields else None
      hint = hint if isinstance(hint, type) else str
      cfg[key] = config_dict.placeholder(hint)
    else:
      cfg[key] = value
  return cfg


def _field_value(key: str, value):
  from jaxdl.models.layers import to_dtype
  if key in ("dtype", "param_dtype") and value is not None:
    return to_dtype(value)
  if isinstance(value, list):
    return tuple(value)
  return value


def build_model(model_cfg) -> nn.Module:
  """`MODELS[model_cfg.name](**fields)`, fields = the section minus 'name' (see the docstring)."""
  name = model_cfg.name
  if name not in MODELS:
    raise ValueError(
        f"model.name: unknown model {name!r}; expected one of {sorted(MODELS)} (models of other "
        f"packages register when that package is imported, e.g. `import jaxdl.course.planted`)")
  builder = MODELS[name]
  keys = model_keys(builder)
  if keys is None:
    return builder(model_cfg)
  fields = {k: _field_value(k, v) for k, v in dict(model_cfg).items() if k != "name"}
  for k in fields:
    if k not in keys:
      raise ValueError(f"model.{k}: unknown key for model {name!r}; expected one of "
                       f"{sorted(keys)}")
  return builder(**fields)


# Importing the family modules fills the registry.
from jaxdl.models import attention, layers  # noqa: E402,F401
from jaxdl.models import mlp  # noqa: E402,F401
from jaxdl.models import gpt  # noqa: E402,F401
from jaxdl.models import cnn, denoiser, rnn, vit  # noqa: E402,F401
from jaxdl.models import gnn, seq2seq  # noqa: E402,F401
from jaxdl.models.cnn import conv_output_size, receptive_field  # noqa: E402,F401
from jaxdl.models.layers import count_params  # noqa: E402,F401
from jaxdl.models.gpt import gpt_config  # noqa: E402,F401
