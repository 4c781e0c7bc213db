"""Flax linen model families, built by name from a config.

`build_model(model_cfg)` looks up `model_cfg.name` in `MODELS`; each family module registers its
builder with `@register_model(name)`. Every model is called as
`model.apply(variables, x, train=..., rngs=..., mutable=...)` with `train` explicit.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn

MODELS: dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str):
  """Registers `builder(model_cfg) -> nn.Module` under `name`."""

  def wrap(builder):
    MODELS[name] = builder
    return builder

  return wrap


def build_model(model_cfg) -> nn.Module:
  """Builds the model named by `model_cfg.name`."""
  name = model_cfg.name
  if name not in MODELS:
    import jaxdl.course.planted  # noqa: F401 -- registers the planted-bug models
  if name not in MODELS:
    raise ValueError(
        f"model.name: unknown model {name!r}; expected one of {sorted(MODELS)}")
  return MODELS[name](model_cfg)


# Importing the family modules fills the registry.
from jaxdl.models import attention, layers  # noqa: E402,F401
from jaxdl.models import mlp  # noqa: E402,F401
from jaxdl.models import gpt  # noqa: E402,F401
from jaxdl.models import cnn, denoiser, rnn, vit  # noqa: E402,F401
from jaxdl.models.cnn import conv_output_size, receptive_field  # noqa: E402,F401
from jaxdl.models.layers import count_params  # noqa: E402,F401
from jaxdl.models.gpt import gpt_config  # noqa: E402,F401
