"""The engine's own sections, each key declared once: the root (`RootSettings`), `train`
(`TrainSettings`) and `parallel` (`ParallelSettings`); their parsing (`parse_root`,
`parse_train`, `parse_parallel`, `validate`), `base_config` (their defaults, what experiments
start from) and `smoke` (the one smoke shrink).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import ml_collections

from jaxdl.schema import (NONNEG, POSITIVE, UNIT, Settings, at_least, default_section,
                          greater_than, one_of, parse_section, setting)
from jaxdl.schema import hints as schema_hints


@dataclasses.dataclass(frozen=True)
class RootSettings(Settings):
  """The root section: the top-level keys every experiment has, declared once (`base_config`
  writes them, `parse_root` reads them). An experiment's own top-level keys (a study's `rules`,
  `depths`, ...) belong to its `after_training` and are not checked here; the sections are
  parsed by their own classes."""

  name: str = ""
  description: str = ""
  seed: int = 0               # PRNGKey(seed): the run's one base key; the data order's seed
  task: str = "classification"  # a name of `jaxdl.train.tasks.TASKS`
  # The `smoke` arg of every experiment sets it (`smoke`): the procedures of multi-stage
  # experiments (the teacher, the digits judge, evaluation sizes) read it, never a step count.
  smoke: bool = False
  init_from: str = ""         # a fresh run's parameters from this run or HF directory; '' off


@dataclasses.dataclass(frozen=True)
class TrainSettings(Settings):
  """The `train` section: every key, its default and its check, written once.

  `base_config()` copies the defaults into the ConfigDict users override; `parse_train` turns the
  overridden section back into this object (one-line ConfigError naming the key when a value is
  out of range).
  """
  prefix: ClassVar[str] = "train."

  steps: int = setting(1000, POSITIVE)
  # 0 disables periodic evaluation (the last step always evaluates)
  eval_every: int = setting(100, NONNEG)
  log_every: int = setting(10, NONNEG)
  ckpt_every: int = setting(100, NONNEG)     # 0: only the final checkpoint
  keep_ckpts: int = setting(3, at_least(1))
  best_metric: str = ""          # e.g. 'eval/accuracy'; '' keeps only the latest checkpoints
  best_mode: str = setting("max", one_of("max", "min"))
  # early stopping after this many evals without improvement (0: never)
  patience: int = setting(0, NONNEG)
  # jaxdl.optim.precision
  precision: str = setting("fp32", one_of("fp32", "bf16", "fp16"))
  label_smoothing: float = setting(0.0, UNIT)  # s: targets (1 - s) onehot(y) + s / K
  z_loss: float = setting(0.0, NONNEG)   # c: lm tasks add c * mean (log Z)^2 (PaLM); 0 off
  # C > 0: the lm loss over C-position chunks of GPT's hidden states, never holding the
  # B x T x V logits (jaxdl.train.chunked_loss); the same loss and gradient. 0: off.
  loss_chunk: int = setting(0, NONNEG)
  grad_accum: int = setting(1, at_least(1))   # N microbatches per update
  async_checkpoint: bool = True
  plot: bool = True
  doctor: bool = False           # preflight before, history diagnosis after (jaxdl.doctor hooks)
  # Spike guard: on loss (or grad norm) > spike_factor x the rolling median of the last
  # spike_window steps, rewind to the last checkpoint and skip the offending batch.
  spike_guard: bool = False
  spike_factor: float = setting(5.0, greater_than(1, "a multiple of the rolling median"))
  spike_window: int = setting(20, at_least(1))
  spike_watch: str = setting("loss", one_of("loss", "grad_norm", "either"))
  max_rewinds: int = setting(3, NONNEG)
  # Seeing inside a run (jaxdl.train.throughput, jaxdl.train.profiling).
  count_flops: bool = True       # FLOPs per step and the device peak, for FLOP/s and MFU
  # per-device peak FLOP/s; 0: datasheet table or measured once
  peak_flops: float = setting(0.0, NONNEG)
  profile_steps: tuple = (0, 0)  # (start, stop): jax.profiler trace of these steps; (0, 0) off
  # health signals (jaxdl.train.watch)
  watch: str = setting("cheap", one_of("off", "cheap", "detailed"))
  # K: the health signals of every K-th step (train.watch='off' for none)
  watch_every: int = setting(100, POSITIVE)
  loggers: tuple = ("tensorboard",)  # + 'wandb', 'mlflow' (extras); metrics.jsonl always
  eval_ema: bool = False         # also evaluate optim.ema_decay's average (eval_ema/...); the
                                 # best checkpoint and early stopping then judge the average
  xla_cpu_workarounds: bool = True  # XLA:CPU compiler workarounds (jaxdl.train.xla_cpu)

  def __post_init__(self):
    super().__post_init__()
    window = tuple(self.profile_steps)
    if not (window == (0, 0) or len(window) == 2 and all(isinstance(s, int) for s in window)
            and 1 <= window[0] <= window[1] <= self.steps):
      self.fail("profile_steps", f"expected (start, stop) with 1 <= start <= stop <= "
                f"train.steps ({self.steps}), or (0, 0) for none; got {window}")


@dataclasses.dataclass(frozen=True)
class ParallelSettings(Settings):
  """The `parallel` section (strategies in `jaxdl.train.strategies`)."""
  prefix: ClassVar[str] = "parallel."

  strategy: str = setting("jit", one_of("jit", "pmap", "fsdp"))
  # how many devices to use (0 = all); the global batch is split over them
  devices: int = setting(0, at_least(0, "0 = all devices"))
  # size of the fsdp mesh axis under strategy 'fsdp' (0 = all devices)
  fsdp: int = setting(0, at_least(0, "0 = all devices"))
  # size of the expert mesh axis (MoE experts split over it; 1 = none)
  expert: int = setting(1, at_least(1, "1 = none"))
  # size of the tensor mesh axis (attention heads, MLP hidden and vocabulary split over it,
  # `jaxdl.train.sharding_rules`; 1 = none)
  tensor: int = setting(1, at_least(1, "1 = none"))
  # size of the sequence mesh axis (a GPT's positions split over it, attention over the whole
  # sequence by `sequence_attention`, `jaxdl.models.ring_attention`; 1 = none)
  sequence: int = setting(1, at_least(1, "1 = none"))
  # how attention reads the other devices' keys and values: passed round a 'ring' (ppermute,
  # fully masked causal blocks skipped) or 'allgather'ed
  sequence_attention: str = setting("ring", one_of("ring", "allgather"))


def parse_root(config) -> RootSettings:
  """The root keys of `config` (a ConfigDict or mapping) as a checked `RootSettings`; keys it
  lacks take their defaults, the experiment's own keys and the sections are left out."""
  own = schema_hints(RootSettings)
  return parse_section({k: v for k, v in config.items() if k in own}, RootSettings)


def parse_train(config) -> TrainSettings:
  """`config.train` as a checked `TrainSettings` (defaults when the section is absent)."""
  return parse_section(config.get("train"), TrainSettings)


def parse_parallel(config) -> ParallelSettings:
  """`config.parallel` as a checked `ParallelSettings` (defaults when the section is absent)."""
  return parse_section(config.get("parallel"), ParallelSettings)


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks the root and the engine's own sections (data, model and optim parse themselves when
  built, by
  `jaxdl.data.parse_data`, `jaxdl.models.build_model` and `jaxdl.optim.parse_optim`)."""
  parse_root(config)
  if config.get("train") is None:
    return  # a custom-run experiment (e.g. an optimizer toy) owns its own sections
  parse_train(config)
  parse_parallel(config)


def smoke(c: ml_collections.ConfigDict, steps: int = 20, eval_every: int = 10,
          ckpt_every: int = 10) -> ml_collections.ConfigDict:
  """`c` shrunk for the `smoke` arg: `c.smoke = True` (the flag procedures read) and a short
  run of `steps` steps evaluated and checkpointed every `eval_every` / `ckpt_every`. Returns c.

  The one place an experiment's smoke size is written, so no experiment repeats these lines.
  """
  c.smoke = True
  c.train.steps, c.train.eval_every, c.train.ckpt_every = steps, eval_every, ckpt_every
  return c


def base_config() -> ml_collections.ConfigDict:
  """The engine's keys with their defaults; experiments start from this and fill in the rest."""
  c = default_section(RootSettings)
  c.train = default_section(TrainSettings)
  c.parallel = default_section(ParallelSettings)
  return c
