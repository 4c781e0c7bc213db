"""Shared configs of the generative experiments: the 2-D toys and class-conditional digits of
the flow and diffusion experiments (fm_ / ddpm_ / reflow_ / distill_toy2d, fm_ / ddpm_digits_cfg,
reflow_ / distill_digits, generative_table) and the common base of the one-call families (vae_,
gan_digits, gan_toy2d).

Each builds on `jaxdl.config.base_config()` and lists every key a user may override: model
sections come from `jaxdl.models.model_config` (every field of the model class), optimizer
sections from `jaxdl.optim.default_optim_config`. The `smoke` arg shrinks a config through
`jaxdl.config.smoke`, which sets `config.smoke`, the flag the experiments' procedures read.
"""

from __future__ import annotations

from jaxdl.config import base_config, parse_arg, smoke
from jaxdl.data import default_data_config
from jaxdl.generative.distill import default_distill_config
from jaxdl.generative.reflow import default_reflow_config
from jaxdl.generative.tasks import default_gen_config
from jaxdl.models import model_config
from jaxdl.train.tasks import kind_of
from jaxdl.optim import default_optim_config

DISTRIBUTIONS = ("moons", "8gaussians", "checkerboard", "swissroll")
# The few-step sections of the toys (reflow_ / distill_toy2d): their defaults, and the smoke sizes.
TOY_FEW_STEP = {"reflow": (default_reflow_config, dict(pairs=1000, teacher_steps=10, steps=50)),
                "distill": (default_distill_config, dict(trajectories=1000, substeps=3, steps=50))}


def generative_base(task: str, name: str, data: str, *, batch_size: int, steps: int, every: int,
                    log_every: int):
  """base_config() with `task`, `name`, the `data` section (digits scaled to [-1, 1]) and the
  run's length: `steps` updates, evaluated and checkpointed `every` steps."""
  c = base_config()
  c.name = name
  c.task = task
  c.data = default_data_config(data)
  c.data.batch_size = batch_size
  if data == "digits":
    c.data.scale = "symmetric"
  c.train.update(steps=steps, eval_every=every, log_every=log_every, ckpt_every=every)
  return c


def gan_optim(lr: float):
  """Both GAN players' optimizer: Adam with b1 = 0.5 (the DCGAN setting) at peak `lr`,
  warmup-cosine, no clipping."""
  return default_optim_config("adam", lr=lr, b1=0.5, clip_norm=None)


def _flow_optim():
  """The flow and diffusion models' optimizer: AdamW 2e-3 without decay, clipped at 1,
  warmup-cosine."""
  return default_optim_config("adamw", lr=2e-3, weight_decay=0.0)


def toy2d_config(task: str, name: str, arg=None, *, few_step: str | None = None):
  """2-D toys: residual MLP denoiser (4 x 256), AdamW 2e-3 warmup-cosine, batch 256, 8k steps.

  arg: comma-separated: a distribution name (default moons) and/or 'smoke' (300 steps of a small
  model), e.g. 'swissroll,smoke'.
  few_step: 'reflow' or 'distill' adds that section at its defaults (the smoke config: 1,000
  pairs / trajectories, 50 student updates).
  """
  args = parse_arg(arg, smoke=False, **{d: False for d in DISTRIBUTIONS})
  chosen = [d for d in DISTRIBUTIONS if args[d]]
  if len(chosen) > 1:
    raise ValueError(f"args {chosen} name more than one distribution; give one of "
                     f"{DISTRIBUTIONS}")
  c = generative_base(task, name, "toy2d", batch_size=256, steps=8_000, every=2_000,
                      log_every=200)
  c.data.distribution = chosen[0] if chosen else "moons"
  c.data.n = 50_000
  c.data.n_eval = 5_000
  c.model = model_config("denoiser_mlp")  # 4 residual blocks of width 256, time embedding 128
  c.gen = default_gen_config(task)
  c.gen.eval_num = 2000
  c.optim = _flow_optim()
  if args.smoke:
    smoke(c, steps=300, eval_every=150, ckpt_every=150)
    c.data.n = 5_000
    c.data.n_eval = 1_000
    c.model.update(hidden=64, depth=2)
    c.gen.eval_num = 300
  if few_step is not None:
    default, small = TOY_FEW_STEP[few_step]
    c[few_step] = default()
    if args.smoke:
      c[few_step].update(small)
  return c


def digits_config(task: str, name: str, arg=None):
  """Class-conditional 8x8 digits in [-1, 1]: small U-Net (16/32 channels), 10 classes + null,
  p_uncond 0.1, guidance 2.0, AdamW 2e-3 warmup-cosine, batch 64, 3,000 steps (sized for a CPU).

  arg: None, or 'smoke' (a tiny U-Net, 20 steps of batch 16, 50 samples judged).
  """
  c = generative_base(task, name, "digits", batch_size=64, steps=3000, every=1000,
                      log_every=100)
  c.model = model_config("denoiser_unet", channels=(16, 32), emb_dim=64, num_classes=10)
  c.gen = default_gen_config(task)
  c.gen.num_classes = 10
  c.gen.p_uncond = 0.1
  c.gen.sample_shape = (8, 8, 1)
  c.gen.guidance = 2.0
  c.gen.steps = 25 if kind_of(task).path == "flow" else 50  # 50 network calls (Heun: 2/step)
  c.gen.eval_num = 500  # 50 per class
  # The judge of the class check (`jaxdl.course.digits_judge.class_check`): a digits_cnn run
  # trained into <workdir>/classifier after the model (reused when present), or 'svm' (an RBF
  # SVM, seconds to fit) for quick runs.
  c.gen.classifier = "digits_cnn"
  if kind_of(task).path == "ddpm":
    c.gen.schedule = "cosine"
    c.gen.clip_x0 = 1.0
  c.optim = _flow_optim()
  if parse_arg(arg, smoke=False).smoke:
    smoke(c, steps=20, eval_every=10, ckpt_every=10)
    # Batch 16: a smoke run checks the procedure, and at the tests' XLA flags (unoptimized code)
    # its updates cost in proportion to the batch: `jaxdl train edm_digits:smoke` took 24.4-25.5
    # CPU-s at 16 against 29.4-33.6 at 64 (one pinned core, alternated).
    c.data.batch_size = 16
    c.model.update(channels=(8, 16), emb_dim=32)
    c.gen.update(eval_num=50, classifier="svm", steps=5)
  return c
