"""Flax linen model families, built by name from a config.

The fields of a model class are its config schema, each declared once with
`jaxdl.schema.setting(default, check)` on a `layers.Model` subclass, which checks them when built:

  class GNN(layers.Model):
    hidden: int = setting(16, POSITIVE)
    readout: str = setting("none", one_of("none", "sum", "mean"))

`MODELS` is a `schema.Registry` of model classes (or builder functions whose parameters are keys
besides the class's fields, like GPT's `preset`), so the `model` section goes the one settings
path: `model_config(name)` is `schema.default_section(MODELS, name)` and `build_model(model_cfg)`
is `schema.parse_section(model_cfg, MODELS)`, which builds `MODELS[name](**fields)`, each field
type-checked against its annotation (`schema.coerce`: an int is accepted for a float, lists
become tuples since Flax fields must be hashable). A key the model does not have, or a value of
the wrong type, is a ConfigError naming `model.<key>`. `dtype` / `param_dtype` may be given by
name ('float32', 'bf16', ...), and are written by name.

Every model is called as `model.apply(variables, x, train=..., rngs=..., mutable=...)` with
`train` explicit, and has a `dtype` (compute dtype) field the loop sets from the precision policy.
"""

from __future__ import annotations

import flax.linen as nn
import numpy as np

from jaxdl import schema
from jaxdl.schema import ConfigError

MODELS = schema.Registry("model.", "model")
DTYPE_KEYS = ("dtype", "param_dtype")


def register_model(name: str):
  """Registers a model under `name`: an `nn.Module` class (its fields are the config keys), or a
  function of keyword fields (`builder.model_class`: the class its `**fields` go to)."""

  def wrap(builder):
    MODELS[name] = builder
    return builder

  return wrap


def model_config(name: str, **overrides):
  """The `model` section of model `name`: every field of its class at its default, so any field
  can be `--set`; `overrides` replace some (an unknown one is a ConfigError naming it).

  A field whose default is None becomes a typed placeholder; dtypes are written by name.
  """
  builder = MODELS.get(name)
  if builder is not None:
    overrides = {**{k: v for k, v in schema.defaults(builder).items() if k in DTYPE_KEYS},
                 **overrides}
  overrides = {k: np.dtype(v).name if k in DTYPE_KEYS and not isinstance(v, (str, type(None)))
               else v for k, v in overrides.items()}
  return schema.default_section(MODELS, name, **overrides)


def build_model(model_cfg) -> nn.Module:
  """`MODELS[model_cfg.name](**fields)`, fields = the section minus 'name', by
  `schema.parse_section` (see the docstring)."""
  from jaxdl.models.layers import to_dtype
  given = schema.plain(model_cfg)
  if given.get("name") not in MODELS:
    raise ConfigError(
        f"model.name: unknown model {given.get('name')!r}; expected one of {sorted(MODELS)} "
        "(models of other packages register when that package is imported, e.g. "
        "`import jaxdl.course.planted`)")
  for key in DTYPE_KEYS:
    if given.get(key) is not None:
      try:
        given[key] = to_dtype(given[key])
      except (TypeError, ValueError):
        raise ConfigError(f"model.{key}: unknown dtype {given[key]!r}; expected float32, "
                          "bfloat16 or float16 (or fp32, bf16, fp16)") from None
  return schema.parse_section(given, MODELS)


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
