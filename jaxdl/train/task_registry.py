"""The task registry: what a task is (`Family`, `TaskKind`), what building one returns (`Task`),
`register_task`, and the lookups (`kind_of`, `task_names`, `make_task`).

A task is chosen by `config.task` from `TASKS`, a registry of typed `TaskKind`s: what the task
is (its family, whether it models sequences, samples with one network call, runs on which
Gaussian path), asked as attributes (`kind_of(name).sequence_model`, `task.kind.is_generative`)
and never by comparing task names. `TASKS[name](config, train_settings) -> Task` builds its loss,
`train_settings` the run's parsed `train` section (`jaxdl.config.TrainSettings`, which holds
`label_smoothing` and `z_loss`). Its `loss_fn` has the signature

  loss_fn(apply_fn, params, model_state, batch, rngs, train) -> (loss, (metrics, new_model_state))

`model_state` holds mutable collections such as `batch_stats`; `rngs` is a dict of named keys
derived in the step; an optional `batch['mask']` (1 real, 0 padding) weights the per-example mean
so padded eval batches give exact averages. A loss that divides by what its batch scores rather
than by its rows (lm with a loss_mask, node_classification) names that weight W in
`Task.loss_weight`, so that the train step weighs microbatches and pmap's devices by it.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable

from jaxdl.config import TrainSettings, parse_train
from jaxdl.schema import ConfigError


class Family(enum.Enum):
  """What a task's targets are: the question most code asks of a task."""
  CLASSIFICATION = "classification"  # integer labels of K classes (or soft targets over K)
  BINARY = "binary"                  # one logit per example, labels 0 / 1
  LM = "lm"                          # next-token targets over a vocabulary of V
  REGRESSION = "regression"          # real-valued targets
  GENERATIVE = "generative"          # no targets: a model of the data itself
  OTHER = "other"


@dataclasses.dataclass(frozen=True)
class TaskKind:
  """A registered task: its name, its factory and what it is.

  family:  `Family`, what its targets are.
  labels:  its targets are integer labels of the data's `num_classes` (checked against the data
           before anything compiles).
  path:    a denoising task's Gaussian path ('flow', 'ddpm', 'edm'; `jaxdl.generative.paths`);
           None for every other task, a generative one included (VAE, GAN: one network call).
  likelihood: what `jaxdl likelihood` computes for a trained run: 'ode' (exact log p(x) through
           the probability-flow ODE), 'elbo' (a lower bound), None (nothing).
  Calling it, `kind(config, train_settings) -> Task`, builds the task (`train_settings` None:
  the `train` section's defaults).
  """
  name: str
  factory: Callable[[Any, TrainSettings], "Task"]
  family: Family = Family.OTHER
  labels: bool = False
  path: str | None = None
  likelihood: str | None = None

  def __call__(self, config, train: TrainSettings | None = None) -> "Task":
    task = self.factory(config, TrainSettings() if train is None else train)
    return dataclasses.replace(task, kind=self)

  @property
  def sequence_model(self) -> bool:
    """Next-token prediction over a vocabulary: z-loss, bits per byte, ln V as first loss."""
    return self.family is Family.LM

  @property
  def is_generative(self) -> bool:
    return self.family is Family.GENERATIVE

  @property
  def supervised(self) -> bool:
    """Targets given with each input (a held-out loss, misaligned labels make sense)."""
    return self.family in (Family.CLASSIFICATION, Family.BINARY, Family.LM, Family.REGRESSION)

  @property
  def one_call(self) -> bool:
    """A generative task that samples with one network call (no path, no steps)."""
    return self.is_generative and self.path is None


  def head_classes(self, info: dict) -> int | None:
    """K of the softmax head whose first loss is ln K (classes, vocabulary, 2), else None."""
    if self.family is Family.CLASSIFICATION:
      return info.get("num_classes")
    if self.family is Family.LM:
      return info.get("vocab_size")
    return 2 if self.family is Family.BINARY else None


TASKS: dict[str, TaskKind] = {}

# Names a task had before; a config that still says one is refused with the new name.
RENAMED = {"lm_masked": "'lm' (its batch['loss_mask'] selects the scored tokens, the same loss)"}


@dataclasses.dataclass(frozen=True)
class Task:
  """A loss function plus the model input it needs for `init`."""
  loss_fn: Callable
  init_input: Callable[[dict], Any] = lambda batch: batch["x"]
  # What it is (`TaskKind`); set by the registry when the task is built.
  kind: TaskKind | None = None
  # `(parsed optim, total_steps) -> (tx, schedule)` replacing `optim.build` for tasks that need
  # more than one chain (the GAN's two players); None: the run's `optim` as built.
  optimizer: Callable | None = None
  # `batch -> W or None`: what the loss of `batch` divides by when that is not its row count (the
  # scored tokens, the labelled nodes), so that the train step can weigh microbatches and devices
  # by it and take the gradient of the whole batch's loss (`jaxdl.train.accumulation`); None
  # from it, or no function, where every row weighs the same.
  loss_weight: Callable[[dict], Any] | None = None


def register_task(name: str, family: Family = Family.OTHER, *, labels: bool = False,
                  path: str | None = None, likelihood: str | None = None):
  """Registers `factory(config, train_settings) -> Task` under `name` as a `TaskKind` with
  `family`, `labels`, `path` and `likelihood` (`train_settings`: the run's parsed `train`
  section)."""

  def wrap(factory):
    TASKS[name] = TaskKind(name, factory, family, labels, path, likelihood)
    return factory

  return wrap


def kind_of(name: str) -> TaskKind:
  """The registered `TaskKind` called `name`; ConfigError naming the known ones otherwise."""
  if name in TASKS:
    return TASKS[name]
  if name in RENAMED:
    raise ConfigError(f"task: {name!r} is now {RENAMED[name]}; set task='lm'")
  raise ConfigError(f"task: unknown task {name!r}; expected one of {sorted(TASKS)} "
                    f"(tasks of other packages register when that package is imported, e.g. "
                    f"`import jaxdl.generative`)")


def task_names(where: Callable[[TaskKind], bool]) -> list[str]:
  """The registered tasks whose kind satisfies `where` (for messages: 'needs a ... run')."""
  return [name for name, kind in TASKS.items() if where(kind)]


def make_task(config, train: TrainSettings | None = None) -> Task:
  """The task `config.task`, built with the run's parsed `train` section (`Run.train`); None
  parses `config.train` (a task used outside a run)."""
  kind = kind_of(config.task)
  train = parse_train(config) if train is None else train
  if train.z_loss and not kind.sequence_model:
    raise ConfigError(f"train.z_loss: only language-model tasks add the z-loss, not task "
                      f"{config.task!r}; set train.z_loss=0")
  if train.loss_chunk and (kind.family is not Family.LM or config.model.get("name") != "gpt"):
    raise ConfigError(f"train.loss_chunk: chunks the lm task's head over GPT's hidden states; "
                      f"task {config.task!r} with model {config.model.get('name')!r} has none, "
                      f"got {train.loss_chunk} (set train.loss_chunk=0)")
  return kind(config, train)
