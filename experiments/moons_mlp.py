"""BatchNorm vs plain 3x64 ReLU MLP on make_moons (the course's BatchNorm comparison).

Run:
  jaxdl train experiments/moons_mlp.py            # plain MLP, workdir runs/moons_mlp
  jaxdl train experiments/moons_mlp.py:bn         # with BatchNorm after each hidden layer
  jaxdl train moons_mlp:smoke                     # 20 steps, for tests
  jaxdl train moons_mlp:bn,smoke                  # args compose

Setup: make_moons(n=1000, noise=0.25, seed 42), full batch (1000), a 2 -> 64 -> 64 -> 64 -> 1 ReLU
MLP with a sigmoid/BCE output, Adam lr 0.01, 200 epochs (= 200 full-batch steps), no clipping,
no weight decay.

Expected: the BCE training loss over the 200 steps is lower with BatchNorm than without (the
course's figure; claim `batchnorm_moons`, the mean of the curve, over seeds 0-2: BN - plain =
-0.036 [95% CI -0.041, -0.031]; seed 0 0.111 vs 0.144 from jaxdl train, 0.108 vs 0.144 in the
claim's vmapped program); both reach
about 0.9+ accuracy on a fresh moons draw. BatchNorm's full-batch curve oscillates at this lr,
so its last value alone moves with the compiler's flags.
"""

from jaxdl.config import base_config, parse_arg, smoke
from jaxdl.data import default_data_config
from jaxdl.models import model_config
from jaxdl.optim import default_optim_config


def get_config(arg=None):
  args = parse_arg(arg, bn=False, plain=False, smoke=False)
  if args.bn and args.plain:
    raise ValueError("args 'bn' and 'plain' exclude each other")
  c = base_config()
  c.name, c.task = "moons_mlp", "binary"
  c.description = "BatchNorm vs plain 3x64 ReLU MLP on make_moons (BCE, Adam 0.01, full batch)"
  c.data = default_data_config("moons")
  c.data.batch_size = 1000
  c.model = model_config("mlp", norm="batch" if args.bn else "none")  # 3 x 64 ReLU, 1 output
  c.optim = default_optim_config("adam", lr=0.01, clip_norm=None, schedule="constant",
                                 warmup_frac=0.0)
  c.train.update(steps=200, eval_every=50, log_every=1, ckpt_every=100,
                 best_metric="eval/accuracy")
  return smoke(c) if args.smoke else c
