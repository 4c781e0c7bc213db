"""Mixed precision through the whole engine: bf16 and fp16 moons_mlp match fp32 accuracy."""

import jax.numpy as jnp
import pytest

from jaxdl.config import load_config
from jaxdl.train import build, run


def _run(tmp_path, precision):
  config, _ = load_config("moons_mlp", [f"train.precision='{precision}'", "train.plot=False",
                                        "train.ckpt_every=0", "train.eval_every=0"])
  return run(config, tmp_path / precision, progress=False)


def test_policy_sets_compute_dtype_and_keeps_fp32_params():
  config, _ = load_config("moons_mlp", ["train.precision='bf16'"])
  *_, model = build(config)
  assert model.dtype == jnp.bfloat16 and model.param_dtype == jnp.float32


@pytest.fixture(scope="module")
def fp32_accuracy(tmp_path_factory):
  return _run(tmp_path_factory.mktemp("fp32"), "fp32")["eval"]["accuracy"]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_reaches_fp32_accuracy_within_one_point(tmp_path, precision,
                                                              fp32_accuracy):
  fp32 = fp32_accuracy
  low = _run(tmp_path, precision)["eval"]["accuracy"]
  assert fp32 > 0.9
  assert abs(low - fp32) <= 0.01, (precision, low, fp32)
