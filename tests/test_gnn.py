"""GNN layers against their dense formulas, permutation equivariance and invariance, the graph
datasets (karate club facts, trees vs one cycle), the node task's loss, and a bad edge list."""

import numpy as np
import pytest

import jax
import ml_collections

from jaxdl import cli
from jaxdl.data import graphs, parse_data
from jaxdl.models import build_model
from jaxdl.models.gnn import Graph, mean_average_distance
from jaxdl.train.tasks import TASKS


def _random_graphs(seed=0, sizes=(5, 7), n_pad=8, f=3):
  """Two random undirected graphs (sizes nodes), padded to n_pad nodes and 2 * 12 edges."""
  rng = np.random.default_rng(seed)
  items, adjs = [], []
  for n in sizes:
    pairs = np.array([(i, j) for i in range(n) for j in range(i + 1, n)])
    und = pairs[rng.permutation(len(pairs))[:n + 1]]
    directed = np.concatenate([und, und[:, ::-1]])
    a = np.zeros((n, n))
    a[directed[:, 1], directed[:, 0]] = 1.0   # a[i, j] = 1 when j sends to i
    items.append((rng.normal(size=(n, f)).astype(np.float32), directed))
    adjs.append(a)
  return graphs.pack(items, n_pad, 24), items, adjs


def _gnn(**fields):
  return build_model(ml_collections.ConfigDict(dict(name="gnn", **fields)))


@pytest.fixture(scope="module")
def models():
  """GCN and GIN initialized once on the random graphs, with jitted node-level and graph-level
  (sum readout) forwards; both heads map D -> K, so they share the parameters."""
  batch, _, _ = _random_graphs()
  out = {}
  for conv in ("gcn", "gin"):
    model = _gnn(conv=conv, hidden=4, num_layers=2, out=3, readout="none")
    variables = model.init(jax.random.PRNGKey(1), Graph.from_batch(batch), train=False)
    for readout in ("none", "sum"):
      m = model.clone(readout=readout)
      out[conv, readout] = (m, variables, jax.jit(lambda v, g, m=m: m.apply(v, g, train=False)))
  return out


def test_layers_equal_their_dense_formulas(models):
  batch, items, adjs = _random_graphs()
  for conv in ("gcn", "gin"):
    model, variables, apply = models[conv, "none"]
    p = jax.tree.map(np.asarray, variables["params"])
    got = np.asarray(apply(variables, Graph.from_batch(batch)))
    for b, ((x, _), a) in enumerate(zip(items, adjs)):
      h = x.astype(np.float64)
      for i in range(2):
        lp = p[f"{conv}_{i}"]
        if conv == "gcn":   # D^-1/2 (A + I) D^-1/2 H W + b
          a_hat = a + np.eye(len(a))
          d = 1.0 / np.sqrt(a_hat.sum(1))
          h = (d[:, None] * a_hat * d[None, :]) @ h @ lp["w"]["kernel"] + lp["bias"]
        else:               # MLP((1 + eps) H + A H)
          z = (1.0 + lp["eps"]) * h + a @ h
          z = np.maximum(z @ lp["mlp_0"]["kernel"] + lp["mlp_0"]["bias"], 0.0)
          h = z @ lp["mlp_1"]["kernel"] + lp["mlp_1"]["bias"]
        h = np.maximum(h, 0.0)
      want = h @ p["head"]["kernel"] + p["head"]["bias"]
      np.testing.assert_allclose(got[b, :len(x)], want, rtol=1e-5, atol=1e-5)


def test_permutation_equivariance_and_invariance(models):
  batch, _, _ = _random_graphs()
  rng = np.random.default_rng(3)
  # Renumber the real nodes of each graph (padding stays last) and shuffle the edge order.
  moved = {k: v.copy() for k, v in batch.items()}
  sigmas = []
  for b in range(2):
    n = int(batch["node_mask"][b].sum())
    sigma = np.concatenate([rng.permutation(n), np.arange(n, 8)])  # new node i = old sigma[i]
    inverse = np.argsort(sigma)
    moved["nodes"][b] = batch["nodes"][b, sigma]
    order = rng.permutation(24)
    moved["edges"][b] = inverse[batch["edges"][b, order]]
    moved["edge_mask"][b] = batch["edge_mask"][b, order]
    sigmas.append(sigma)
  for conv in ("gcn", "gin"):
    _, variables, apply = models[conv, "none"]
    y = np.asarray(apply(variables, Graph.from_batch(batch)))
    y_moved = np.asarray(apply(variables, Graph.from_batch(moved)))
    for b, sigma in enumerate(sigmas):
      np.testing.assert_allclose(y_moved[b], y[b, sigma], rtol=1e-5, atol=1e-5)
    _, variables, apply = models[conv, "sum"]
    np.testing.assert_allclose(apply(variables, Graph.from_batch(moved)),
                               apply(variables, Graph.from_batch(batch)), rtol=1e-5, atol=1e-5)
    if conv == "gin":
      continue
    # Padding is invisible: one graph alone, padded to a different size, gives the same output.
    alone = graphs.pack([(batch["nodes"][0, :5], batch["edges"][0, :12])], 6, 13)
    np.testing.assert_allclose(apply(variables, Graph.from_batch(alone))[0],
                               apply(variables, Graph.from_batch(batch))[0], rtol=1e-5,
                               atol=1e-5)


def test_karate_club_facts_and_splits():
  edges, faction = graphs.karate_club()
  a = np.zeros((34, 34))
  a[edges[:, 0], edges[:, 1]] = 1.0
  a = a + a.T
  degree = a.sum(1)
  # Zachary's graph: 78 edges, no repeats or self-loops, 45 triangles; Mr. Hi (0) has 16
  # friends, the officer (33) 17; the factions are 17 and 17.
  assert len(edges) == 78 and a.max() == 1.0 and np.trace(a) == 0
  assert np.trace(a @ a @ a) / 6 == 45
  assert (degree[0], degree[33], degree.sum()) == (16, 17, 156)
  assert np.bincount(faction).tolist() == [17, 17] and faction[0] == 0 and faction[33] == 1
  source = parse_data(dict(name="karate")).build()
  train, eval_ = source.train.gather(np.array([0])), source.eval.gather(np.array([0]))
  assert train["nodes"].shape == (1, 34, 34) and train["edges"].shape == (1, 156, 2)
  assert np.flatnonzero(train["label_mask"][0]).tolist() == [0, 33]
  assert eval_["label_mask"].sum() == 32 and source.info["num_classes"] == 2


def test_trees_and_one_cycle_graphs():
  source = parse_data(dict(name="cycles_trees", n=40, n_eval=8, min_nodes=4,
                           max_nodes=9)).build()
  batch = source.train.gather(np.arange(40))
  assert batch["y"].sum() == 20
  for b in range(40):
    n, e = int(batch["node_mask"][b].sum()), int(batch["edge_mask"][b].sum()) // 2
    und = {tuple(sorted(p)) for p in batch["edges"][b, :2 * e].tolist()}
    assert len(und) == e and e == n - 1 + batch["y"][b]   # a tree has n - 1 edges
    reach, frontier = {0}, [0]   # connected: every node reachable from node 0
    while frontier:
      i = frontier.pop()
      for s, r in und:
        for u, v in ((s, r), (r, s)):
          if u == i and v not in reach:
            reach.add(v)
            frontier.append(v)
    assert len(reach) == n


def test_node_task_scores_labelled_nodes_only(models):
  batch, _, _ = _random_graphs()
  model, variables, apply = models["gcn", "none"]
  rng = np.random.default_rng(0)
  batch = {**batch, "y": rng.integers(0, 3, (2, 8)).astype(np.int32),
           "label_mask": (rng.random((2, 8)) < 0.5) * batch["node_mask"]}
  loss_fn = TASKS["node_classification"](None, None).loss_fn
  loss, (metrics, _) = loss_fn(lambda v, g, train: apply(v, g), variables["params"], {}, batch,
                               {}, False)
  logits = np.asarray(apply(variables, Graph.from_batch(batch)), np.float64)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  ce = -np.take_along_axis(logp, batch["y"][..., None], -1)[..., 0]
  w = batch["label_mask"]
  np.testing.assert_allclose(loss, (ce * w).sum() / w.sum(), rtol=1e-5)
  np.testing.assert_allclose(metrics["accuracy"],
                             ((logits.argmax(-1) == batch["y"]) * w).sum() / w.sum(), rtol=1e-6)


EXPERIMENT = '''"""A user graph for the bad-input test."""
from jaxdl.config import load_config


def get_config(arg=None):
  c, _ = load_config("karate_gnn:smoke")
  c.name = "user_graph"
  c.data = dict(name="graph_npz", batch_size=1, path="", labelled=1, data_seed=0)
  return c
'''


def test_edge_past_the_node_count_is_one_line_exit_2(tmp_path, capsys):
  (tmp_path / "user_graph.py").write_text(EXPERIMENT)
  np.savez(tmp_path / "g.npz", edges=np.array([[0, 1], [1, 2], [2, 40]]), y=np.array([0, 1, 0]))
  workdir = tmp_path / "run"
  capsys.readouterr()
  code = cli.main(["train", str(tmp_path / "user_graph.py"), "--set",
                   f"data.path={tmp_path / 'g.npz'}", "--workdir", str(workdir)])
  lines = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(lines) == 1, lines
  assert "g.npz" in lines[0] and "edge 2 (2 -> 40)" in lines[0] and "3 nodes" in lines[0]
  assert not workdir.exists()


def test_bad_model_keys_name_the_key():
  with pytest.raises(ValueError, match="model.conv"):
    _gnn(conv="gat")
  with pytest.raises(ValueError, match="model.readout"):
    _gnn(readout="max")


def test_mean_average_distance():
  """MAD: 1 for orthogonal rows, 0 for rows along one direction; zero and masked rows skipped."""
  assert float(mean_average_distance(np.eye(3))) == 1.0
  np.testing.assert_allclose(mean_average_distance([[1.0, 2.0], [3.0, 6.0], [0.0, 0.0]]), 0.0,
                             atol=1e-6)
  # Pairs (0, 1): 1 - cos 45 deg; (0, 2), (1, 2) are excluded by the mask.
  np.testing.assert_allclose(mean_average_distance([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]],
                                                   [1.0, 1.0, 0.0]), 1 - np.sqrt(0.5), rtol=1e-6)
