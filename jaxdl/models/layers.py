"""Building blocks shared by the model families: the `Model` base class (fields as declared
settings), initializers, activations and norms by name (attention lives in
`jaxdl.models.attention`).

Initializers (`get_initializer`), all `jax.nn.initializers` variance scalings; biases start at 0:
  xavier / glorot   Var(W) = 2 / (n_in + n_out)   (uniform or normal)
  he / kaiming      Var(W) = 2 / n_in
  lecun             Var(W) = 1 / n_in
  gpt2              std 0.02; residual output projections std 0.02 / sqrt(N), N residual layers
  zeros             every unit the same: kept to show the symmetry failure
"""

from __future__ import annotations

import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxdl import schema

Dtype = Any


class Model(nn.Module):
  """A model family: its fields are the `model` section's keys, each declared once with
  `schema.setting(default, check)`. Built (by `build_model` or directly), it checks every field
  (`schema.check_fields`) and then `check`'s rules between fields, so a bad value fails before
  any tracing in one line naming `model.<key>`."""

  def __post_init__(self):
    schema.check_fields(self, "model.")
    self.check()
    super().__post_init__()

  def check(self) -> None:
    """Rules between fields (e.g. a width divisible by the heads): `schema.fail('model.', key,
    message)` raises the one-line ConfigError."""


# ---------------------------------------------------------------------------------------------
# Initializers and activations by name.

_INIT = jax.nn.initializers
INITIALIZERS: dict[str, Callable[[], Callable]] = {
    "xavier_uniform": lambda: _INIT.variance_scaling(1.0, "fan_avg", "uniform"),
    "xavier_normal": lambda: _INIT.variance_scaling(1.0, "fan_avg", "normal"),
    "he_normal": lambda: _INIT.variance_scaling(2.0, "fan_in", "normal"),
    "he_uniform": lambda: _INIT.variance_scaling(2.0, "fan_in", "uniform"),
    "lecun_normal": lambda: _INIT.variance_scaling(1.0, "fan_in", "normal"),
    "lecun_uniform": lambda: _INIT.variance_scaling(1.0, "fan_in", "uniform"),
    "gpt2": lambda: _INIT.normal(0.02),
    "zeros": lambda: _INIT.zeros,
}
_INIT_ALIASES = {"xavier": "xavier_uniform", "glorot": "xavier_uniform",
                 "glorot_uniform": "xavier_uniform", "glorot_normal": "xavier_normal",
                 "he": "he_normal", "kaiming": "he_normal", "kaiming_normal": "he_normal",
                 "kaiming_uniform": "he_uniform", "lecun": "lecun_normal",
                 "default": "lecun_normal"}
INIT_NAMES = sorted(INITIALIZERS) + sorted(_INIT_ALIASES)


def get_initializer(name: str) -> Callable:
  """Kernel initializer by name (see the module docstring for the variances)."""
  key = _INIT_ALIASES.get(name, name)
  if key not in INITIALIZERS:
    raise ValueError(f"init: unknown initializer {name!r}; expected one of {INIT_NAMES}")
  return INITIALIZERS[key]()


def residual_out_init(name: str, num_residual_layers: int) -> Callable:
  """Init of the output projection closing a residual branch.

  With 'gpt2' the std is 0.02 / sqrt(N), N = number of residual layers (two per transformer
  block: attention and MLP), so the residual stream's variance does not grow with depth.
  Other names are returned unchanged.
  """
  if _INIT_ALIASES.get(name, name) == "gpt2":
    return _INIT.normal(0.02 / math.sqrt(num_residual_layers))
  return get_initializer(name)


ACTIVATIONS: dict[str, Callable] = {
    "relu": nn.relu, "gelu": nn.gelu, "gelu_exact": lambda x: nn.gelu(x, approximate=False),
    "tanh": jnp.tanh, "silu": nn.silu, "sigmoid": nn.sigmoid, "identity": lambda x: x,
}


def get_activation(name: str) -> Callable:
  if name not in ACTIVATIONS:
    raise ValueError(f"activation: unknown {name!r}; expected one of {sorted(ACTIVATIONS)}")
  return ACTIVATIONS[name]


def to_dtype(name_or_dtype) -> jnp.dtype:
  """'float32' | 'bfloat16' | 'float16' | a dtype -> a jnp dtype."""
  if isinstance(name_or_dtype, str):
    table = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
    name_or_dtype = table.get(name_or_dtype, name_or_dtype)
    if name_or_dtype not in ("float32", "bfloat16", "float16", "float64"):
      raise ValueError(f"dtype: unknown {name_or_dtype!r}; expected float32/bfloat16/float16")
  return jnp.dtype(name_or_dtype)


def count_params(params) -> int:
  """Total number of scalars in a params pytree."""
  return int(sum(x.size for x in jax.tree.leaves(params)))


# ---------------------------------------------------------------------------------------------
# Norms by name.

NORM_NAMES = ("none", "batch", "layer", "rms", "rms1p", "group")


class RMSNorm(nn.Module):
  """y = gamma * x / sqrt(mean(x^2) + eps) over the last axis: no mean, no beta. With
  `plus_one` (norm 'rms1p', Gemma's) the stored scale w is zero-centred: gamma = 1 + w, w
  initialised at 0, computed in fp32 (as transformers' GemmaRMSNorm: (1 + w.float()))."""

  epsilon: float = 1e-6
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  plus_one: bool = False

  @nn.compact
  def __call__(self, x):
    init = nn.initializers.zeros if self.plus_one else nn.initializers.ones
    scale = self.param("scale", init, (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)  # the mean of squares in fp32 even under bf16
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.epsilon)
    gamma = scale.astype(jnp.float32) + 1.0 if self.plus_one else scale.astype(jnp.float32)
    return (y * gamma).astype(self.dtype)


def batch_stats_guard(bn: Callable) -> Callable:
  """`bn` in training mode, refusing an input with one value per feature (a batch of 1 without
  spatial axes): there mean = x and var = 0, so (x - mean) / sqrt(var + eps) = 0 and the layer
  outputs its bias beta whatever the input. (Under pmap, `axis_name` pools the statistics over
  devices, so a per-device batch of 1 is fine there and the guard is not applied.)"""

  def guarded(x):
    if x.size == x.shape[-1]:
      raise ValueError(f"model.norm: BatchNorm in training mode over a batch of {x.shape[0]} "
                       f"(input {x.shape}: one value per feature) normalizes every input to 0; "
                       "use data.batch_size >= 2 per device, or norm 'layer' / 'group'")
    return bn(x)

  return guarded


def make_norm(kind: str, *, train: bool, name: str | None = None, dtype: Dtype = jnp.float32,
              param_dtype: Dtype = jnp.float32, momentum: float = 0.9, epsilon: float = 1e-5,
              num_groups: int = 8, axis_name: str | None = None) -> Callable:
  """A norm layer by name; call inside a compact method. 'none' gives the identity; 'rms1p' is
  RMSNorm scaled by (1 + w) (`RMSNorm.plus_one`).

  'batch': batch statistics when `train`, running averages otherwise; running average
  r <- momentum r + (1 - momentum) batch (0.9 here is PyTorch's momentum 0.1). With `axis_name`
  (the model's `bn_axis_name`, set to 'batch' by the pmap strategy) the statistics are averaged
  across devices. Training statistics over one value per feature are refused (`batch_stats_guard`).
  """
  if kind == "none":
    return lambda x: x
  if kind == "batch":
    bn = nn.BatchNorm(use_running_average=not train, momentum=momentum, epsilon=epsilon,
                      axis_name=axis_name, dtype=dtype, param_dtype=param_dtype, name=name)
    return bn if not train or axis_name is not None else batch_stats_guard(bn)
  if kind == "layer":
    return nn.LayerNorm(epsilon=epsilon, dtype=dtype, param_dtype=param_dtype, name=name)
  if kind in ("rms", "rms1p"):
    return RMSNorm(epsilon=epsilon, dtype=dtype, param_dtype=param_dtype, name=name,
                   plus_one=kind == "rms1p")
  if kind == "group":
    return nn.GroupNorm(num_groups=num_groups, epsilon=epsilon, dtype=dtype,
                        param_dtype=param_dtype, name=name)
  raise ValueError(f"norm: unknown {kind!r}; expected one of {list(NORM_NAMES)}")
