"""Graph tasks: the batch's nodes, edges and masks become a `jaxdl.models.gnn.Graph` input.

Shapes: B graphs, N padded nodes, K classes.

  graph_classification  the classification task (CE, accuracy; label smoothing as configured)
                        on one label per graph: logits (B, K), y (B,)
  node_classification   CE over the labelled nodes: logits (B, N, K), y (B, N), and
                        loss = sum_{b,i} l_bi CE_bi / sum_{b,i} l_bi with l = label_mask (times
                        the eval padding mask), accuracy weighted the same way
"""

from __future__ import annotations


from jaxdl.models.gnn import Graph
from jaxdl.train.tasks import Task, apply_model, classification, register_task, weighted_ce


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
    loss, accuracy = weighted_ce(logits_BxNxK, batch["y"], batch["label_mask"], batch)
    return loss, ({"accuracy": accuracy}, new_state)

  return Task(loss_fn, init_input=_graph_input, kind="other")
