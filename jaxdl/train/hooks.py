"""Hooks: how packages above the engine (the doctor, user scripts) take part in a run.

`jaxdl.train.run(config, workdir, hooks=[...])` calls, on every hook, in order:

  before_training(run)        after every piece is built, before the workdir is touched; raise
                              to refuse the run (nothing is written)
  on_step_end(step, metrics)  host-side train metrics of each logged step (already read back,
                              so a hook adds no device sync), with the throughput since the
                              previous logged step (steps_per_s, ..., mfu) when measured
  on_eval(step, metrics)      the eval metrics of each evaluation
  on_checkpoint(step)         after the checkpoint of `step` was handed to the checkpointer
  on_train_end(summary)       once, with the summary `run` returns

A hook subclasses `Hook` and overrides what it needs. The engine never imports the packages that
provide hooks: the dependency points from them to it. User scripts pass hooks to `run`; an
experiment file passes its own by defining `hooks(config) -> list[Hook]` (`jaxdl train` adds
them after the doctor's).
"""

from __future__ import annotations

from typing import Sequence


class Hook:
  """No-op base; override the calls you need."""

  # True for a hook that runs the doctor's preflight (`train.doctor=True` requires one).
  preflight: bool = False

  def before_training(self, run) -> None:
    del run

  def on_step_end(self, step: int, metrics: dict) -> None:
    del step, metrics

  def on_eval(self, step: int, metrics: dict) -> None:
    del step, metrics

  def on_checkpoint(self, step: int) -> None:
    del step

  def on_train_end(self, summary: dict) -> None:
    del summary


class Hooks(Hook):
  """Several hooks called in order, as one."""

  def __init__(self, hooks: Sequence[Hook] = ()):
    self.hooks = list(hooks)
    self.preflight = any(h.preflight for h in self.hooks)

  def before_training(self, run) -> None:
    for h in self.hooks:
      h.before_training(run)

  def on_step_end(self, step: int, metrics: dict) -> None:
    for h in self.hooks:
      h.on_step_end(step, metrics)

  def on_eval(self, step: int, metrics: dict) -> None:
    for h in self.hooks:
      h.on_eval(step, metrics)

  def on_checkpoint(self, step: int) -> None:
    for h in self.hooks:
      h.on_checkpoint(step)

  def on_train_end(self, summary: dict) -> None:
    for h in self.hooks:
      h.on_train_end(summary)
