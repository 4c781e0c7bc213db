"""Digits (8x8, 10 classes) with a CNN (two conv-ReLU-pool blocks, dense head).

Run:
  jaxdl train digits_cnn            # workdir runs/digits_cnn
  jaxdl train digits_cnn:smoke      # a few steps, for tests

Setup: experiments/_digits.py (batch 128, AdamW 2e-3, warmup + cosine), 1500 steps.

Expected: test accuracy >= 0.98 (eval/accuracy in the final summary; measured 0.994).
"""

from _digits import digits_config


def get_config(arg=None):
  model = dict(name="cnn", features=(32, 64), kernel=3, pool=2, hidden=128, out=10, norm="none",
               dropout=0.1, init_name="he")
  return digits_config(
      "digits_cnn", "Digits classification with a CNN (two conv-ReLU-pool blocks, dense head)",
      model=model, steps=1500, arg=arg)
