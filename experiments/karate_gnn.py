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

from jaxdl.config import parse_arg, smoke
from jaxdl.course.supervised_configs import karate_gnn


def get_config(arg=None):
  args = parse_arg(arg, gin=False, smoke=False)
  c = karate_gnn("karate_gnn", "GCN/GIN node classification on Zachary's karate club from two "
                 "labels", conv="gin" if args.gin else "gcn")
  return smoke(c) if args.smoke else c
