"""Graph neural networks: message passing over padded edge lists with `jax.ops.segment_sum`.

Shapes: B graphs in a batch, N padded nodes per graph, E padded (directed) edges per graph,
V = B N nodes of the flattened batch, F node features, D hidden width, K outputs.

A batch of graphs is a `Graph`: node features (B, N, F), edges (B, E, 2) as (sender, receiver)
indices into that graph's nodes, and masks (1 real, 0 padding) for nodes and edges. The batch
is flattened into one graph of V nodes (graph b's node i is node b N + i), so a layer is one
gather and one segment sum over all edges, whatever B:

  messages       m_e = w_e h_{s(e)}                            (gather, O(|E| d))
  aggregation    a_i = sum_{e: r(e) = i} m_e                   (segment_sum over receivers)

GCN (Kipf & Welling, 2017), with self-loops and symmetric normalization:
  h'_i = sum_{j in N(i) + i} h_j W / sqrt(deg_i deg_j),    deg_i = 1 + |{e : r(e) = i}|
GIN (Xu et al., 2019), sum aggregation with a learned self weight:
  h'_i = MLP((1 + eps) h_i + sum_{j in N(i)} h_j),        MLP = Dense -> ReLU -> Dense
Each layer costs O(|E| d + |V| d^2): a gather per edge, a dense map per node (the course's row).

Node-level outputs are a Dense head on every node (B, N, K); graph-level outputs pool the real
nodes (sum or mean) and apply the head (B, K). Renumbering the nodes of a graph permutes the node
outputs the same way and leaves the graph outputs unchanged: every operation is a function of the
edge list's (sender, receiver) pairs and of per-node values only.
"""

from __future__ import annotations

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxdl.models import layers, register_model
from jaxdl.schema import POSITIVE, UNIT, one_of, setting

Dtype = Any
CONVS = ("gcn", "gin")
READOUTS = ("none", "sum", "mean")


@flax.struct.dataclass
class Graph:
  """A padded batch of graphs; `graph[:1]` slices every field along the batch axis."""
  nodes: jax.Array      # (B, N, F) node features
  edges: jax.Array      # (B, E, 2) int (sender, receiver), indices into the graph's N nodes
  node_mask: jax.Array  # (B, N) 1 real node, 0 padding
  edge_mask: jax.Array  # (B, E) 1 real edge, 0 padding

  def __getitem__(self, idx) -> "Graph":
    return jax.tree.map(lambda a: a[idx], self)

  @classmethod
  def from_batch(cls, batch: dict) -> "Graph":
    """The graph of a data batch with keys nodes, edges, node_mask, edge_mask."""
    return cls(batch["nodes"], batch["edges"], batch["node_mask"], batch["edge_mask"])


def flatten(graph: Graph):
  """(h_VxF, senders_E', receivers_E', edge weight w_E', node mask_V) of the batch as one graph
  of V = B N nodes with E' = B E edges; padding edges get weight 0 and so send nothing."""
  b, n = graph.node_mask.shape
  offset_Bx1 = (jnp.arange(b) * n)[:, None]
  senders = (graph.edges[..., 0] + offset_Bx1).reshape(-1)
  receivers = (graph.edges[..., 1] + offset_Bx1).reshape(-1)
  return (jnp.asarray(graph.nodes).reshape(b * n, -1), senders, receivers,
          jnp.asarray(graph.edge_mask).reshape(-1), jnp.asarray(graph.node_mask).reshape(-1))


def aggregate(h_VxD, senders_E, receivers_E, w_E):
  """a_i = sum_{e: r(e) = i} w_e h_{s(e)}: one gather and one segment sum."""
  m_ExD = h_VxD[senders_E] * w_E[:, None].astype(h_VxD.dtype)
  return jax.ops.segment_sum(m_ExD, receivers_E, num_segments=h_VxD.shape[0])


class GraphConv(nn.Module):
  """A message-passing layer of `features` outputs: `__call__(h, senders, receivers, w)`."""

  features: int
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def dense(self, name: str, **kw) -> nn.Dense:
    return nn.Dense(self.features, dtype=self.dtype, param_dtype=self.param_dtype, name=name,
                    **kw)


class GCNConv(GraphConv):
  """h' = D^-1/2 (A + I) D^-1/2 h W + b (symmetric normalization with self-loops)."""

  @nn.compact
  def __call__(self, h_VxF, senders_E, receivers_E, w_E):
    deg_V = 1.0 + jax.ops.segment_sum(w_E.astype(jnp.float32), receivers_E,
                                      num_segments=h_VxF.shape[0])
    inv_sqrt_V = jax.lax.rsqrt(deg_V)
    # W first: the per-edge work is then O(|E| D_out) rather than O(|E| D_in).
    hw_VxD = self.dense("w", use_bias=False)(h_VxF)
    scaled_VxD = hw_VxD * inv_sqrt_V[:, None].astype(hw_VxD.dtype)
    a_VxD = aggregate(scaled_VxD, senders_E, receivers_E, w_E) + scaled_VxD  # + I: self-loop
    bias = self.param("bias", nn.initializers.zeros, (self.features,), self.param_dtype)
    return a_VxD * inv_sqrt_V[:, None].astype(a_VxD.dtype) + bias.astype(self.dtype)


class GINConv(GraphConv):
  """h' = MLP((1 + eps) h + sum_{j in N(i)} h_j), eps a learned scalar starting at 0."""

  @nn.compact
  def __call__(self, h_VxF, senders_E, receivers_E, w_E):
    eps = self.param("eps", nn.initializers.zeros, (), self.param_dtype).astype(self.dtype)
    z_VxF = (1.0 + eps) * h_VxF + aggregate(h_VxF, senders_E, receivers_E, w_E)
    return self.dense("mlp_1")(nn.relu(self.dense("mlp_0")(z_VxF)))


@register_model("gnn")
class GNN(layers.Model):
  """`num_layers` message-passing layers of width `hidden`, then a node or graph head.

  Attributes:
    conv: 'gcn' | 'gin'.
    hidden: width D of every layer.
    num_layers: message-passing layers (the receptive field is num_layers hops).
    out: outputs K per node (readout 'none') or per graph.
    readout: 'none' (node-level logits (B, N, K)), 'sum' or 'mean' over the real nodes (B, K).
    activation: a name of `layers.ACTIVATIONS`, after every layer.
    dropout: drop probability on every layer's input features (inverted dropout).
  The last layer's node embeddings (V, D) are sown into 'intermediates' as 'embeddings'.
  """

  conv: str = setting("gcn", one_of(*CONVS))
  hidden: int = setting(16, POSITIVE)
  num_layers: int = setting(2, POSITIVE)
  out: int = setting(2, POSITIVE)
  readout: str = setting("none", one_of(*READOUTS))
  activation: str = setting("relu", one_of(*layers.ACTIVATIONS))
  dropout: float = setting(0.0, UNIT)
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, graph: Graph, *, train: bool):
    b, n = graph.node_mask.shape
    h_VxD, senders_E, receivers_E, w_E, mask_V = flatten(graph)
    h_VxD, mask_Vx1 = h_VxD.astype(self.dtype), mask_V[:, None].astype(self.dtype)
    conv_cls = {"gcn": GCNConv, "gin": GINConv}[self.conv]
    act = layers.get_activation(self.activation)
    for i in range(self.num_layers):
      h_VxD = nn.Dropout(self.dropout, deterministic=not train)(h_VxD)
      h_VxD = conv_cls(self.hidden, dtype=self.dtype, param_dtype=self.param_dtype,
                       name=f"{self.conv}_{i}")(h_VxD, senders_E, receivers_E, w_E)
      h_VxD = act(h_VxD) * mask_Vx1  # padding nodes stay 0 (their bias would leak into readout)
    self.sow("intermediates", "embeddings", h_VxD)
    head = nn.Dense(self.out, dtype=self.dtype, param_dtype=self.param_dtype, name="head")
    if self.readout == "none":
      return head(h_VxD).reshape(b, n, self.out).astype(jnp.float32)
    pooled_BxD = h_VxD.reshape(b, n, -1).sum(1)
    if self.readout == "mean":
      pooled_BxD = pooled_BxD / jnp.maximum(graph.node_mask.sum(1, keepdims=True), 1)
    return head(pooled_BxD).astype(jnp.float32)



def mean_average_distance(h_NxD, mask_N=None) -> jax.Array:
  """MAD (Chen et al., 2020): the mean cosine distance 1 - cos(h_i, h_j) over pairs i != j of
  real nodes whose embeddings are both nonzero; 0 when no such pair. It falls to 0 as the
  embeddings collapse onto one direction (over-smoothing)."""
  h_NxD = jnp.asarray(h_NxD, jnp.float32)
  norm_N = jnp.linalg.norm(h_NxD, axis=-1)
  live_N = (norm_N > 0).astype(jnp.float32)
  if mask_N is not None:
    live_N = live_N * jnp.asarray(mask_N, jnp.float32)
  unit_NxD = h_NxD / jnp.maximum(norm_N, 1e-30)[:, None]
  pair_NxN = live_N[:, None] * live_N[None, :] * (1.0 - jnp.eye(h_NxD.shape[0]))
  dist_NxN = 1.0 - unit_NxD @ unit_NxD.T
  return (dist_NxN * pair_NxN).sum() / jnp.maximum(pair_NxN.sum(), 1.0)
