"""Digits (8x8, 10 classes) with a ViT (2x2 patches, 4 layers, d 64, class token).

Run:
  jaxdl train digits_vit            # workdir runs/digits_vit
  jaxdl train digits_vit:smoke      # a few steps, for tests

Setup: sklearn digits scaled to [0, 1], the fixed stratified 80/20 split (1437 / 360), batch 128,
AdamW (lr 2e-3, weight decay 1e-4 on kernels), warmup + cosine, 2000 steps.

Expected: test accuracy >= 0.95 (eval/accuracy in the final summary).
"""

from jaxdl.config import base_config
from jaxdl.data import default_data_config
from jaxdl.optim import default_optim_config


def get_config(arg=None):
  c = base_config()
  c.name = "digits_vit"
  c.description = "Digits classification with a ViT (2x2 patches, 4 layers, d 64, class token)"
  c.task = "classification"
  c.data = default_data_config("digits")
  c.data.batch_size = 128
  c.model = dict(name="vit", patch_size=2, d_model=64, n_layer=4, n_head=4, out=10, pool="cls",
                 dropout=0.0)
  c.optim = default_optim_config()
  c.optim.name = "adamw"
  c.optim.lr = 2e-3
  c.optim.weight_decay = 1e-4
  c.optim.schedule.name = "warmup_cosine"
  c.train.steps = 2000
  c.train.eval_every = 500
  c.train.log_every = 20
  c.train.ckpt_every = 500
  c.train.best_metric = "eval/accuracy"
  c.train.best_mode = "max"
  if arg == "smoke":
    c.train.steps = 20
    c.train.eval_every = 10
    c.train.ckpt_every = 10
  elif arg is not None:
    raise ValueError(f"unknown arg {arg!r}; expected None or 'smoke'")
  return c
