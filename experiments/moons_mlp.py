"""BatchNorm vs plain 3x64 ReLU MLP on make_moons (the course's BatchNorm comparison).

Run:
  jaxdl train experiments/moons_mlp.py            # plain MLP, workdir runs/moons_mlp
  jaxdl train experiments/moons_mlp.py:bn         # with BatchNorm after each hidden layer
  jaxdl train moons_mlp:smoke                     # 20 steps, for tests
  jaxdl train moons_mlp:bn,smoke                  # args compose

Setup: make_moons(n=1000, noise=0.25, seed 42), full batch (1000), a 2 -> 64 -> 64 -> 64 -> 1 ReLU
MLP with a sigmoid/BCE output, Adam lr 0.01, 200 epochs (= 200 full-batch steps), no clipping,
no weight decay.

Expected: the BCE training loss after 200 steps is lower with BatchNorm than without (the
course's figure); both reach about 0.9+ accuracy on a fresh moons draw.
"""

from jaxdl.config import base_config, parse_arg
from jaxdl.data import default_data_config
from jaxdl.optim import default_optim_config


def get_config(arg=None):
  args = parse_arg(arg, bn=False, plain=False, smoke=False)
  if args.bn and args.plain:
    raise ValueError("args 'bn' and 'plain' exclude each other")
  c = base_config()
  c.name = "moons_mlp"
  c.description = "BatchNorm vs plain 3x64 ReLU MLP on make_moons (BCE, Adam 0.01, full batch)"
  c.task = "binary"
  c.data = default_data_config("moons")
  c.data.batch_size = 1000
  c.model = dict(name="mlp", hidden=(64, 64, 64), out=1, activation="relu",
                 norm="batch" if args.bn else "none", dropout=0.0, residual=False)
  c.optim = default_optim_config()
  c.optim.name = "adam"
  c.optim.lr = 0.01
  c.optim.weight_decay = 0.0
  c.optim.clip_norm = None
  c.optim.schedule.name = "constant"
  c.optim.schedule.warmup_frac = 0.0
  c.train.steps = 200
  c.train.eval_every = 50
  c.train.log_every = 1
  c.train.ckpt_every = 100
  c.train.best_metric = "eval/accuracy"
  c.train.best_mode = "max"
  if args.smoke:
    c.train.steps = 20
    c.train.eval_every = 10
    c.train.ckpt_every = 10
  return c
