"""Planted bugs for testing the doctor: a model and a task with one switch per known failure.

Registered names (importing this module registers them):
  model 'planted_mlp'               `PlantedMLP`, the MLP of `jaxdl.models.mlp` (Dense -> [norm] ->
                                    act blocks and a 'head'); its fields are its `model.*` keys
                                    (`jaxdl.models.model_config('planted_mlp')`), these all off by
                                    default:
      head_scale      float  last layer kernel multiplied by this at init (x100 bug)
      zero_init       bool   every kernel and bias starts at 0 (units of a layer stay identical)
      eval_batch_stats bool  norm='batch' normalizes with the batch statistics in eval too
                             (evaluation run in training mode)
      poison_row      int    row of the digits training split that marks a bad batch (-1 off)
      poison_scale    float  in training, logits x this for a batch holding the poison row
      inf_layer       int    hidden layer whose output becomes Inf on the poison row (-1 off);
                             the Inf comes from a module named 'planted_inf'
  task 'planted_shuffled_labels'    classification with each batch's labels rolled by one row,
                                    so inputs and targets are misaligned (in train and eval)

Shapes: B batch, D input features, H hidden width, K outputs, N training examples.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.models import model_config, register_model
from jaxdl.train import tasks

_ACTIVATIONS = {"relu": nn.relu, "gelu": nn.gelu, "tanh": jnp.tanh, "silu": nn.silu}


class BatchStatNorm(nn.Module):
  """BatchNorm (y = (h - mu) / sqrt(var + eps) * scale + bias) with a switch for the eval bug.

  Training: batch statistics, running averages updated with `momentum`. Eval: running averages,
  unless `eval_batch_stats`, when the batch statistics are used again (and nothing is updated).
  """
  momentum: float = 0.9
  eps: float = 1e-5
  eval_batch_stats: bool = False

  @nn.compact
  def __call__(self, h_BxH, *, train: bool):
    width = h_BxH.shape[-1]
    scale = self.param("scale", nn.initializers.ones, (width,))
    bias = self.param("bias", nn.initializers.zeros, (width,))
    ra_mean = self.variable("batch_stats", "mean", jnp.zeros, (width,))
    ra_var = self.variable("batch_stats", "var", jnp.ones, (width,))
    if train or self.eval_batch_stats:
      mean, var = h_BxH.mean(0), h_BxH.var(0)
      if train and not self.is_initializing():
        ra_mean.value = self.momentum * ra_mean.value + (1 - self.momentum) * mean
        ra_var.value = self.momentum * ra_var.value + (1 - self.momentum) * var
    else:
      mean, var = ra_mean.value, ra_var.value
    return (h_BxH - mean) * jax.lax.rsqrt(var + self.eps) * scale + bias


class PlantedInf(nn.Module):
  """Identity, except that the poison row's activations become +Inf."""

  @nn.compact
  def __call__(self, h_BxH, hit_B):
    return jnp.where(hit_B[:, None], jnp.inf, h_BxH)


class PlantedMLP(nn.Module):
  """The jaxdl MLP with switchable planted bugs (see the module docstring)."""
  hidden: Sequence[int] = (64, 64)
  out: int = 10
  activation: str = "relu"
  norm: str = "none"
  head_scale: float = 1.0
  zero_init: bool = False
  eval_batch_stats: bool = False
  poison_row: int = -1
  poison_scale: float = 1.0
  inf_layer: int = -1
  dtype: jnp.dtype = jnp.float32

  def __post_init__(self):
    if self.poison_row >= 0:
      digits_row(self.poison_row)  # a row outside the split is one line here, before any trace
    super().__post_init__()

  @nn.compact
  def __call__(self, x, *, train: bool):
    x_BxD = x.reshape(x.shape[0], -1).astype(self.dtype)
    hit_B = jnp.zeros(x_BxD.shape[:1], bool)
    if self.poison_row >= 0:
      # The poison row is found by exact value, so it follows its example through any shuffle.
      poison_D = jnp.asarray(digits_row(self.poison_row), self.dtype)
      hit_B = jnp.all(jnp.abs(x_BxD - poison_D) < 1e-6, axis=-1)
    kinit = nn.initializers.zeros if self.zero_init else nn.initializers.lecun_normal()
    act = _ACTIVATIONS[self.activation]
    for i, width in enumerate(self.hidden):
      h_BxH = nn.Dense(width, dtype=self.dtype, kernel_init=kinit, name=f"dense_{i}")(x_BxD)
      if i == self.inf_layer:
        h_BxH = PlantedInf(name="planted_inf")(h_BxH, hit_B)
      if self.norm == "batch":
        h_BxH = BatchStatNorm(eval_batch_stats=self.eval_batch_stats,
                              name=f"norm_{i}")(h_BxH, train=train)
      x_BxD = act(h_BxH)
    scale = self.head_scale

    def head_init(key, shape, dtype=jnp.float32):
      return scale * kinit(key, shape, dtype)

    logits_BxK = nn.Dense(self.out, dtype=self.dtype, kernel_init=head_init, name="head")(x_BxD)
    if train and self.poison_scale != 1.0:
      logits_BxK = logits_BxK * jnp.where(jnp.any(hit_B), self.poison_scale, 1.0)
    return logits_BxK.astype(jnp.float32)


def digits_row(index: int) -> np.ndarray:
  """Row `index` of the digits training split as the model sees it (pixels / 16, flattened)."""
  from jaxdl.data.sources import digits_split
  x_train = digits_split()[0]
  if not 0 <= index < len(x_train):
    raise ValueError(f"model.poison_row: {index} is outside the digits training split "
                     f"(0 .. {len(x_train) - 1})")
  return (x_train[index] / 16.0).astype(np.float32).reshape(-1)


def poison_row_at_step(config, step: int) -> int:
  """The digits training row that is first in the batch of 0-based step `step` (seeded order)."""
  from jaxdl import data as jdata
  ds = jdata.make_dataset(config)
  it = ds.train_iter()
  it.set_state({"step": step})
  x_D = np.asarray(next(it)["x"][0], np.float32).reshape(-1)
  from jaxdl.data.sources import digits_split
  all_NxD = (digits_split()[0] / 16.0).astype(np.float32).reshape(-1, x_D.size)
  (rows,) = np.nonzero(np.all(np.abs(all_NxD - x_D) < 1e-6, axis=1))
  return int(rows[0])


register_model("planted_mlp")(PlantedMLP)


@tasks.register_task("planted_shuffled_labels", tasks.Family.CLASSIFICATION)
def shuffled_labels(config, train_settings) -> tasks.Task:
  inner = tasks.TASKS["classification"](config, train_settings)

  def loss_fn(apply_fn, params, model_state, batch, rngs, train):
    # Rolling by one row pairs every input with another example's label: the data loader bug
    # where inputs and targets were shuffled separately.
    batch = {**batch, "y": jnp.roll(batch["y"], 1, axis=0)}
    return inner.loss_fn(apply_fn, params, model_state, batch, rngs, train)

  return tasks.Task(loss_fn, init_input=inner.init_input)


def digits_experiment(name: str, description: str, *, task: str = "classification",
                      steps: int = 300, smoke: bool = False, **model_overrides):
  """The base of the planted-bug experiments: a 64-64 MLP on 8x8 digits, Adam 1e-3, batch 32;
  `model_overrides` are `planted_mlp` fields, `smoke` the experiments' 20-step size.

  A healthy run reaches about 0.95 eval accuracy; each bug experiment changes one thing.
  """
  from jaxdl import config as jconfig
  from jaxdl.data import default_data_config
  from jaxdl.optim import default_optim_config
  c = jconfig.base_config()
  c.name = name
  c.description = description
  c.task = task
  c.data = default_data_config("digits")
  c.data.batch_size = 32
  c.model = model_config("planted_mlp", **model_overrides)
  c.optim = default_optim_config("adam", schedule="constant", warmup_frac=0.0)
  c.train.update(steps=steps, eval_every=100, log_every=10, ckpt_every=100)
  return jconfig.smoke(c) if smoke else c
