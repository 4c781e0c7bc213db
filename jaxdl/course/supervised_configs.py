"""Shared configs of the supervised course experiments: the bases that more than one experiment
builds on, so no experiment imports another.

  digits_classifier  8x8 digits classification (digits_mlp, digits_cnn, digits_lstm, digits_vit)
  karate_gnn         node classification on Zachary's karate club (karate_gnn, gnn_depth)
  stdlib_gpt         a small GPT on the Python standard library's sources (char_gpt, bpe_gpt,
                     prepost_ln)

Each builds on `jaxdl.config.base_config()`; the model section is `jaxdl.models.model_config`
(every field of the model class, so any can be `--set`), the optimizer section
`jaxdl.optim.default_optim_config` with only what differs from its defaults. Smoke sizes are the
experiments' own (`jaxdl.config.smoke`).
"""

from __future__ import annotations

from jaxdl import config as jconfig
from jaxdl.config import base_config
from jaxdl.data import default_data_config
from jaxdl.models import model_config
from jaxdl.optim import default_optim_config


def digits_classifier(name: str, description: str, model, *, steps: int, smoke: bool = False):
  """Digits scaled to [0, 1], the fixed 1437 / 360 split, batch 128, `model` (a model section),
  AdamW 2e-3 (decay 1e-4 on kernels) with 5% warmup and cosine, clipped at 1; `steps` updates,
  evaluated and checkpointed every 500, the best by eval accuracy kept; `smoke`: 20 steps."""
  c = base_config()
  c.name, c.description, c.task = name, description, "classification"
  c.data = default_data_config("digits")
  c.data.batch_size = 128
  c.model = model
  c.optim = default_optim_config("adamw", lr=2e-3, weight_decay=1e-4)
  c.train.update(steps=steps, eval_every=500, log_every=20, ckpt_every=500,
                 best_metric="eval/accuracy")
  return jconfig.smoke(c) if smoke else c


def digits_cnn(smoke: bool = False):
  """experiments/digits_cnn.py's config (`smoke`: its `:smoke` size): the CNN of `model_config`
  with dropout 0.1 on `digits_classifier`'s setup for 1500 steps. Also the judge of generated
  digits (`jaxdl.course.digits_judge`), built here so that procedure loads no experiment."""
  return digits_classifier(
      "digits_cnn", "Digits classification with a CNN (two conv-ReLU-pool blocks, dense head)",
      model_config("cnn", dropout=0.1), steps=1500, smoke=smoke)


def karate_gnn(name: str, description: str, *, conv: str = "gcn"):
  """The karate club graph (34 members, one-hot ids) with only the two leaders' labels in the
  loss; the `gnn` model at its defaults (2 layers of width 16, 2 logits per node) with `conv`;
  AdamW 0.01 (decay 5e-4 on kernels), constant, no clipping, 200 full-graph steps."""
  c = base_config()
  c.name, c.description, c.task = name, description, "node_classification"
  c.data = default_data_config("karate")
  c.model = model_config("gnn", conv=conv)
  c.optim = default_optim_config("adamw", lr=0.01, weight_decay=5e-4, clip_norm=None,
                                 schedule="constant", warmup_frac=0.0)
  c.train.update(steps=200, eval_every=50, log_every=10, ckpt_every=200,
                 best_metric="eval/accuracy")
  return c


def stdlib_gpt(name: str, description: str):
  """Bytes of the stdlib's .py files (the `text` source), context 64, batch 32, 256 val windows;
  a pre-LN GPT with d 128, 4 layers, 4 heads, learned positions, tied embeddings (the `gpt`
  defaults; the 4 layers unrolled in one scan step, faster on CPU); AdamW 3e-3 (decay 0.1 on
  kernels), clipped at 1, 5% warmup then cosine to 10%; 800 steps, the best by eval loss."""
  c = base_config()
  c.name, c.description, c.task = name, description, "lm"
  c.data = default_data_config("text")
  c.data.update(context_length=64, batch_size=32, eval_batch_size=64, max_eval_windows=256)
  c.model = model_config("gpt", block_size=64, scan_unroll=4)
  c.optim = default_optim_config("adamw", lr=3e-3, weight_decay=0.1)
  c.train.update(steps=800, eval_every=200, log_every=10, ckpt_every=200,
                 best_metric="eval/loss", best_mode="min")
  return c
