"""Digits (8x8, 10 classes) with a MLP (256-256, ReLU, He init, dropout 0.1).

Run:
  jaxdl train digits_mlp            # workdir runs/digits_mlp
  jaxdl train digits_mlp:smoke      # a few steps, for tests

Setup: experiments/_digits.py (batch 128, AdamW 2e-3, warmup + cosine), 1500 steps.

Expected: test accuracy >= 0.97 (eval/accuracy in the final summary; measured 0.978).
"""

from _digits import digits_config


def get_config(arg=None):
  model = dict(name="mlp", hidden=(256, 256), out=10, activation="relu", norm="none",
               dropout=0.1, residual=False, init_name="he")
  return digits_config(
      "digits_mlp", "Digits classification with a MLP (256-256, ReLU, He init, dropout 0.1)",
      model=model, steps=1500, arg=arg)
