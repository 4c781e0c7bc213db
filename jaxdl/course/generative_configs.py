"""Shared configs of the generative experiments (fm_/ddpm_toy2d, fm_/ddpm_digits_cfg).

Each builds on `jaxdl.config.base_config()` and lists every key a user may override.
"""

from __future__ import annotations

from jaxdl.config import base_config, parse_arg
from jaxdl.data import default_data_config
from jaxdl.generative.tasks import default_gen_config
from jaxdl.optim import default_optim_config

DISTRIBUTIONS = ("moons", "8gaussians", "checkerboard", "swissroll")


def _optim():
  """Both families' optimizer: AdamW 2e-3 without decay, clipped at 1, warmup-cosine."""
  c = default_optim_config()
  c.name = "adamw"
  c.lr = 2e-3
  c.weight_decay = 0.0
  c.clip_norm = 1.0
  return c


def toy2d_config(task: str, name: str, arg=None):
  """2-D toys: residual MLP denoiser (4 x 256), AdamW 2e-3 warmup-cosine, batch 256, 8k steps.

  arg: comma-separated: a distribution name (default moons) and/or 'smoke' (300 steps of a small
  model), e.g. 'swissroll,smoke'.
  """
  args = parse_arg(arg, smoke=False, **{d: False for d in DISTRIBUTIONS})
  chosen = [d for d in DISTRIBUTIONS if args[d]]
  if len(chosen) > 1:
    raise ValueError(f"args {chosen} name more than one distribution; give one of "
                     f"{DISTRIBUTIONS}")
  c = base_config()
  c.name = name
  c.task = task
  c.data = default_data_config("toy2d")
  c.data.distribution = chosen[0] if chosen else "moons"
  c.data.n = 50_000
  c.data.n_eval = 5_000
  c.data.batch_size = 256
  c.model = dict(name="denoiser_mlp", hidden=256, depth=4, emb_dim=128, num_classes=0,
                 dropout=0.0)
  c.gen = default_gen_config(task)
  c.gen.eval_num = 2000
  c.optim = _optim()
  c.train.steps = 8_000
  c.train.eval_every = 2_000
  c.train.log_every = 200
  c.train.ckpt_every = 2_000
  if args.smoke:
    c.data.n = 5_000
    c.data.n_eval = 1_000
    c.model.hidden = 64
    c.model.depth = 2
    c.train.steps = 300
    c.train.eval_every = 150
    c.train.ckpt_every = 150
    c.gen.eval_num = 300
  return c


def digits_config(task: str, name: str, arg=None):
  """Class-conditional 8x8 digits in [-1, 1]: small U-Net (16/32 channels), 10 classes + null,
  p_uncond 0.1, guidance 2.0, AdamW 2e-3 warmup-cosine, batch 64, 3,000 steps (sized for a CPU).

  arg: None, or 'smoke' (a tiny U-Net, 60 steps).
  """
  smoke = parse_arg(arg, smoke=False).smoke
  c = base_config()
  c.name = name
  c.task = task
  c.data = default_data_config("digits")
  c.data.scale = "symmetric"
  c.data.batch_size = 64
  c.model = dict(name="denoiser_unet", image_shape=(8, 8, 1), channels=(16, 32), emb_dim=64,
                 num_classes=10, dropout=0.0)
  c.gen = default_gen_config(task)
  c.gen.num_classes = 10
  c.gen.p_uncond = 0.1
  c.gen.sample_shape = (8, 8, 1)
  c.gen.guidance = 2.0
  c.gen.steps = 25 if task == "flow_matching" else 50  # 50 network calls either way (Heun: 2/step)
  c.gen.eval_num = 500  # 50 per class
  # The judge of the class check, read by experiments/_digits.py: a digits_cnn run trained into
  # <workdir>/classifier after the model (reused when present), or 'svm' (an RBF SVM, seconds to
  # fit) for quick runs.
  c.gen.classifier = "digits_cnn"
  if task == "ddpm":
    c.gen.schedule = "cosine"
    c.gen.clip_x0 = 1.0
  c.optim = _optim()
  c.train.steps = 3000
  c.train.eval_every = 1000
  c.train.log_every = 100
  c.train.ckpt_every = 1000
  if smoke:
    c.model.channels = (8, 16)
    c.model.emb_dim = 32
    c.gen.eval_num = 100
    c.gen.classifier = "svm"
    c.train.steps = 60
    c.train.eval_every = 30
    c.train.ckpt_every = 30
    c.gen.steps = 5
  return c
