"""Training tasks: how a batch becomes a loss and metrics.

The registry (`TASKS`, `TaskKind`, `Task`, `register_task`, `make_task`) is in
`jaxdl.train.task_registry`; the built-in tasks are defined here and registered on import.

Losses (B batch, K classes, T time, V vocabulary):
  classification: CE(z, q) = -sum_k q_k log softmax(z)_k with q = (1 - s) onehot(y) + s / K in
                  training; evaluation reports the NLL -log softmax(z)_y (and the smoothed loss).
                  Soft targets y (B, K) (mixup, cutmix) take the place of onehot(y): CE(z, y),
                  accuracy against argmax y
  binary:         BCE(z, y) = -y log sigmoid(z) - (1 - y) log(1 - sigmoid(z))
  lm:             next-token CE averaged over B and T; also bits per byte = CE / ln 2 / (UTF-8
                  bytes per target token: 1 for raw bytes, `batch['bytes_per_token']`); in
                  training plus the model's aux loss (MoE router losses), when it has one, and
                  with `train.z_loss` = c > 0 PaLM's z-loss c * mean_{B,T} (log Z)^2, log Z =
                  logsumexp_v z_v (it keeps the softmax normalizer near 1; logged as z_loss).
                  A batch may carry batch['loss_mask'] m (B, T), 1 on the scored targets (the
                  responses of instruction data, `jaxdl.data.chat`; the queries of
                  `assoc_recall`, whose context is unpredictable); with w_bt = m_bt mask_b
                  (mask_b: the eval padding, else 1)
                    training  loss = sum_{b,t} w_bt CE_bt / max(1, sum_{b,t} w_bt)
                    eval      loss = sum_{b,t} w_bt CE_bt / (S sum_b mask_b), S =
                              batch['scored_per_row'] the eval split's scored tokens per row
                  so `loss` is the mean CE per scored token: the batch's in training, and,
                  the eval average weighting batches by rows, exactly the eval split's total
                  nats over its scored tokens (without `scored_per_row`, eval divides by the
                  batch's sum w as training does); accuracy, bits per byte (over the scored
                  targets' bytes, `jaxdl.data.packing`) and the z-loss are weighted by w alike.
                  This is the one masked LM loss (the task 'lm_masked' it replaces computed the
                  same numbers). With `train.loss_chunk` = C > 0 (a GPT) CE, accuracy and log Z
                  come from `jaxdl.train.chunked_loss` C positions at a time, without the
                  B x T x V logits; everything above applies to them unchanged
  regression:     mean over output dimensions of e^2, e = prediction - target (MSE); the tasks
                  regression_mae |e| and regression_huber (delta 1: e^2 / 2 for |e| <= 1, else
                  |e| - 1/2, quadratic near 0 and linear for outliers)

Graph tasks (N padded nodes) take a `jaxdl.models.gnn.Graph` built from the batch's nodes, edges
and masks:
  graph_classification  the classification task on one label per graph: logits (B, K), y (B,)
  node_classification   CE over the labelled nodes: logits (B, N, K), y (B, N), loss
                        sum_{b,i} l_bi CE_bi / sum_{b,i} l_bi with l = label_mask (times the eval
                        padding mask), accuracy weighted the same way
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from jaxdl.config import TrainSettings, parse_parallel
from jaxdl.models import build_model, moe
from jaxdl.models.gnn import Graph
from jaxdl.train.chunked_loss import chunked_token_stats
from jaxdl.train.task_registry import (TASKS, Family, Task, TaskKind, kind_of, make_task,
                                      register_task, task_names)
from jaxdl.train.token_losses import (masked_mean, next_token_ce, scored_weight, smoothed_targets,
                                      weighted_ce)

# The registry's names, re-exported: the engine and the task packages import them from here.
__all__ = ["TASKS", "Family", "Task", "TaskKind", "kind_of", "make_task", "register_task",
           "task_names"]


def apply_model(apply_fn, params, model_state, x, rngs, train: bool, **inputs):
  """Runs the model (`inputs`: further keyword inputs, e.g. segment ids); in training, returns
  the updated mutable collections too."""
  variables = {"params": params, **model_state}
  if train:
    rngs = {"dropout": rngs["dropout"]}
    if model_state:
      return apply_fn(variables, x, train=True, rngs=rngs, mutable=list(model_state), **inputs)
    return apply_fn(variables, x, train=True, rngs=rngs, **inputs), model_state
  return apply_fn(variables, x, train=False, **inputs), model_state


def apply_model_aux(apply_fn, params, model_state, x, rngs, train: bool, **inputs):
  """`apply_model` plus the model's auxiliary training loss and metrics: (out, new_state,
  aux_loss, aux_metrics) from the 'aux' collection a model sows in training (the MoE router
  losses, `jaxdl.models.moe.aux_summary`); a zero loss and no metrics otherwise and in eval."""
  if not train:
    out, new_state = apply_model(apply_fn, params, model_state, x, rngs, train, **inputs)
    return out, new_state, jnp.zeros((), jnp.float32), {}
  out, updates = apply_fn({"params": params, **model_state}, x, train=True,
                          rngs={"dropout": rngs["dropout"]}, mutable=[*model_state, moe.AUX],
                          **inputs)
  updates = dict(updates)
  return (out, updates, *moe.aux_summary(updates.pop(moe.AUX, {})))


@register_task("classification", Family.CLASSIFICATION, labels=True)
def classification(config, train_settings: TrainSettings) -> Task:
  del config
  smoothing = train_settings.label_smoothing

  def loss_fn(apply_fn, params, model_state, batch, rngs, train):
    logits_BxK, new_state = apply_model(apply_fn, params, model_state, batch["x"], rngs, train)
    logits_BxK = logits_BxK.astype(jnp.float32)
    y, num_classes = batch["y"], logits_BxK.shape[-1]
    soft = y.ndim == 2  # mixup / cutmix targets q (B, K) (jaxdl.data.augment)
    nll_B = (optax.softmax_cross_entropy(logits_BxK, y) if soft
             else optax.softmax_cross_entropy_with_integer_labels(logits_BxK, y))
    labels_B = jnp.argmax(y, -1) if soft else y
    accuracy = masked_mean(jnp.argmax(logits_BxK, -1) == labels_B, batch)
    if not smoothing:
      return masked_mean(nll_B, batch), ({"accuracy": accuracy}, new_state)
    targets_BxK = ((1.0 - smoothing) * y + smoothing / num_classes if soft
                   else smoothed_targets(y, num_classes, smoothing))
    smoothed = masked_mean(optax.softmax_cross_entropy(logits_BxK, targets_BxK), batch)
    nll = masked_mean(nll_B, batch)
    # Training minimizes the smoothed loss; evaluation reports the plain NLL -log p(y|x) (what
    # a held-out loss means) with the smoothed value beside it.
    metrics = {"accuracy": accuracy, "nll": nll, "smoothed_loss": smoothed}
    return (smoothed if train else nll), (metrics, new_state)

  return Task(loss_fn)


@register_task("binary", Family.BINARY)
def binary(config, train_settings: TrainSettings) -> Task:
  del config, train_settings

  def loss_fn(apply_fn, params, model_state, batch, rngs, train):
    logits, new_state = apply_model(apply_fn, params, model_state, batch["x"], rngs, train)
    logits_B = logits.astype(jnp.float32).reshape(-1)
    labels_B = batch["y"].astype(jnp.float32).reshape(-1)
    loss = masked_mean(optax.sigmoid_binary_cross_entropy(logits_B, labels_B), batch)
    accuracy = masked_mean((logits_B > 0) == (labels_B > 0.5), batch)
    return loss, ({"accuracy": accuracy}, new_state)

  return Task(loss_fn)


@register_task("lm", Family.LM)
def language_model(config, train_settings: TrainSettings) -> Task:
  z_coef, chunk = train_settings.z_loss, train_settings.loss_chunk
  # The head's hidden states and W come without the model's logit soft-cap (Gemma 2).
  softcap = build_model(config.model).logit_softcap if chunk else 0.0
  groups = parse_parallel(config).sequence if chunk else 1  # chunks within a device's share

  def loss_fn(apply_fn, params, model_state, batch, rngs, train):
    # Packed batches (`jaxdl.data.packing`) also carry segment and position ids.
    packed = {k: batch[k] for k in ("segment_ids", "positions") if k in batch}
    if chunk:
      (h_BxTxD, w_DxV), new_state, aux_loss, aux_metrics = apply_model_aux(
          apply_fn, params, model_state, batch["x"], rngs, train, hidden=True, **packed)
      ce_BxT, correct_BxT, log_z_BxT = chunked_token_stats(h_BxTxD, w_DxV, batch["y"], chunk,
                                                           softcap, groups)
      log_z_BxT = log_z_BxT if z_coef else None
    else:
      logits_BxTxV, new_state, aux_loss, aux_metrics = apply_model_aux(
          apply_fn, params, model_state, batch["x"], rngs, train, **packed)
      logits_BxTxV = logits_BxTxV.astype(jnp.float32)
      ce_BxT = next_token_ce(logits_BxTxV, batch["y"])
      correct_BxT = jnp.argmax(logits_BxTxV, -1) == batch["y"]
      log_z_BxT = jax.nn.logsumexp(logits_BxTxV, axis=-1) if z_coef else None
    if "loss_mask" in batch:
      loss, accuracy, rate, z_mean = _response_means(batch, ce_BxT, correct_BxT, log_z_BxT)
    else:
      loss = masked_mean(ce_BxT.mean(-1), batch)
      accuracy = masked_mean(correct_BxT.mean(-1), batch)
      # Packed text carries its UTF-8 bytes per target token (`jaxdl.data.packing`: total nats
      # over total bytes); raw-byte windows are one byte a token.
      rate = (masked_mean(batch["bytes_per_token"], batch) if "bytes_per_token" in batch
              else 1.0)
      z_mean = masked_mean(jnp.square(log_z_BxT).mean(-1), batch) if z_coef else None
    metrics = {"accuracy": accuracy, "bits_per_byte": loss / math.log(2.0) / rate,
               **aux_metrics}
    if z_coef:
      metrics["z_loss"] = z_coef * z_mean
      aux_loss = aux_loss + (metrics["z_loss"] if train else 0.0)
    # An MoE's router losses and the z-loss join the training objective; evaluation and bits
    # per byte report the plain CE.
    return loss + aux_loss, (metrics, new_state)

  return Task(loss_fn, loss_weight=scored_weight("loss_mask"))


def _response_means(batch: dict, ce_BxT, correct_BxT, log_z_BxT):
  """(loss, accuracy, bytes per scored token, mean (log Z)^2 or None) over the response targets
  of a masked batch (module docstring: `lm`)."""
  w_BxT = batch["loss_mask"].astype(jnp.float32)
  if "mask" in batch:
    w_BxT = w_BxT * batch["mask"].astype(jnp.float32)[:, None]
  if "scored_per_row" in batch:  # eval: the split's scored tokens per row, so batches add up
    rows = batch["mask"].sum() if "mask" in batch else w_BxT.shape[0]
    total = jnp.maximum(masked_mean(batch["scored_per_row"], batch) * rows, 1e-9)
  else:
    total = jnp.maximum(w_BxT.sum(), 1.0)
  mean = lambda v_BxT: (v_BxT.astype(jnp.float32) * w_BxT).sum() / total  # noqa: E731
  rate = 1.0
  if "bytes_per_token" in batch:
    n_B = w_BxT.sum(-1)
    r_B = batch["bytes_per_token"].astype(jnp.float32)
    # Each row's bytes per scored token, weighted by its scored tokens: the batch's total bytes
    # over its total scored tokens (eval rows all carry the split's value).
    rate = jnp.where(n_B.sum() > 0, (n_B * r_B).sum() / jnp.maximum(n_B.sum(), 1e-9),
                     masked_mean(r_B, batch))
  z_mean = mean(jnp.square(log_z_BxT)) if log_z_BxT is not None else None
  return mean(ce_BxT), mean(correct_BxT), rate, z_mean


def _regression_task(error_fn: Callable[[jax.Array], jax.Array]) -> Task:
  """The per-example mean over output dimensions of error_fn(prediction - target)."""

  def loss_fn(apply_fn, params, model_state, batch, rngs, train):
    pred, new_state = apply_model(apply_fn, params, model_state, batch["x"], rngs, train)
    err = error_fn(pred.astype(jnp.float32) -
                   batch["y"].astype(jnp.float32).reshape(pred.shape))
    loss = masked_mean(err.reshape(err.shape[0], -1).mean(-1), batch)
    return loss, ({}, new_state)

  return Task(loss_fn)


@register_task("regression", Family.REGRESSION)
def regression(config, train_settings: TrainSettings) -> Task:
  del config, train_settings
  return _regression_task(jnp.square)


@register_task("regression_mae", Family.REGRESSION)
def regression_mae(config, train_settings: TrainSettings) -> Task:
  del config, train_settings
  return _regression_task(jnp.abs)


@register_task("regression_huber", Family.REGRESSION)
def regression_huber(config, train_settings: TrainSettings) -> Task:
  del config, train_settings
  return _regression_task(lambda e: optax.huber_loss(e, delta=1.0))


def _graph_input(batch: dict) -> Graph:
  return Graph.from_batch(batch)


@register_task("graph_classification", Family.CLASSIFICATION, labels=True)
def graph_classification(config, train_settings: TrainSettings) -> Task:
  classify = classification(config, train_settings).loss_fn

  def loss_fn(apply_fn, params, model_state, batch, rngs, train):
    return classify(apply_fn, params, model_state, {**batch, "x": _graph_input(batch)}, rngs,
                    train)

  return Task(loss_fn, init_input=_graph_input)


@register_task("node_classification", labels=True)
def node_classification(config, train_settings: TrainSettings) -> Task:
  del config, train_settings

  def loss_fn(apply_fn, params, model_state, batch, rngs, train):
    logits_BxNxK, new_state = apply_model(apply_fn, params, model_state, _graph_input(batch),
                                          rngs, train)
    loss, accuracy = weighted_ce(logits_BxNxK, batch["y"], batch["label_mask"], batch)
    return loss, ({"accuracy": accuracy}, new_state)

  return Task(loss_fn, init_input=_graph_input, loss_weight=scored_weight("label_mask"))
