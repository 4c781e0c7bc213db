"""Digits (8x8, 10 classes) with a ViT (2x2 patches, 4 pre-LN layers, d 64, class token).

Run:
  jaxdl train digits_vit            # workdir runs/digits_vit
  jaxdl train digits_vit:smoke      # a few steps, for tests

Setup: experiments/_digits.py (batch 128, AdamW 2e-3, warmup + cosine), 2000 steps.

Expected: test accuracy >= 0.95 (eval/accuracy in the final summary; measured 0.981).
"""

from _digits import digits_config


def get_config(arg=None):
  model = dict(name="vit", patch_size=2, d_model=64, n_layer=4, n_head=4, out=10, pool="cls",
               dropout=0.0)
  return digits_config(
      "digits_vit",
      "Digits classification with a ViT (2x2 patches, 4 pre-LN layers, d 64, class token)",
      model=model, steps=2000, arg=arg)
