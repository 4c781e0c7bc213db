"""FSDP on 4 emulated CPU devices: the shape rule, numbers equal to data parallelism, sharded
state, and checkpoints that restore across strategies and meshes."""

import logging
import shutil

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxdl.config import load_config
from jaxdl.schema import ConfigError
from jaxdl.train import checkpoint as jckpt
from jaxdl.train import build, run, strategies
from jaxdl.train.checkpoint import load_state
from jaxdl.train.mesh import MeshStrategy
from jaxdl.train.sharding_rules import fsdp_spec
from jaxdl.train.writers import read_metrics

STEPS = 8


def _config(strategy, fsdp=0, steps=STEPS):
  config, _ = load_config("moons_mlp:plain", [
      f"parallel.strategy='{strategy}'", f"parallel.fsdp={fsdp}", "data.batch_size=200",
      f"train.steps={steps}", "train.eval_every=4", "train.ckpt_every=4", "train.plot=False",
      "optim.name='adamw'", "optim.lr=0.01", "optim.weight_decay=0.01"])
  return config


def _train(workdir, strategy, fsdp=0):
  summary = run(_config(strategy, fsdp), workdir, progress=False)
  _, state = load_state(workdir)
  return summary, np.array([r["loss"] for r in read_metrics(workdir, "train")]), state


def _close(a, b):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  assert jax.device_count() == 4
  tmp = tmp_path_factory.mktemp("fsdp")
  return tmp, {"jit": _train(tmp / "jit", "jit"), "fsdp": _train(tmp / "fsdp", "fsdp", 4)}


def test_shape_rule_splits_largest_divisible_dimension():
  assert fsdp_spec((2, 64), 4) == P(None, "fsdp")
  assert fsdp_spec((64, 1), 4) == P("fsdp", None)
  assert fsdp_spec((8, 12), 4) == P(None, "fsdp")  # 12 > 8, both divisible
  assert fsdp_spec((12, 6), 4) == P("fsdp", None)  # 6 is not divisible by 4
  assert fsdp_spec((4, 4), 4) == P("fsdp", None)   # ties: the first
  assert fsdp_spec((3, 5), 4) == P()
  assert fsdp_spec((), 4) == P()
  assert fsdp_spec((64,), 1) == P()


def test_fsdp_matches_data_parallelism(runs):
  _, r = runs
  (sum_j, loss_j, state_j), (sum_f, loss_f, state_f) = r["jit"], r["fsdp"]
  assert len(loss_j) == STEPS and len(loss_f) == STEPS
  np.testing.assert_allclose(loss_f, loss_j, rtol=1e-5, atol=1e-6)
  jax.tree.map(_close, state_f["params"], state_j["params"])
  jax.tree.map(_close, state_f["opt_state"], state_j["opt_state"])
  np.testing.assert_allclose(sum_f["eval"]["loss"], sum_j["eval"]["loss"], rtol=1e-5)


def test_state_restores_sharded_and_odd_parameters_are_reported(runs, caplog):
  tmp, _ = runs
  config = _config("fsdp", 4)
  r = build(config)
  strategy, abstract = r.strategy, r.abstract_state()
  with caplog.at_level(logging.INFO, logger="jaxdl"):
    target = strategy.state_shardings(abstract)
  # The 1-wide output bias has no dimension divisible by 4: replicated and named in the table.
  assert "replicated" in caplog.text and "(1,)" in caplog.text
  assert [s for _, s in strategy.replicated_params(abstract)] == [(1,)]
  ckpt = jckpt.Checkpointer(tmp / "fsdp" / "checkpoints")
  step, state, _ = ckpt.restore(jckpt.abstract_like(abstract, target))
  ckpt.close()
  assert step == STEPS
  for leaf in jax.tree.leaves(state.params) + jax.tree.leaves(state.opt_state):
    spec = fsdp_spec(leaf.shape, 4)
    shard = leaf.addressable_shards[0].data.shape
    if spec == P():
      assert shard == leaf.shape
    else:  # a quarter of the split dimension on each device
      axis = list(spec).index("fsdp")
      assert shard[axis] * 4 == leaf.shape[axis]


@pytest.mark.parametrize("src,dst,fsdp", [("fsdp", "jit", 0), ("jit", "fsdp", 2)])
def test_checkpoint_restores_across_strategies(runs, src, dst, fsdp):
  tmp, r = runs
  workdir = tmp / f"{src}_to_{dst}"
  shutil.copytree(tmp / src, workdir)
  shutil.rmtree(workdir / "checkpoints" / str(STEPS))  # resume from step 4 on the other layout
  summary = run(_config(dst, fsdp), workdir, progress=False)
  assert summary["start_step"] == STEPS // 2
  _, state = load_state(workdir)
  jax.tree.map(_close, state["params"], r[src][2]["params"])
  resumed = [x["loss"] for x in read_metrics(workdir, "train")][-STEPS // 2:]
  np.testing.assert_allclose(resumed, r[src][1][-STEPS // 2:], rtol=1e-5, atol=1e-6)


def test_fsdp_axis_must_divide_devices():
  with pytest.raises(ConfigError, match="parallel.fsdp: 3 does not divide the 4 devices"):
    strategies.make_strategy("fsdp", 0, fsdp=3)
  strategy = strategies.make_strategy("fsdp", 0, fsdp=2)
  assert isinstance(strategy, MeshStrategy)
  assert dict(strategy.mesh.shape) == {"data": 2, "fsdp": 2, "expert": 1,
      "sequence": 1, "tensor": 1}
  assert strategy.describe()["mesh"] == {"data": 2, "fsdp": 2}


def test_a_run_traces_its_init_once_and_builds_the_same_sharded_state(monkeypatch):
  """`abstract_state` and `init_state` share one trace of the model's and optimizer's init
  (`Run.init_fn` is one function, which jax traces once whatever shardings it is jitted with);
  the state is bit-identical, and placed identically, to jitting it with those shardings
  directly."""
  from jaxdl.train import assembly
  traced = []
  original = assembly.create_train_state

  def counting(*args, **kwargs):
    traced.append(1)
    return original(*args, **kwargs)

  monkeypatch.setattr(assembly, "create_train_state", counting)
  r = build(_config("fsdp", 4))
  shardings = r.strategy.state_shardings(r.abstract_state())
  state = r.init_state(shardings)
  assert len(traced) == 1
  direct = jax.jit(r.init_fn(), out_shardings=shardings)(r.init_key)
  assert len(traced) == 1  # the direct path reuses the trace too
  assert jax.tree.structure(state) == jax.tree.structure(direct)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(state), jax.tree.leaves(direct)):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
    assert a.sharding == b.sharding, jax.tree_util.keystr(path)


def test_a_saved_state_hands_orbax_one_buffer_per_replicated_leaf():
  """`single_copy` (the state a checkpoint saves) gives orbax a replicated leaf's first-device
  buffer, not the 4-device array it would save in four slices (a compiled program per leaf and
  device on a CPU); a sharded leaf stays sharded. The values are the same; restoring onto
  other shardings is `test_checkpoint_restores_across_strategies`."""
  strategy = MeshStrategy("fsdp", fsdp=4)
  mesh = strategy.mesh
  state = {"w": jax.device_put(np.arange(32.0).reshape(8, 4),
                               jax.sharding.NamedSharding(mesh, P("fsdp"))),
           "b": jax.device_put(np.arange(3.0), jax.sharding.NamedSharding(mesh, P()))}
  saved = strategy.single_copy(state)
  assert len(saved["b"].sharding.device_set) == 1 and saved["b"].shape == (3,)
  assert saved["w"] is state["w"]
  np.testing.assert_array_equal(saved["b"], np.arange(3.0))
