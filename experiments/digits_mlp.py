"""Digits (8x8, 10 classes) with a MLP (256-256, ReLU, He init, dropout 0.1).

Setup: the 64 pixels flattened into a 256-256 ReLU MLP with He-normal init and dropout 0.1,
trained for 1500 steps by `jaxdl.course.supervised_configs.digits_classifier` (batch 128, AdamW
2e-3, warmup + cosine).

Run `jaxdl train digits_mlp` (workdir runs/digits_mlp), or `jaxdl train digits_mlp:smoke` for a
few steps (tests).

Expected: test accuracy >= 0.97 (eval/accuracy in the final summary; measured 0.978).
"""

from jaxdl.config import parse_arg
from jaxdl.course.supervised_configs import digits_classifier
from jaxdl.models import model_config


def get_config(arg=None):
  model = model_config("mlp", hidden=(256, 256), out=10, dropout=0.1, init_name="he")
  return digits_classifier(
      "digits_mlp", "Digits classification with a MLP (256-256, ReLU, He init, dropout 0.1)",
      model, steps=1500, smoke=parse_arg(arg, smoke=False).smoke)
