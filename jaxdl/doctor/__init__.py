"""The training doctor: preflight checks, NaN/Inf locator, LR range test, run diagnoses.

The `jaxdl doctor` command (`jaxdl.cli.doctor`):

    jaxdl doctor EXPERIMENT                         preflight (exit 1 when a check fails)
    jaxdl doctor EXPERIMENT --lr-range              + LR range test, workdir/lr_range.png
    jaxdl doctor EXPERIMENT --workdir W --locate S  first non-finite module of step S
    jaxdl doctor EXPERIMENT --workdir W --history   symptoms in W/metrics.jsonl

Python API: `run_preflight(config) -> Report`, `locate_nonfinite(config, workdir, step) ->
Finding`, `lr_range_test(config, ...) -> LRRange`, `diagnose_history(train, eval)`,
`diagnose_workdir(workdir)`. The planted-bug model and task live in `jaxdl.course.planted`.
"""

from __future__ import annotations

import logging

from jaxdl.doctor.diagnoses import (CAUSES, SYMPTOMS, Diagnosis, diagnose_history,
                                    diagnose_workdir)
from jaxdl.config import parse_train
from jaxdl.doctor.report import Finding, Report
from jaxdl.train.hooks import Hook

log = logging.getLogger("jaxdl")

__all__ = ["PreflightHook", "HistoryHook", "hooks_for", "run_preflight", "locate_nonfinite",
           "lr_range_test", "head_ln_k",
           "diagnose_history", "diagnose_workdir", "Report", "Finding", "Diagnosis", "SYMPTOMS",
           "CAUSES"]


def run_preflight(config, **kwargs) -> Report:
  from jaxdl.doctor.preflight import run_preflight as _run
  return _run(config, **kwargs)


class PreflightHook(Hook):
  """Runs the preflight before a training run touches its workdir; a failed check stops it.

  `jaxdl train` passes it when `train.doctor=True`; from Python:
  `jaxdl.train.run(config, workdir, hooks=[PreflightHook()])`.
  """
  preflight = True

  def before_training(self, run) -> None:
    from jaxdl.train import PreflightError
    report = run_preflight(run.config)
    log.info("%s", report.text())
    if not report.ok:
      raise PreflightError(f"preflight failed for {run.config.name}: {report.causes()}; "
                           f"run `jaxdl doctor {run.config.name}` for details")


class HistoryHook(Hook):
  """Diagnoses the run from the records the hooks see (`diagnose_history`), at its end.

  Collects each logged step's train metrics (`on_step_end`) and each evaluation (`on_eval`);
  `on_train_end` logs the symptoms found (the rules on the watch records need
  `jaxdl doctor --history`, which reads metrics.jsonl) and keeps them in `self.found`.
  """

  def __init__(self):
    self.train: list[dict] = []
    self.evals: list[dict] = []
    self.found: list[Diagnosis] = []

  def on_step_end(self, step: int, metrics: dict) -> None:
    self.train.append({"step": step, **metrics})

  def on_eval(self, step: int, metrics: dict) -> None:
    self.evals.append({"step": step, **metrics})

  def on_train_end(self, summary: dict) -> None:
    del summary
    self.found = diagnose_history(self.train, self.evals)
    for d in self.found:
      log.warning("doctor: %s", d.text())


def hooks_for(config) -> list[Hook]:
  """The doctor's hooks a training config asks for (`train.doctor=True`: the preflight before
  the run, the history diagnosis after it)."""
  return [PreflightHook(), HistoryHook()] if parse_train(config).doctor else []


def locate_nonfinite(config, workdir, step: int):
  from jaxdl.doctor.locate import locate_nonfinite as _locate
  return _locate(config, workdir, step)


def lr_range_test(config, **kwargs):
  from jaxdl.doctor.lr_range import lr_range_test as _lr
  return _lr(config, **kwargs)


def head_ln_k(config) -> float | None:
  """ln K of the experiment's head (K classes, V for a language model, 2 for binary), or None."""
  import math
  from jaxdl import data
  from jaxdl.train import make_task
  k = make_task(config).kind.head_classes(data.make_dataset(config).info)
  return math.log(k) if k else None
