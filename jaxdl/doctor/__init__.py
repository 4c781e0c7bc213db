"""The training doctor: preflight checks, NaN/Inf locator, LR range test, run diagnoses.

    jaxdl doctor EXPERIMENT                         preflight (exit 1 when a check fails)
    jaxdl doctor EXPERIMENT --lr-range              + LR range test, workdir/lr_range.png
    jaxdl doctor EXPERIMENT --workdir W --locate S  first non-finite module of step S
    jaxdl doctor EXPERIMENT --workdir W --history   symptoms in W/metrics.jsonl

Python API: `run_preflight(config) -> Report`, `locate_nonfinite(config, workdir, step) ->
Finding`, `lr_range_test(config, ...) -> LRRange`, `diagnose_history(train, eval)`,
`diagnose_workdir(workdir)`. The planted-bug model and task live in `jaxdl.course.planted`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from jaxdl.doctor.diagnoses import (CAUSES, SYMPTOMS, Diagnosis, diagnose_history,
                                    diagnose_workdir)
from jaxdl.doctor.report import Check, Report
from jaxdl.train.hooks import Hook

log = logging.getLogger("jaxdl")

HELP = "preflight checks, NaN/Inf locator, LR range test and run diagnoses for an experiment"

__all__ = ["PreflightHook", "HistoryHook", "hooks_for", "run_preflight", "locate_nonfinite",
           "lr_range_test",
           "diagnose_history", "diagnose_workdir", "Report", "Check", "Diagnosis", "SYMPTOMS",
           "CAUSES", "HELP", "add_arguments", "main"]


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
  train = config.get("train") or {}
  return [PreflightHook(), HistoryHook()] if train.get("doctor", False) else []


def locate_nonfinite(config, workdir, step: int):
  from jaxdl.doctor.locate import locate_nonfinite as _locate
  return _locate(config, workdir, step)


def lr_range_test(config, **kwargs):
  from jaxdl.doctor.lr_range import lr_range_test as _lr
  return _lr(config, **kwargs)


def _ln_k(config) -> float | None:
  """ln K of the experiment's head (K classes, V for a language model, 2 for binary), or None."""
  import math
  from jaxdl import data
  from jaxdl.train import make_task
  kind = make_task(config).kind
  info = data.make_dataset(config).info
  k = {"classification": info.get("num_classes"), "lm": info.get("vocab_size"),
       "binary": 2}.get(kind)
  return math.log(k) if k else None


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("experiment", help="experiment file or name, optionally with :ARG")
  p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                 help="override a config key (repeatable), as for `jaxdl train`")
  p.add_argument("--workdir", help="run directory (default runs/<experiment>[-<arg>], as for "
                                   "`jaxdl train`)")
  p.add_argument("--steps", type=int, default=20, help="real train steps in the first-steps "
                                                       "check (default 20)")
  p.add_argument("--overfit-steps", type=int, default=200,
                 help="step budget to overfit one batch (default 200)")
  p.add_argument("--learn-steps", type=int, default=100,
                 help="steps before the held-out loss is measured (default 100)")
  p.add_argument("--lr-range", action="store_true", help="also run the LR range test")
  p.add_argument("--locate", type=int, metavar="STEP",
                 help="replay the run in --workdir to STEP (the step of the NaN error) and name "
                      "the first module whose output is not finite; skips the preflight")
  p.add_argument("--history", action="store_true",
                 help="diagnose the metrics history in --workdir; skips the preflight")
  p.add_argument("--json", action="store_true", help="print the report as JSON")
  p.add_argument("--verbose", action="store_true", help="print per-layer tables too")


def _print(text: str) -> None:
  print(text, flush=True)


def main(args) -> int:
  """Exit codes: 0 nothing failed, 1 a check failed (or a non-finite module was found),
  2 bad input."""
  from jaxdl.config import ConfigError, default_workdir, load_config
  try:
    config, _ = load_config(args.experiment, args.overrides)
  except ConfigError as e:
    print(f"jaxdl: error: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2
  if "train" not in config or "model" not in config:
    print(f"jaxdl: error: experiment {config.name!r} is not a standard training run "
          "(no train/model sections); the doctor has nothing to check", file=sys.stderr)
    return 2
  workdir = args.workdir or default_workdir(args.experiment, config)
  if (args.locate is not None or args.history) and not os.path.isfile(
      os.path.join(workdir, "config.json")):
    # Replaying or diagnosing needs the run itself; a missing one is not a clean bill of health.
    print(f"jaxdl: error: --workdir {workdir}: no run there (no config.json); "
          f"{'--locate' if args.locate is not None else '--history'} reads a trained run's "
          f"workdir", file=sys.stderr)
    return 2
  try:
    if args.locate is not None:
      finding = locate_nonfinite(config, workdir, args.locate)
      _print(finding.text())
      return 1 if finding.module else 0
    if args.history:
      diagnoses = diagnose_workdir(workdir, ln_k=_ln_k(config))
      _print("\n".join(d.text() for d in diagnoses) or "no symptom in the metrics history")
      return 1 if diagnoses else 0
    report = run_preflight(config, steps=args.steps, overfit_steps=args.overfit_steps,
                           learn_steps=args.learn_steps)
    if args.lr_range:
      os.makedirs(workdir, exist_ok=True)
      result = lr_range_test(config, plot_path=os.path.join(workdir, "lr_range.png"))
      report.add(result.check())
  except (ValueError, FileNotFoundError) as e:
    print(f"jaxdl: error: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2
  if args.json:
    _print(report.to_json())
  else:
    _print(report.text(verbose=args.verbose))
  return 0 if report.ok else 1
