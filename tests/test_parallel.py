"""jit-over-a-mesh vs pmap vs one device on 4 emulated CPU devices (same losses and params)."""

import jax
import numpy as np
import pytest

from jaxdl.config import load_config
from jaxdl.train import run
from jaxdl.train.checkpoint import load_state
from jaxdl.train.writers import read_metrics

STEPS = 8


def _train(tmp_path, name, strategy, devices, norm="batch"):
  config, _ = load_config(f"moons_mlp:{'bn' if norm == 'batch' else 'plain'}", [
      f"parallel.strategy='{strategy}'", f"parallel.devices={devices}",
      "data.batch_size=200", f"train.steps={STEPS}", "train.eval_every=4",
      "train.ckpt_every=0", "train.plot=False",
      # SGD, not Adam: the biases feeding BatchNorm have an exactly-zero true gradient, and Adam's
      # g / sqrt(v) would blow their float rounding noise up to lr-sized steps.
      "optim.name='sgd'", "optim.lr=0.1"])
  workdir = tmp_path / name
  summary = run(config, workdir, progress=False)
  losses = [r["loss"] for r in read_metrics(workdir, "train")]
  _, state = load_state(workdir)
  return summary, np.array(losses), state


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  assert jax.device_count() == 4
  tmp = tmp_path_factory.mktemp("parallel")
  return {name: _train(tmp, name, strategy, devices)
          for name, strategy, devices in [("one", "jit", 1), ("jit", "jit", 4),
                                          ("pmap", "pmap", 4)]}


@pytest.mark.parametrize("name", ["jit", "pmap"])
def test_same_losses_params_and_batch_stats_as_one_device(runs, name):
  summary_1, losses_1, state_1 = runs["one"]
  summary_n, losses_n, state_n = runs[name]
  assert len(losses_1) == STEPS
  np.testing.assert_allclose(losses_n, losses_1, rtol=1e-5, atol=1e-6)
  close = lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4,
                                                  atol=1e-5)
  jax.tree.map(close, state_n["params"], state_1["params"])
  # BatchNorm running statistics see the global batch (cross-device mean and variance).
  jax.tree.map(close, state_n["model_state"], state_1["model_state"])
  np.testing.assert_allclose(summary_n["eval"]["loss"], summary_1["eval"]["loss"], rtol=1e-4)


def test_pmap_batchnorm_uses_cross_device_statistics(runs, tmp_path):
  # Without the device-axis average each device would normalize with its own 50 examples, and the
  # first step's loss would differ from the single-device one.
  from jaxdl.train import strategies
  strategy = strategies.make_strategy("pmap", 4)
  assert strategy.model_overrides == {"bn_axis_name": "batch"}
  first_1 = runs["one"][1][0]
  first_pmap = runs["pmap"][1][0]
  np.testing.assert_allclose(first_pmap, first_1, rtol=1e-6)


def test_batch_not_divisible_by_devices_is_config_error(tmp_path):
  config, _ = load_config("moons_mlp", ["data.batch_size=998", "train.steps=2"])
  with pytest.raises(ValueError, match="data.batch_size: 998 does not divide evenly over 4"):
    run(config, tmp_path / "x", progress=False)
  assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("args,key", [
    (("ring", 0), "parallel.strategy"),
    (("jit", 9), "parallel.devices"),
    (("pmap", 0, 0, 2), "parallel.expert"),
    (("pmap", 0, 0, 1, 2), "parallel.tensor"),
    (("fsdp", 0, 3), "parallel.fsdp"),
    (("jit", 0, 0, 3), "parallel.expert"),
    (("jit", 0, 0, 1, 3), "parallel.tensor"),
])
def test_every_bad_parallel_setting_is_a_config_error(args, key):
  """One line naming the setting, raised before any mesh or program exists."""
  from jaxdl.schema import ConfigError
  from jaxdl.train import strategies
  with pytest.raises(ConfigError, match=key) as e:
    strategies.make_strategy(*args)
  assert "\n" not in str(e.value)


def test_one_mesh_names_all_five_axes():
  """jit and fsdp are the same class over one ('data', 'fsdp', 'expert', 'tensor') mesh; the
  axes of one device split nothing, so plain jit replicates every leaf."""
  from jax.sharding import PartitionSpec as P
  from jaxdl.train import strategies
  jit, fsdp = strategies.make_strategy("jit", 4), strategies.make_strategy("fsdp", 4, fsdp=2)
  assert type(jit) is type(fsdp)
  assert dict(jit.mesh.shape) == {"data": 4, "fsdp": 1, "expert": 1, "sequence": 1, "tensor": 1}
  assert dict(fsdp.mesh.shape) == {"data": 2, "fsdp": 2, "expert": 1, "sequence": 1, "tensor": 1}
  state = {"w": np.zeros((8, 6), np.float32)}
  assert jit.state_shardings(state)["w"].spec == P()
  assert fsdp.state_shardings(state)["w"].spec == P("fsdp", None)
  assert jit.describe()["mesh"] == {"data": 4} and not jit.splits_state and fsdp.splits_state
