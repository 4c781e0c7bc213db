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
  model = build(config).model
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


def test_a_model_without_a_compute_dtype_is_refused_under_bf16():
  """Silently training in fp32 what the config says is bf16 is refused with the key named."""
  import flax.linen as nn
  from jaxdl.optim import precision
  from jaxdl.train.assembly import apply_precision

  class NoDtype(nn.Module):
    @nn.compact
    def __call__(self, x, *, train):
      return nn.Dense(2)(x)

  with pytest.raises(ValueError, match="train.precision: model 'NoDtype' has no `dtype`"):
    apply_precision(NoDtype(), precision.get_policy("bf16"), {})
  assert apply_precision(NoDtype(), precision.get_policy("fp32"), {}) is not None


def test_every_registered_model_computes_in_the_policy_dtype():
  """Each model family of jaxdl.models, built from its defaults, takes the policy's compute
  dtype."""
  import ml_collections
  from jaxdl import models
  from jaxdl.optim import precision
  from jaxdl.train.assembly import apply_precision
  policy = precision.get_policy("bf16")
  assert {"mlp", "gpt", "cnn", "denoiser_mlp", "denoiser_unet", "lstm", "vit"} <= set(
      models.MODELS)
  for name in sorted(models.MODELS):
    if not models.MODELS[name].__module__.startswith("jaxdl.models."):
      continue  # registered by another package (e.g. the course's planted-bug model)
    model = models.build_model(ml_collections.ConfigDict({"name": name}))
    assert apply_precision(model, policy, {}).dtype == jnp.bfloat16, name
