"""The `gen` section of every generative run, declared once with `jaxdl.schema`.

`GenSettings` holds the keys every family reads after training (what `jaxdl sample` draws, how
many samples the post-training checks draw, which judge labels digits); each task's class adds
its own keys:

  flow_matching, ddpm,  `PathSettings` / `DDPMSettings` / `EDMSettings`: the Gaussian path, the
  edm                   prediction, class conditioning and the default sampler
                        (`jaxdl.generative.tasks`)
  vae                   `VAESettings`: the KL weight and its warmup (`jaxdl.generative.vae`)
  gan                   `GANSettings`: R1, the update order, per-player optimizer keys
                        (`jaxdl.generative.gan`)

`default_gen_config(task)` writes a task's section with every key at its default; `parse_gen`
reads it back (a past run's `config.json` without a later key takes its default).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import ml_collections

from jaxdl.generative import paths, samplers
from jaxdl.schema import (NONNEG, POSITIVE, UNIT, ConfigError, Settings, default_section, one_of,
                          parse_section, setting)
from jaxdl.train.tasks import kind_of


@dataclasses.dataclass(frozen=True)
class GenSettings(Settings):
  """The keys every generative family reads after training."""
  prefix: ClassVar[str] = "gen."

  sample_shape: tuple = (2,)    # what `jaxdl sample` draws: model.data_shape
  eval_num: int = setting(2000, POSITIVE)   # samples the post-training checks draw
  # The digits judge of the class checks (`jaxdl.course.digits_judge`): 'svm' (an RBF SVM,
  # seconds to fit) or 'digits_cnn' (its config trained into <workdir>/classifier).
  classifier: str = setting("svm", one_of("svm", "digits_cnn"))
  # K classes of a class-conditional run: only the Gaussian paths condition (their `gen` section
  # has the key); every other family is unconditional.
  num_classes: ClassVar[int] = 0


@dataclasses.dataclass(frozen=True)
class PathSettings(GenSettings, samplers.SamplerSettings):
  """flow_matching's `gen` section (DDPMSettings changes two defaults).

  path: 'flow' for flow_matching; 'ddpm' uses `schedule` and `T`. `prediction` is the network's
  output and regression target (`jaxdl.generative.losses`); `num_classes` K > 0 conditions on
  the label, each replaced by the null class K with probability `p_uncond` in training
  (classifier-free guidance). The sampler keys (sampler, steps, eta, guidance, clip_x0, spacing,
  rho, the churn, t_end) are `samplers.SamplerSettings`', declared there with their defaults:
  what `make_run_sampler` and `jaxdl sample` draw with.
  """
  schedule: str = setting("linear", one_of(*paths.SCHEDULES))
  T: int = setting(1000, POSITIVE)
  num_classes: int = setting(0, NONNEG)     # 0: unconditional (GenSettings' ClassVar otherwise)
  p_uncond: float = setting(0.1, UNIT)


@dataclasses.dataclass(frozen=True)
class DDPMSettings(PathSettings):
  """ddpm's `gen` section: eps prediction and DDIM sampling by default."""
  prediction: str = "eps"
  sampler: str = "ddim"


@dataclasses.dataclass(frozen=True)
class EDMSettings(PathSettings):
  """edm's `gen` section: the EDM path (`paths.EDMPath`), F prediction, EDM-Heun at 18 steps.

  sigma_data: sd of the preconditioning; ln sigma ~ N(p_mean, p_std^2) in training; the
  sampler's Karras grid runs from sigma_max to sigma_min, then 0 (schedule and T are unused).
  """
  prediction: str = "edm"
  sampler: str = "edm_heun"
  steps: int = 18                            # 35 network calls (Karras et al.'s CIFAR-10 setting)
  sigma_data: float = setting(0.5, POSITIVE)
  sigma_min: float = setting(0.002, POSITIVE)
  sigma_max: float = setting(80.0, POSITIVE)
  p_mean: float = -1.2
  p_std: float = setting(1.2, POSITIVE)

  def __post_init__(self):
    super().__post_init__()
    if self.sigma_min >= self.sigma_max:
      self.fail("sigma_min", f"must be < sigma_max = {self.sigma_max}, got {self.sigma_min}")


@dataclasses.dataclass(frozen=True)
class VAESettings(GenSettings):
  """`config.gen` of a 'vae' run."""
  beta: float = setting(1.0, NONNEG)   # weight of the KL term in training (eval reports beta = 1)
  kl_warmup: int = setting(0, NONNEG)  # N: beta ramps linearly from 0 over N updates (0: none)
  sample_shape: tuple = (8, 8, 1)


UPDATES = ("simultaneous", "alternating")


@dataclasses.dataclass(frozen=True)
class GANSettings(GenSettings):
  """`config.gen` of a 'gan' run. A per-player key left None takes the run's `optim` value."""
  r1: float = setting(0.0, NONNEG)    # gamma of the R1 penalty (0: none)
  updates: str = setting("simultaneous", one_of(*UPDATES))  # `jaxdl.generative.gan`'s docstring
  g_lr: float | None = setting(None, NONNEG)  # the generator's peak lr
  g_b1: float | None = setting(None, UNIT)    # its Adam moment decays (Adam-family optim only)
  g_b2: float | None = setting(None, UNIT)
  d_lr: float | None = setting(None, NONNEG)  # the same for the discriminator
  d_b1: float | None = setting(None, UNIT)
  d_b2: float | None = setting(None, UNIT)


GEN_SETTINGS = {"flow_matching": PathSettings, "ddpm": DDPMSettings, "edm": EDMSettings,
                "vae": VAESettings, "gan": GANSettings}


def default_gen_config(task: str) -> ml_collections.ConfigDict:
  """Every `config.gen` key of generative task `task` at its default."""
  if task not in GEN_SETTINGS:
    raise ConfigError(f"task: {task!r} has no `gen` section; expected one of "
                      f"{', '.join(GEN_SETTINGS)}")
  return default_section(GEN_SETTINGS[task])


def path_from_config(config, settings: PathSettings | None = None):
  """The Gaussian path of the run: FlowPath for 'flow_matching', DDPMPath for 'ddpm', EDMPath
  for 'edm'."""
  path = kind_of(config.task).path
  if path == "flow":
    return paths.FlowPath()
  settings = settings or parse_gen(config)
  if path == "edm":
    return paths.EDMPath(sigma_data=settings.sigma_data, sigma_min=settings.sigma_min,
                         sigma_max=settings.sigma_max, p_mean=settings.p_mean,
                         p_std=settings.p_std)
  return paths.make_path("ddpm", T=settings.T, schedule=settings.schedule)


def parse_gen(config) -> GenSettings:
  """`config.gen` of a generative run as its task's checked settings; for the Gaussian paths
  with the cross-section checks: the prediction fits the path, and the model holds the same
  number of classes. A run of another task with a `gen` section (an autoregressive sampler's
  post-training check) reads the shared keys, `GenSettings`."""
  settings = parse_section(config.get("gen"), GEN_SETTINGS.get(config.task, GenSettings))
  if not isinstance(settings, PathSettings):
    return settings
  allowed = path_from_config(config, settings).predictions
  if settings.prediction not in allowed:
    settings.fail("prediction", f"{settings.prediction!r} is not one of {allowed} for task "
                  f"{config.task!r}")
  model_k = config.model.get("num_classes") or 0
  if model_k != settings.num_classes:
    raise ConfigError(f"model.num_classes={model_k} but gen.num_classes={settings.num_classes}; "
                      "they must agree (the model holds K + 1 class embeddings, the null class "
                      "K)")
  return settings
