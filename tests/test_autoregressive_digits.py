"""jaxdl.course.autoregressive_digits: exact bits/dim against a known number, and ar_digits'
post-training procedure end to end at its smoke size."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from jaxdl.course import autoregressive_digits as ar
from jaxdl.data import digit_tokens


class _Uniform:
  """A model whose logits are all equal: every pixel level has probability 1/16."""

  def apply(self, variables, x, train=False):
    del variables, train
    return jnp.zeros(x.shape + (digit_tokens.VOCAB,))


def test_a_uniform_model_scores_four_bits_per_pixel():
  (x, y), _ = digit_tokens.split_sequences()
  np.testing.assert_allclose(ar.bits_per_dim(_Uniform(), {}, x[:8], y[:8]), 4.0, rtol=1e-6)


@pytest.mark.slow
def test_ar_digits_smoke_trains_measures_and_judges(tmp_path):
  from jaxdl.config import load_config
  from jaxdl.train import run
  config, _ = load_config("ar_digits:smoke", ["train.plot=False", "train.steps=4",
                                              "train.eval_every=4", "train.ckpt_every=4"])
  run(config, tmp_path, progress=False)
  out = ar.evaluate_ar_digits(config, tmp_path)["ar_digits"]
  assert out["step"] == 4 and 0 < out["bits_per_dim"]["test"] < 5
  assert out["samples"]["num"] == 10 * config.gen.per_class
  assert json.loads((tmp_path / "ar_digits.json").read_text())["step"] == 4
  assert (tmp_path / "digits_grid.png").exists()
  assert (tmp_path / "classifier" / "config.json").exists()  # the judge, at its smoke size
  assert json.loads((tmp_path / "classifier" / "config.json").read_text())["smoke"] is True
