"""Planted bugs for testing the doctor: a model and a task with one switch per known failure.

Registered names (importing this module registers them):
  model 'planted_mlp'               the MLP of `jaxdl.models.mlp` (Dense -> [norm] -> act blocks
                                    and a 'head'), plus these `model.*` keys, all off by default:
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

from jaxdl.models import register_model
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
  poison_D: tuple | None = None
  poison_scale: float = 1.0
  inf_layer: int = -1
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x, *, train: bool):
    x_BxD = x.reshape(x.shape[0], -1).astype(self.dtype)
    hit_B = jnp.zeros(x_BxD.shape[:1], bool)
    if self.poison_D is not None:
      # The poison row is found by exact value, so it follows its example through any shuffle.
      poison_D = jnp.asarray(self.poison_D, self.dtype)
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


@register_model("planted_mlp")
def build_planted_mlp(cfg) -> PlantedMLP:
  row = int(cfg.get("poison_row", -1))
  poison = tuple(float(v) for v in digits_row(row)) if row >= 0 else None
  return PlantedMLP(hidden=tuple(cfg.hidden), out=cfg.out, activation=cfg.get("activation", "relu"),
                    norm=cfg.get("norm", "none"), head_scale=float(cfg.get("head_scale", 1.0)),
                    zero_init=bool(cfg.get("zero_init", False)),
                    eval_batch_stats=bool(cfg.get("eval_batch_stats", False)),
                    poison_D=poison, poison_scale=float(cfg.get("poison_scale", 1.0)),
                    inf_layer=int(cfg.get("inf_layer", -1)))


def planted_model_config(**overrides) -> dict:
  """Every 'planted_mlp' key with its healthy default (a 64-64 ReLU MLP for 10 classes)."""
  cfg = dict(name="planted_mlp", hidden=(64, 64), out=10, activation="relu", norm="none",
             head_scale=1.0, zero_init=False, eval_batch_stats=False, poison_row=-1,
             poison_scale=1.0, inf_layer=-1)
  unknown = sorted(set(overrides) - set(cfg))
  if unknown:
    raise ValueError(f"model.{unknown[0]}: not a planted_mlp key; expected one of {sorted(cfg)}")
  cfg.update(overrides)
  return cfg


@tasks.register_task("planted_shuffled_labels")
def shuffled_labels(config) -> tasks.Task:
  inner = tasks.TASKS["classification"](config)

  def loss_fn(apply_fn, params, model_state, batch, rngs, train):
    # Rolling by one row pairs every input with another example's label: the data loader bug
    # where inputs and targets were shuffled separately.
    batch = {**batch, "y": jnp.roll(batch["y"], 1, axis=0)}
    return inner.loss_fn(apply_fn, params, model_state, batch, rngs, train)

  return tasks.Task(loss_fn, init_input=inner.init_input, kind=inner.kind)


def digits_experiment(name: str, description: str, *, task: str = "classification",
                      steps: int = 300, **model_overrides):
  """The base of the planted-bug experiments: a 64-64 MLP on 8x8 digits, Adam 1e-3, batch 32.

  A healthy run reaches about 0.95 eval accuracy; each bug experiment changes one thing.
  """
  from jaxdl.config import base_config
  from jaxdl.data import default_data_config
  from jaxdl.optim import default_optim_config
  c = base_config()
  c.name = name
  c.description = description
  c.task = task
  c.data = default_data_config("digits")
  c.data.batch_size = 32
  c.model = planted_model_config(**model_overrides)
  c.optim = default_optim_config()
  c.optim.name = "adam"
  c.optim.lr = 1e-3
  c.optim.weight_decay = 0.0
  c.optim.schedule.name = "constant"
  c.optim.schedule.warmup_frac = 0.0
  c.train.steps = steps
  c.train.eval_every = 100
  c.train.log_every = 10
  c.train.ckpt_every = 100
  return c
