"""Digits (8x8, 10 classes) with a LSTM reading the 8 image rows as 8 time steps.

Run:
  jaxdl train digits_lstm            # workdir runs/digits_lstm
  jaxdl train digits_lstm:smoke      # a few steps, for tests

Setup: `jaxdl.course.supervised_configs.digits_classifier` (batch 128, AdamW 2e-3, warmup +
cosine) for 2000 steps; the `lstm` model at its defaults: one layer of 128 units, each row of 8
pixels one input step, the last hidden state read out to 10 logits.
Expected: test accuracy >= 0.95 (eval/accuracy in the final summary; measured 0.978).
"""

from jaxdl.config import parse_arg
from jaxdl.course.supervised_configs import digits_classifier
from jaxdl.models import model_config


def get_config(arg=None):
  return digits_classifier(
      "digits_lstm", "Digits classification with a LSTM reading the 8 image rows as 8 time steps",
      model_config("lstm"), steps=2000, smoke=parse_arg(arg, smoke=False).smoke)
