"""Digits (8x8, 10 classes) with a MLP (256-256, ReLU, dropout 0.1).

Run:
  jaxdl train digits_mlp            # workdir runs/digits_mlp
  jaxdl train digits_mlp:smoke      # a few steps, for tests

Setup: sklearn digits scaled to [0, 1], the fixed stratified 80/20 split (1437 / 360), batch 128,
AdamW (lr 2e-3, weight decay 1e-4 on kernels), warmup + cosine, 1500 steps.

Expected: test accuracy >= 0.97 (eval/accuracy in the final summary).
"""

from jaxdl.config import base_config
from jaxdl.data import default_data_config
from jaxdl.optim import default_optim_config


def get_config(arg=None):
  c = base_config()
  c.name = "digits_mlp"
  c.description = "Digits classification with a MLP (256-256, ReLU, dropout 0.1)"
  c.task = "classification"
  c.data = default_data_config("digits")
  c.data.batch_size = 128
  c.model = dict(name="mlp", hidden=(256, 256), out=10, activation="relu", norm="none", dropout=0.1,
                 residual=False, init="he")
  c.optim = default_optim_config()
  c.optim.name = "adamw"
  c.optim.lr = 2e-3
  c.optim.weight_decay = 1e-4
  c.optim.schedule.name = "warmup_cosine"
  c.train.steps = 1500
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
