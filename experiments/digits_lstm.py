"""Digits (8x8, 10 classes) with a LSTM reading the 8 image rows as 8 time steps.

Run:
  jaxdl train digits_lstm            # workdir runs/digits_lstm
  jaxdl train digits_lstm:smoke      # a few steps, for tests

Setup: experiments/_digits.py (batch 128, AdamW 2e-3, warmup + cosine), 2000 steps.

Expected: test accuracy >= 0.95 (eval/accuracy in the final summary; measured 0.978).
"""

from _digits import digits_config


def get_config(arg=None):
  model = dict(name="lstm", hidden=128, num_layers=1, out=10)
  return digits_config(
      "digits_lstm", "Digits classification with a LSTM reading the 8 image rows as 8 time steps",
      model=model, steps=2000, arg=arg)
