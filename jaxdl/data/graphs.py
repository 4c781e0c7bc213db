"""Graph datasets: padded node features, edge lists and masks (the batch of `jaxdl.models.gnn`).

Shapes: G graphs, N padded nodes, E padded directed edges, F node features.

A graph example is the dict nodes (N, F) float32, edges (E, 2) int32 (sender, receiver),
node_mask (N,), edge_mask (E,) float32, and y: (N,) int32 node labels with label_mask (N,) for
node classification, or a scalar int32 class for graph classification. An undirected edge
{i, j} is stored as the two directed edges i -> j and j -> i.

Datasets:
  karate        Zachary's karate club (34 members, 78 friendships, Zachary 1977): which of the
                two factions (Mr. Hi's = 0, the officer's = 1) each member joined. One graph;
                train labels `labelled` members per faction (the two leaders first), eval
                scores every other member. Node features: one-hot member ids.
                                                                   kind 'node_classification'
  graph_npz     a user graph in a .npz file: edges (E, 2) int, y (N,) labels, optional x (N, F)
                features (default one-hot ids) and train_mask (N,) (default: a seeded
                `labelled` members per class).                     kind 'node_classification'
  cycles_trees  generated graphs of min_nodes..max_nodes nodes: a uniform random labelled tree
                (class 0) or such a tree plus one edge, which closes exactly one cycle (class
                1); constant node features.                        kind 'graph_classification'
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxdl.schema import NONNEG, POSITIVE, setting
from jaxdl.data.registry import DataSource, Source, Split, register_source
from jaxdl.data.sources import _info, existing_path

# Zachary's 78 friendships, members numbered 1..34 as in his table.
_KARATE_EDGES_1 = (
    "2-1 3-1 3-2 4-1 4-2 4-3 5-1 6-1 7-1 7-5 7-6 8-1 8-2 8-3 8-4 9-1 9-3 10-3 11-1 11-5 11-6 "
    "12-1 13-1 13-4 14-1 14-2 14-3 14-4 17-6 17-7 18-1 18-2 20-1 20-2 22-1 22-2 26-24 26-25 "
    "28-3 28-24 28-25 29-3 30-24 30-27 31-2 31-9 32-1 32-25 32-26 32-29 33-3 33-9 33-15 33-16 "
    "33-19 33-21 33-23 33-24 33-30 33-31 33-32 34-9 34-10 34-14 34-15 34-16 34-19 34-20 34-21 "
    "34-23 34-24 34-27 34-28 34-29 34-30 34-31 34-32 34-33")
# Members (1..34) who joined Mr. Hi's club after the split; the others joined the officer's.
_KARATE_MR_HI_1 = (1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 17, 18, 20, 22)


def karate_club() -> tuple[np.ndarray, np.ndarray]:
  """(edges (78, 2) int32, 0-indexed undirected pairs; faction (34,) int32, 0 = Mr. Hi)."""
  pairs = [tuple(int(v) - 1 for v in p.split("-")) for p in _KARATE_EDGES_1.split()]
  faction_N = np.ones(34, np.int32)
  faction_N[np.asarray(_KARATE_MR_HI_1) - 1] = 0
  return np.asarray(pairs, np.int32), faction_N


def check_edges(edges, num_nodes: int, where: str) -> np.ndarray:
  """`edges` as an (E, 2) int32 array of indices in [0, num_nodes); else one ValueError
  naming `where` (the key or file) and the first offending edge."""
  e = np.asarray(edges)
  if e.ndim != 2 or e.shape[1] != 2 or not (np.issubdtype(e.dtype, np.integer) or e.size == 0):
    raise ValueError(f"{where}: edges must be an (E, 2) integer array, got shape {e.shape} "
                     f"dtype {e.dtype}")
  bad = np.flatnonzero(((e < 0) | (e >= num_nodes)).any(axis=1))
  if bad.size:
    i = int(bad[0])
    raise ValueError(f"{where}: edge {i} ({e[i, 0]} -> {e[i, 1]}) points past the graph's "
                     f"{num_nodes} nodes (valid indices 0..{num_nodes - 1})")
  return e.astype(np.int32)


def _both_ways(edges_Ex2: np.ndarray) -> np.ndarray:
  return np.concatenate([edges_Ex2, edges_Ex2[:, ::-1]], axis=0)


def pack(graphs: list[tuple[np.ndarray, np.ndarray]], num_nodes: int, num_edges: int) -> dict:
  """Pads (x (n, F), directed edges (e, 2)) pairs to (G, N, F), (G, E, 2) with masks."""
  g, f = len(graphs), graphs[0][0].shape[1]
  out = {"nodes": np.zeros((g, num_nodes, f), np.float32),
         "edges": np.zeros((g, num_edges, 2), np.int32),
         "node_mask": np.zeros((g, num_nodes), np.float32),
         "edge_mask": np.zeros((g, num_edges), np.float32)}
  for i, (x_nxF, e_ex2) in enumerate(graphs):
    out["nodes"][i, :len(x_nxF)] = x_nxF
    out["edges"][i, :len(e_ex2)] = e_ex2
    out["node_mask"][i, :len(x_nxF)] = 1.0
    out["edge_mask"][i, :len(e_ex2)] = 1.0
  return out


def _one_graph(arrays: dict) -> Split:
  """A split of one example (the whole graph); any index gathers it."""
  return Split(1, lambda idx_B: {k: np.repeat(v[None], len(idx_B), 0) for k, v in arrays.items()})


def node_source(x_NxF, edges_Ex2, y_N, train_mask_N) -> Source:
  """One graph: train on the labels where train_mask is set, evaluate on the others."""
  graph = pack([(x_NxF, _both_ways(edges_Ex2))], len(y_N), 2 * len(edges_Ex2))
  graph = {k: v[0] for k, v in graph.items()}
  train_mask = np.asarray(train_mask_N, np.float32)
  y_N = np.asarray(y_N, np.int32)
  tr = _one_graph({**graph, "y": y_N, "label_mask": train_mask})
  ev = _one_graph({**graph, "y": y_N, "label_mask": 1.0 - train_mask})
  return Source(tr, ev, _info("node_classification", tr, ev, x_NxF.shape,
                              num_classes=int(y_N.max()) + 1))


def labelled_mask(y_N, per_class: int, seed: int, first=()) -> np.ndarray:
  """`per_class` labelled nodes of each class: those of `first` in that class, then a seeded
  random choice of the rest."""
  mask_N = np.zeros(len(y_N), np.float32)
  rng = np.random.default_rng(seed)
  for k in np.unique(y_N):
    chosen = [i for i in first if y_N[i] == k][:per_class]
    rest = np.setdiff1d(np.flatnonzero(y_N == k), chosen)
    chosen += list(rng.permutation(rest)[:per_class - len(chosen)])
    mask_N[chosen] = 1.0
  return mask_N


@register_source("karate")
@dataclasses.dataclass(frozen=True)
class Karate(DataSource):
  batch_size: int = 1                              # the one graph
  labelled: int = setting(1, POSITIVE)             # train labels per faction (1: the leaders)
  data_seed: int = 0                               # picks the labelled members beyond the leaders

  def build(self) -> Source:
    edges_Ex2, faction_N = karate_club()
    if self.labelled >= 17:
      raise ValueError(f"data.labelled: {self.labelled} per faction leaves no member of a "
                       "17-member faction to evaluate on; expected < 17")
    mask_N = labelled_mask(faction_N, self.labelled, self.data_seed, first=(0, 33))
    return node_source(np.eye(34, dtype=np.float32), edges_Ex2, faction_N, mask_N)


@register_source("graph_npz")
@dataclasses.dataclass(frozen=True)
class GraphNpz(DataSource):
  """A user graph: edges (E, 2) int, y (N,) labels, optional x (N, F), train_mask (N,)."""

  batch_size: int = 1
  path: str = ""
  labelled: int = setting(1, POSITIVE)   # train labels per class when the file has no train_mask
  data_seed: int = 0

  def build(self) -> Source:
    path = existing_path(self.path)
    try:
      with np.load(path, allow_pickle=False) as f:
        arrays = {k: np.asarray(f[k]) for k in f.files}
    except Exception as e:  # noqa: BLE001 -- truncated zips raise BadZipFile, EOFError, ...
      raise ValueError(f"data.path: cannot read {path!r} as .npz: {type(e).__name__}") from e
    if "edges" not in arrays or "y" not in arrays:
      raise ValueError(f"data.path: {path!r} must hold arrays 'edges' and 'y'; found "
                       f"{sorted(arrays)}")
    y_N = arrays["y"]
    if y_N.ndim != 1 or not np.issubdtype(y_N.dtype, np.integer) or y_N.min() < 0:
      raise ValueError(f"data.path: {path!r}: y must be (N,) integer labels >= 0")
    edges_Ex2 = check_edges(arrays["edges"], len(y_N), f"data.path: {path!r}")
    x_NxF = arrays.get("x", np.eye(len(y_N), dtype=np.float32)).astype(np.float32)
    if len(x_NxF) != len(y_N):
      raise ValueError(f"data.path: {path!r}: x has {len(x_NxF)} rows for {len(y_N)} labels")
    mask_N = arrays.get("train_mask")
    if mask_N is None:
      mask_N = labelled_mask(y_N, self.labelled, self.data_seed)
    return node_source(x_NxF, edges_Ex2, y_N, mask_N)


def random_tree(n: int, rng: np.random.Generator) -> np.ndarray:
  """The n - 1 edges of a uniform random labelled tree on n nodes (decoded Pruefer sequence)."""
  if n == 2:
    return np.array([[0, 1]], np.int32)
  seq = rng.integers(0, n, n - 2)
  degree_N = np.ones(n, np.int64)
  np.add.at(degree_N, seq, 1)
  edges = []
  for v in seq:
    leaf = int(np.flatnonzero(degree_N == 1)[0])
    edges.append((leaf, int(v)))
    degree_N[leaf] -= 1
    degree_N[v] -= 1
  u, w = np.flatnonzero(degree_N == 1)
  edges.append((int(u), int(w)))
  return np.asarray(edges, np.int32)


def tree_or_cycle(n: int, label: int, rng: np.random.Generator) -> np.ndarray:
  """A random tree (label 0), or a random tree plus one new edge: one cycle (label 1)."""
  edges_Ex2 = random_tree(n, rng)
  if label:
    present = {tuple(sorted(e)) for e in edges_Ex2.tolist()}
    absent = [(i, j) for i in range(n) for j in range(i + 1, n) if (i, j) not in present]
    edges_Ex2 = np.concatenate([edges_Ex2, [absent[rng.integers(len(absent))]]]).astype(np.int32)
  return edges_Ex2


@register_source("cycles_trees")
@dataclasses.dataclass(frozen=True)
class CyclesTrees(DataSource):
  batch_size: int = 64
  n: int = setting(1000, POSITIVE)              # training graphs (half of each class)
  n_eval: int = setting(400, POSITIVE)
  min_nodes: int = setting(6, POSITIVE)
  max_nodes: int = setting(12, POSITIVE)
  data_seed: int = setting(0, NONNEG)          # train draws; eval uses data_seed + 1

  def build(self) -> Source:
    if not 3 <= self.min_nodes <= self.max_nodes:
      raise ValueError(f"data.min_nodes: expected 3 <= min_nodes <= max_nodes "
                       f"({self.max_nodes}), got {self.min_nodes} (a cycle needs 3 nodes)")

    def draw(count, seed):
      rng = np.random.default_rng(seed)
      labels_G = rng.permutation(np.arange(count) % 2).astype(np.int32)
      graphs = []
      for label in labels_G:
        n = int(rng.integers(self.min_nodes, self.max_nodes + 1))
        graphs.append((np.ones((n, 1), np.float32), _both_ways(tree_or_cycle(n, label, rng))))
      arrays = pack(graphs, self.max_nodes, 2 * self.max_nodes)
      arrays["y"] = labels_G
      return arrays

    train, eval_ = draw(self.n, self.data_seed), draw(self.n_eval, self.data_seed + 1)
    tr, ev = (Split(len(a["y"]), lambda idx_B, a=a: {k: v[idx_B] for k, v in a.items()})
              for a in (train, eval_))
    return Source(tr, ev, _info("graph_classification", tr, ev, (self.max_nodes, 1),
                                num_classes=2))
