"""Shared setup of the digits classification experiments (not an experiment itself)."""

from jaxdl.config import base_config
from jaxdl.data import default_data_config
from jaxdl.optim import default_optim_config


def digits_config(name: str, description: str, model: dict, steps: int, arg=None):
  """Digits scaled to [0, 1], the fixed 1437 / 360 split, batch 128, AdamW 2e-3 (decay 1e-4 on
  kernels) with 5% warmup and cosine; eval and checkpoints every 500 steps, best by accuracy."""
  c = base_config()
  c.name = name
  c.description = description
  c.task = "classification"
  c.data = default_data_config("digits")
  c.data.batch_size = 128
  c.model = model
  c.optim = default_optim_config()
  c.optim.name = "adamw"
  c.optim.lr = 2e-3
  c.optim.weight_decay = 1e-4
  c.optim.schedule.name = "warmup_cosine"
  c.train.steps = steps
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
