"""jaxdl.data.digit_tokens: the digits as class-prefixed 16-level token sequences."""

import numpy as np

from jaxdl.config import load_config
from jaxdl.data import default_data_config, digit_tokens, digits_split, make_dataset


def test_tokens_are_the_quantized_pixels_after_the_class_token():
  x_tr, y_tr, _, _ = digits_split()
  x_NxP, y_NxP = digit_tokens.sequences(x_tr[:5], y_tr[:5])
  assert x_NxP.shape == y_NxP.shape == (5, 64)
  np.testing.assert_array_equal(x_NxP[:, 0], 16 + y_tr[:5])
  np.testing.assert_array_equal(x_NxP[:, 1:], y_NxP[:, :-1])  # y is x shifted by one
  q = digit_tokens.quantize(np.arange(17))
  np.testing.assert_array_equal(q, np.minimum(np.arange(17) * 16 // 17, 15))
  # Each pixel value comes back within half a bin (17/32) of where it was.
  assert np.abs(digit_tokens.dequantize(q) - np.arange(17)).max() <= 17 / 32 + 1e-6


def test_the_source_serves_the_fixed_split_to_the_lm_task():
  config = load_config("ar_digits:smoke")[0]
  assert config.data.to_dict() == default_data_config("digit_tokens").to_dict()
  ds = make_dataset(config)
  info = ds.info
  assert (info["kind"], info["vocab_size"], info["num_train"], info["num_eval"]) == (
      "lm", 26, 1437, 360)
  batch = next(ds.train_iter())
  assert batch["x"].shape == (64, 64) and batch["x"].dtype == np.int32
