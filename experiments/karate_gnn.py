"""A 2-layer GCN labels Zachary's karate club factions from the two leaders' labels alone.

Run:
  jaxdl train karate_gnn               # GCN, workdir runs/karate_gnn
  jaxdl train karate_gnn:gin           # the GIN layer instead
  jaxdl train karate_gnn:smoke         # 20 steps, for tests (args compose: karate_gnn:gin,smoke)

Setup: the karate club graph (34 members, 78 friendships, one-hot member ids as features); the
train loss sees only the labels of member 0 (Mr. Hi) and member 33 (the officer); evaluation
scores the other 32 members. GNN 34 -> 16 -> 16 (ReLU) -> 2 logits per node, Adam lr 0.01,
weight decay 5e-4 on kernels, 200 full-graph steps.

Expected (measured, seed 0): eval/accuracy 0.969 (31 of the 32 unlabelled members) with the
GCN and 0.969 with the GIN (chance 0.5); the train loss on the two leaders ends below 1e-4.
Deeper stacks over-smooth: see gnn_depth.
"""

from jaxdl.config import base_config, parse_arg
from jaxdl.data import default_data_config
from jaxdl.optim import default_optim_config


def get_config(arg=None):
  args = parse_arg(arg, gin=False, smoke=False)
  c = base_config()
  c.name = "karate_gnn"
  c.description = "GCN/GIN node classification on Zachary's karate club from two labels"
  c.task = "node_classification"
  c.data = default_data_config("karate")
  c.model = dict(name="gnn", conv="gin" if args.gin else "gcn", hidden=16, num_layers=2, out=2,
                 readout="none")
  c.optim = default_optim_config()
  c.optim.name = "adamw"
  c.optim.lr = 0.01
  c.optim.weight_decay = 5e-4
  c.optim.clip_norm = None
  c.optim.schedule.name = "constant"
  c.optim.schedule.warmup_frac = 0.0
  c.train.steps = 200
  c.train.eval_every = 50
  c.train.log_every = 10
  c.train.ckpt_every = 200
  c.train.best_metric = "eval/accuracy"
  c.train.best_mode = "max"
  if args.smoke:
    c.train.steps = 20
    c.train.eval_every = 10
    c.train.ckpt_every = 10
  return c
