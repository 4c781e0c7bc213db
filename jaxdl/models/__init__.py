"""Flax linen model families, built by name from a config.

The fields of a model class are its config schema, each declared once with
`jaxdl.schema.setting(default, check)` on a `layers.Model` subclass, which checks them when built:

  class GNN(layers.Model):
    hidden: int = setting(16, POSITIVE)
    readout: str = setting("none", one_of("none", "sum", "mean"))

`build_model(model_cfg)` looks up `model_cfg.name` in `MODELS` and returns
`MODELS[name](**fields)`, fields = the section minus `name`, each type-checked against its
annotation (`schema.coerce`: an int is accepted for a float, lists become tuples since Flax fields
must be hashable). A key the model does not have, or a value of the wrong type, is a ConfigError
naming `model.<key>`. `dtype` / `param_dtype` may be given by name ('float32', 'bf16', ...).

Every model is called as `model.apply(variables, x, train=..., rngs=..., mutable=...)` with
`train` explicit, and has a `dtype` (compute dtype) field the loop sets from the precision policy.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Callable

import flax.linen as nn
import numpy as np

from jaxdl import schema
from jaxdl.schema import ConfigError

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
  annotations = _key_hints(builder)
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
      value = np.dtype(value).name
    if value is None:
      hint = schema.config_type(annotations[key]) if key in annotations else str
      cfg[key] = config_dict.placeholder(hint if isinstance(hint, type) else str)
    else:
      cfg[key] = value
  return cfg


def _key_hints(builder) -> dict:
  """Key -> annotation of the keys `builder` accepts: its class's fields, a function's named
  parameters (an annotation that does not resolve is left out: such a key is not type-checked)."""
  cls = builder if isinstance(builder, type) else getattr(builder, "model_class", None)
  out = dict(schema.hints(cls)) if cls is not None else {}
  if not isinstance(builder, type):
    try:
      out.update({k: v for k, v in typing.get_type_hints(builder).items() if k != "return"})
    except (NameError, TypeError):
      pass
  return out


def _field_value(key: str, value, hint):
  """`value` as the field's type (`schema.coerce`); a dtype by name as a dtype."""
  from jaxdl.models.layers import to_dtype
  if isinstance(value, np.generic):
    value = value.item()  # a numpy scalar, e.g. a size read from a dataset's info
  if key in ("dtype", "param_dtype") and value is not None:
    try:
      return to_dtype(value)
    except (TypeError, ValueError):
      raise ConfigError(f"model.{key}: unknown dtype {value!r}; expected float32, bfloat16 or "
                        "float16 (or fp32, bf16, fp16)") from None
  if hint is None:
    return tuple(value) if isinstance(value, list) else value
  return schema.coerce(f"model.{key}", value, hint)


def build_model(model_cfg) -> nn.Module:
  """`MODELS[model_cfg.name](**fields)`, fields = the section minus 'name' (see the docstring)."""
  name = model_cfg.name
  if name not in MODELS:
    raise ConfigError(
        f"model.name: unknown model {name!r}; expected one of {sorted(MODELS)} (models of other "
        f"packages register when that package is imported, e.g. `import jaxdl.course.planted`)")
  builder = MODELS[name]
  keys = model_keys(builder)
  if keys is None:
    return builder(model_cfg)
  given = {k: v for k, v in dict(model_cfg).items() if k != "name"}
  for k in given:
    if k not in keys:
      raise ConfigError(f"model.{k}: unknown key for model {name!r}; expected one of "
                        f"{sorted(keys)}")
  hints = _key_hints(builder)
  return builder(**{k: _field_value(k, v, hints.get(k)) for k, v in given.items()})


# Importing the family modules fills the registry.
from jaxdl.models import attention, layers  # noqa: E402,F401
from jaxdl.models import mlp  # noqa: E402,F401
from jaxdl.models import gpt  # noqa: E402,F401
from jaxdl.models import cnn, denoiser, rnn, vit  # noqa: E402,F401
from jaxdl.models import dit  # noqa: E402,F401
from jaxdl.models import gnn, seq2seq  # noqa: E402,F401
from jaxdl.models.cnn import conv_output_size, receptive_field  # noqa: E402,F401
from jaxdl.models.layers import count_params  # noqa: E402,F401
from jaxdl.models.gpt import gpt_config  # noqa: E402,F401
