"""Tensor parallelism on 4 emulated CPU devices (and 8 in one subprocess): the rules table, the
same losses and parameters as one device (data x tensor, fsdp x tensor, tensor 4, data x fsdp x
tensor), parameters that really split, checkpoints restoring across tensor sizes (2 -> 1 -> 4),
and the bad inputs.

Every run is tests/mesh_runs.py's tiny Llama-shaped GPT through the real engine.
"""

import json
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from jaxdl import cli
from jaxdl.config import ConfigError
from jaxdl.models import build_model, model_config
from jaxdl.train import build, strategies
from jaxdl.train.sharding_rules import param_spec

import warm_python
from mesh_runs import FINAL_ONLY, STEPS, TINY
from mesh_runs import config as _config
from mesh_runs import resume as _resume
from mesh_runs import result as _result
from mesh_runs import same_as_one_device as _same_as_one_device
from mesh_runs import train as _train

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """One device from scratch; data x tensor and fsdp x tensor resumed from its step 2 (a
  checkpoint written without a tensor axis restores onto one), so each compiles one program."""
  assert jax.device_count() == 4
  tmp = tmp_path_factory.mktemp("tensor")
  out = {"one": _train(tmp / "one", "parallel.devices=1")}
  out["data_tensor"] = _resume(tmp / "one", 2, tmp / "data_tensor", "parallel.tensor=2")
  out["fsdp_tensor"] = _resume(tmp / "one", 2, tmp / "fsdp_tensor", "parallel.strategy='fsdp'",
                               "parallel.fsdp=2", "parallel.tensor=2", *FINAL_ONLY)
  return tmp, out


def test_rules_table_names_the_split_dimensions():
  s = {"tensor": 2}
  # Scanned blocks: a leading layer axis, left unnamed.
  assert param_spec("params/h/attn/c_attn/kernel", (2, 32, 128), s) == P(None, None, "tensor")
  assert param_spec("params/h/attn/c_proj/kernel", (2, 32, 32), s) == P(None, "tensor", None)
  assert param_spec("params/h/mlp/c_fc/bias", (2, 128), s) == P(None, "tensor")
  assert param_spec("params/h/mlp/c_proj/kernel", (2, 64, 32), s) == P(None, "tensor", None)
  assert param_spec("params/wte/embedding", (256, 32), s) == P("tensor", None)
  assert param_spec("opt_state/0/trace/lm_head/kernel", (32, 256), s) == P(None, "tensor")
  assert param_spec("params/h/ln_1/scale", (2, 32), s) == P()
  # FSDP takes the largest dimension the names left; experts their own axis.
  both = {"tensor": 2, "fsdp": 2}
  assert param_spec("params/h/attn/c_attn/kernel", (2, 32, 128), both) == P(None, "fsdp",
                                                                              "tensor")
  assert param_spec("params/h/mlp/expert_fc", (2, 4, 32, 64), {**both, "expert": 2}) == P(
      None, "expert", "fsdp", "tensor")
  assert param_spec("params/h/mlp/c_fc/kernel", (2, 32, 6), {"tensor": 4}) == P()  # 6 % 4


@pytest.mark.parametrize("name", ["data_tensor", "fsdp_tensor"])
def test_same_losses_and_parameters_as_one_device(runs, name):
  _, r = runs
  _same_as_one_device(r[name], r["one"])


def test_parameters_split_over_the_tensor_axis(runs):
  _, r = runs
  strategy = build(_config("parallel.strategy='fsdp'", "parallel.fsdp=2",
                           "parallel.tensor=2")).strategy
  assert dict(strategy.mesh.shape) == {"data": 1, "fsdp": 2, "expert": 1,
      "sequence": 1, "tensor": 2}
  params = strategy.place_state(r["fsdp_tensor"][1])
  h = params["h_0"]
  qkv = h["attn"]["c_attn"]["kernel"]  # (D, (H + 2N) K) = (32, 64)
  assert qkv.sharding.spec == P("fsdp", "tensor")
  assert qkv.addressable_shards[0].data.shape == (16, 32)
  assert h["attn"]["c_proj"]["kernel"].sharding.spec == P("tensor", "fsdp")
  assert h["mlp"]["c_fc"]["kernel"].sharding.spec == P("fsdp", "tensor")
  assert h["mlp"]["c_proj"]["kernel"].sharding.spec == P("tensor", "fsdp")
  assert params["wte"]["embedding"].sharding.spec == P("tensor", "fsdp")
  assert params["lm_head"]["kernel"].sharding.spec == P("fsdp", "tensor")


def test_checkpoint_restores_across_tensor_sizes(runs):
  """tensor 2's checkpoint at step 4 resumed at tensor 1 (one device) and at tensor 4: the
  parameters and losses of the uninterrupted one-device run (and 1 -> 2 in the fixture)."""
  tmp, r = runs
  for tensor, sets in ((1, ["parallel.devices=1"]), (4, ["parallel.tensor=4"])):
    workdir = tmp / f"tensor_2_to_{tensor}"
    _same_as_one_device(_resume(tmp / "data_tensor", 4, workdir, *sets, *FINAL_ONLY), r["one"])
    manifest = json.loads((workdir / "checkpoints" / str(STEPS) / "manifest" / "metadata")
                          .read_text())
    assert manifest["mesh"].get("tensor", 1) == tensor


EIGHT = """
import sys
from jaxdl.config import load_config
from jaxdl.train import run
config, _ = load_config("char_gpt:smoke", sys.argv[2:])
run(config, sys.argv[1], progress=False)
"""


def test_eight_devices_data_fsdp_tensor(runs):
  tmp, r = runs
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": os.environ["XLA_FLAGS"].replace("device_count=4", "device_count=8")}
  workdir = tmp / "eight"
  proc = warm_python.run([sys.executable, "-c", EIGHT, str(workdir), *TINY,
                          "parallel.strategy='fsdp'", "parallel.fsdp=2", "parallel.tensor=2",
                          *FINAL_ONLY], env=env, cwd=ROOT, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  manifest = json.loads((workdir / "checkpoints" / str(STEPS) / "manifest" / "metadata")
                        .read_text())
  assert manifest["device_count"] == 8
  assert manifest["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
  _same_as_one_device(_result(workdir), r["one"])


@pytest.mark.parametrize("sets,key", [
    (["parallel.tensor=3"], "the 4 devices"),
    (["parallel.tensor=4", "model.n_head=2", "model.n_kv_head=0"], "model.n_head"),
    (["parallel.tensor=4", "model.n_kv_head=2"], "model.n_kv_head"),
    (["parallel.tensor=4", "model.mlp_hidden=6"], "model.mlp_hidden"),
    (["parallel.tensor=4", "model.vocab_size=258"], "model.vocab_size"),
    (["parallel.strategy='pmap'", "parallel.tensor=2"], "'pmap'"),
])
def test_bad_tensor_config_is_one_line_exit_2(sets, key, tmp_path, capsys):
  argv = ["train", "char_gpt:smoke", "--workdir", str(tmp_path / "w"), "--no-progress"]
  for s in TINY + sets:
    argv += ["--set", s]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].count("parallel.tensor") >= 1 and key in err[0], err
  assert not (tmp_path / "w").exists()


def test_model_without_rules_is_refused():
  """An MLP has nothing the rules split: refused (through `jaxdl train` it is one line, exit 2,
  as above) rather than run replicated on every device of the tensor axis."""
  model = build_model(model_config("mlp"))
  params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 2)),
                                             train=False))["params"]
  with pytest.raises(ConfigError, match=r"^parallel.tensor: model 'mlp' has no parameter that "):
    strategies.check_layout(params, 2, "mlp")
  strategies.check_layout(params, 1, "mlp")
