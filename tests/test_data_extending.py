"""Extending jaxdl.data: a new source is one registered class (its settings, checks and
batches come with it), and the package's modules import each other without a circle (function-
level imports included)."""

import dataclasses

import ml_collections
import numpy as np
import pytest

import jaxdl.data as data


@data.register_source("ramp")
@dataclasses.dataclass(frozen=True)
class Ramp(data.DataSource):
  """x = 0, 1, ..., n - 1 as (n, 1) float32 rows; eval is the same rows."""

  batch_size: int = 16
  n: int = data.setting(64, data.POSITIVE)

  def build(self) -> data.Source:
    x = {"x": np.arange(self.n, dtype=np.float32)[:, None]}
    return data.arrays_source("generative", x, x)


def test_a_new_source_is_one_registered_class():
  cfg = data.default_data_config("ramp")
  assert cfg.to_dict() == dict(name="ramp", batch_size=16, eval_batch_size=None, shuffle=True,
                               n=64)
  ds = data.make_dataset(ml_collections.ConfigDict({"seed": 0, "data": cfg}))
  assert (ds.info["kind"], ds.info["num_train"], ds.info["steps_per_epoch"]) == ("generative",
                                                                                 64, 4)
  batch = next(ds.train_iter())
  assert batch["x"].shape == (16, 1) and set(batch["x"][:, 0]) <= set(range(64))
  cfg.n = 0
  with pytest.raises(ValueError, match="^data.n: must be > 0, got 0$"):
    data.make_dataset(ml_collections.ConfigDict({"seed": 0, "data": cfg}))


def _data_imports() -> dict[str, set[str]]:
  """{module: the jaxdl.data modules it imports}, function-level imports included (the
  architecture test sees module-level ones only)."""
  import ast
  import os
  root = os.path.dirname(data.__file__)
  names = {f[:-3] for f in os.listdir(root) if f.endswith(".py") and f != "__init__.py"}
  graph = {}
  for name in names:
    with open(os.path.join(root, f"{name}.py")) as f:
      tree = ast.parse(f.read())
    deps = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and node.module == "jaxdl.data":
        deps |= {a.name for a in node.names} & names
      elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jaxdl.data."):
        deps.add(node.module.split(".")[2])
      elif isinstance(node, ast.Import):
        deps |= {a.name.split(".")[2] for a in node.names if a.name.startswith("jaxdl.data.")}
    graph[name] = deps - {name}
  return graph


def test_no_import_circles_inside_jaxdl_data():
  graph = _data_imports()
  assert "prepare" in graph["chat"]  # the walk sees imports (chat prepares through prepare)
  done, path = set(), []

  def visit(m):
    if m in path:
      raise AssertionError("import circle: " + " -> ".join(path[path.index(m):] + [m]))
    if m in done:
      return
    path.append(m)
    for d in sorted(graph[m]):
      visit(d)
    path.pop()
    done.add(m)
  for m in sorted(graph):
    visit(m)
