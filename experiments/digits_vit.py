"""Digits (8x8, 10 classes) with a ViT (2x2 patches, 4 pre-LN layers, d 64, class token).

Expected: test accuracy >= 0.95 (eval/accuracy in the final summary; measured 0.981).

  jaxdl train digits_vit            # workdir runs/digits_vit
  jaxdl train digits_vit:smoke      # a few steps, for tests

The `vit` model at its defaults (2x2 patches: 16 tokens and a class token, 4 pre-LN layers of
width 64 with 4 heads) under `jaxdl.course.supervised_configs.digits_classifier` (batch 128,
AdamW 2e-3, warmup + cosine), 2000 steps.
"""

from jaxdl.config import parse_arg
from jaxdl.course.supervised_configs import digits_classifier
from jaxdl.models import model_config


def get_config(arg=None):
  smoke = parse_arg(arg, smoke=False).smoke
  return digits_classifier(
      "digits_vit",
      "Digits classification with a ViT (2x2 patches, 4 pre-LN layers, d 64, class token)",
      model_config("vit"), steps=2000, smoke=smoke)
