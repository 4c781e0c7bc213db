"""Graph tasks: the batch's nodes, edges and masks become a `jaxdl.models.gnn.Graph` input.

Shapes: B graphs, N padded nodes, K classes.

  graph_classification  the classification task (CE, accuracy; label smoothing as configured)
                        on one label per graph: logits (B, K), y (B,)
  node_classification   CE over the labelled nodes: logits (B, N, K), y (B, N), and
                        loss = sum_{b,i} l_bi CE_bi / sum_{b,i} l_bi with l = label_mask (times
                        the eval padding mask), accuracy weighted the same way
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

from jaxdl.models.gnn import Graph
from jaxdl.train.tasks import Task, apply_model, classification, register_task


def _graph_input(batch: dict) -> Graph:
  return Graph.from_batch(batch)


@register_task("graph_classification")
def graph_classification(config) -> Task:
  classify = classification(config).loss_fn

  def loss_fn(apply_fn, params, model_state, batch, rngs, train):
    return classify(apply_fn, params, model_state, {**batch, "x": _graph_input(batch)}, rngs,
                    train)

  return Task(loss_fn, init_input=_graph_input, kind="classification")


@register_task("node_classification")
def node_classification(config) -> Task:
  del config

  def loss_fn(apply_fn, params, model_state, batch, rngs, train):
    logits_BxNxK, new_state = apply_model(apply_fn, params, model_state, _graph_input(batch),
                                          rngs, train)
    logits_BxNxK = logits_BxNxK.astype(jnp.float32)
    weight_BxN = batch["label_mask"].astype(jnp.float32)
    if "mask" in batch:  # padded eval rows score nothing
      weight_BxN = weight_BxN * batch["mask"].astype(jnp.float32)[:, None]
    total = jnp.maximum(weight_BxN.sum(), 1.0)
    ce_BxN = optax.softmax_cross_entropy_with_integer_labels(logits_BxNxK, batch["y"])
    correct_BxN = (jnp.argmax(logits_BxNxK, -1) == batch["y"]).astype(jnp.float32)
    loss = (ce_BxN * weight_BxN).sum() / total
    return loss, ({"accuracy": (correct_BxN * weight_BxN).sum() / total}, new_state)

  return Task(loss_fn, init_input=_graph_input, kind="other")
