"""The losses the tasks are built from, per example or per token, in float32 (`jaxdl.train.tasks`
composes them into each task's loss; `jaxdl.train.scoring` sums `next_token_ce` to score text).

Shapes: B batch rows, T positions, K classes, V vocabulary.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax


def masked_mean(values_B: jax.Array, batch: dict) -> jax.Array:
  """Mean over the batch, weighted by `batch['mask']` when present."""
  values_B = values_B.astype(jnp.float32)
  mask = batch.get("mask")
  if mask is None:
    return values_B.mean()
  mask_B = mask.astype(jnp.float32)
  return (values_B * mask_B).sum() / jnp.maximum(mask_B.sum(), 1.0)


def weighted_ce(logits_BxTxK: jax.Array, y_BxT: jax.Array, weight_BxT: jax.Array,
                batch: dict) -> tuple[jax.Array, jax.Array]:
  """(CE, accuracy) averaged over the positions weighted by `weight_BxT` (the scored tokens or
  labelled nodes), padded eval rows (`batch['mask']`) scoring nothing."""
  weight_BxT = weight_BxT.astype(jnp.float32)
  if "mask" in batch:
    weight_BxT = weight_BxT * batch["mask"].astype(jnp.float32)[:, None]
  total = jnp.maximum(weight_BxT.sum(), 1.0)
  logits_BxTxK = logits_BxTxK.astype(jnp.float32)
  ce_BxT = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxK, y_BxT)
  correct_BxT = (jnp.argmax(logits_BxTxK, -1) == y_BxT).astype(jnp.float32)
  return (ce_BxT * weight_BxT).sum() / total, (correct_BxT * weight_BxT).sum() / total


def next_token_ce(logits_BxTxV: jax.Array, y_BxT: jax.Array) -> jax.Array:
  """CE_bt = -log softmax(z_bt)_{y_bt} in float32, the `lm` loss per target token (also what
  `jaxdl.train.scoring` sums to score text and answer choices)."""
  return optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV.astype(jnp.float32), y_BxT)


def scored_weight(key: str) -> Callable[[dict], Any]:
  """`batch -> sum_{b,t} w_bt`, w = batch[key] (a loss mask) times the eval padding mask, the
  denominator of `weighted_ce` and of the masked LM loss; None for a batch without `key`."""

  def weight(batch):
    if key not in batch:
      return None
    w = batch[key].astype(jnp.float32)
    if "mask" in batch:
      w = w * batch["mask"].astype(jnp.float32).reshape((-1,) + (1,) * (w.ndim - 1))
    return w.sum()

  return weight


def smoothed_targets(labels_B: jax.Array, num_classes: int, smoothing: float) -> jax.Array:
  """(1 - s) onehot(y) + s / K."""
  onehot_BxK = jax.nn.one_hot(labels_B, num_classes)
  return (1.0 - smoothing) * onehot_BxK + smoothing / num_classes
