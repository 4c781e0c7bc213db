"""`jaxdl doctor EXPERIMENT`: the training doctor (`jaxdl.doctor`) from the command line.

    jaxdl doctor EXPERIMENT                         preflight (exit 1 when a check fails)
    jaxdl doctor EXPERIMENT --lr-range              + LR range test, workdir/lr_range.png
    jaxdl doctor EXPERIMENT --workdir W --locate S  first non-finite module of step S
    jaxdl doctor EXPERIMENT --workdir W --history   symptoms in W/metrics.jsonl
"""

from __future__ import annotations

import argparse
import os

HELP = "preflight checks, NaN/Inf locator, LR range test and run diagnoses for an experiment"


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


def main(args) -> None:
  """Exit codes (`jaxdl.cli.main`'s handler): 0 nothing failed, 1 a check failed or a
  non-finite module or symptom was found (a `RunError`), 2 bad input."""
  # As for `jaxdl train`: an experiment file may name these packages' tasks and models.
  import jaxdl.course.planted  # noqa: F401 -- registers the planted-bug models and tasks
  import jaxdl.generative  # noqa: F401 -- registers the generative tasks and models
  from jaxdl.config import ConfigError, default_workdir, load_config
  from jaxdl.doctor import (diagnose_workdir, head_ln_k, locate_nonfinite, lr_range_test,
                            run_preflight)
  from jaxdl.train import RunError, init_from
  config, _ = load_config(args.experiment, args.overrides)
  init_from.check_overrides(config, args.overrides)  # as `jaxdl train`: the base's architecture
  if "train" not in config or "model" not in config:
    raise ConfigError(f"experiment {config.name!r} is not a standard training run (no "
                      "train/model sections); the doctor has nothing to check")
  workdir = args.workdir or default_workdir(args.experiment, config)
  if (args.locate is not None or args.history) and not os.path.isfile(
      os.path.join(workdir, "config.json")):
    # Replaying or diagnosing needs the run itself; a missing one is not a clean bill of health.
    raise ConfigError(f"--workdir {workdir}: no run there (no config.json); "
                      f"{'--locate' if args.locate is not None else '--history'} reads a "
                      f"trained run's workdir")
  if args.locate is not None:
    finding = locate_nonfinite(config, workdir, args.locate)
    _print(finding.text())
    if finding.module:
      raise RunError(f"--locate {args.locate}: {finding.module} is the first non-finite module")
    return
  if args.history:
    diagnoses = diagnose_workdir(workdir, ln_k=head_ln_k(config))
    _print("\n".join(d.text() for d in diagnoses) or "no symptom in the metrics history")
    if diagnoses:
      raise RunError(f"--history: {len(diagnoses)} symptom(s) in {workdir}/metrics.jsonl")
    return
  report = run_preflight(config, steps=args.steps, overfit_steps=args.overfit_steps,
                         learn_steps=args.learn_steps)
  if args.lr_range:
    os.makedirs(workdir, exist_ok=True)
    result = lr_range_test(config, plot_path=os.path.join(workdir, "lr_range.png"))
    report.add(result.check())
  if args.json:
    _print(report.to_json())
  else:
    _print(report.text(verbose=args.verbose))
  if not report.ok:
    raise RunError(f"preflight: {', '.join(c.name for c in report.failed())} failed")
