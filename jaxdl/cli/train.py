"""`jaxdl train [EXPERIMENT[:ARG]]`: train an experiment, resuming its workdir's run.

Prints the run's summary as JSON. A SIGTERM or SIGINT (Ctrl-C) at any moment stops the run
cleanly, in one line on stderr: during training the current step is saved; the workdir's lock is
released; exit 0 after SIGTERM (a preemption), 130 after SIGINT. Exit codes of failures come
from the error's type: a `jaxdl.train.RunError` (non-finite loss, unrecoverable spike, failed
preflight, a full disk while training) is a failed run, 1; a ValueError before training
(`jaxdl.schema.ConfigError`, a workdir of another run or in use) and a full disk or permission
error during setup are bad input, 2. After a full disk or permission error the program ends at
once (`_disk_error`).
"""

from __future__ import annotations

import json
import math
import os
import sys

from jaxdl import disk_errors
from jaxdl.cli import distributed

HELP = "train an experiment (resumes automatically)"
DEFAULT_EXPERIMENT = "char_gpt"
_KEPT = ("; the run stopped, its last good checkpoint is kept (fix it and rerun the same command "
         "to resume)")


def add_arguments(p) -> None:
  p.add_argument("experiment", nargs="?", default=DEFAULT_EXPERIMENT,
                 help="experiment file or name, optionally with :ARG (e.g. moons_mlp:bn); "
                      f"default {DEFAULT_EXPERIMENT}")
  p.add_argument("--workdir", help="run directory (default runs/<experiment>[-<arg>], e.g. "
                                   "runs/moons_mlp-bn); an existing run there is resumed from "
                                   "its latest checkpoint")
  p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                 help="override a config key, e.g. --set optim.lr=3e-3 (repeatable); "
                      "--config.optim.lr=3e-3 is accepted too")
  p.add_argument("--force", action="store_true",
                 help="resume even if the workdir's config differs")
  p.add_argument("--no-progress", action="store_true", help="no progress bar or log lines")
  p.add_argument("--profile", action="store_true",
                 help="write a jax.profiler trace of a few steps after the compile step to "
                      "WORKDIR/profile/ (train.profile_steps sets the window)")
  distributed.add_arguments(p)


def check_workdir(workdir: str) -> str | None:
  """Why `workdir` cannot hold a run, as one line naming the path, or None; creates nothing
  (`jaxdl.disk_errors.unwritable_dir`)."""
  return disk_errors.unwritable_dir(workdir, "--workdir")


def main(args) -> int:
  # First, before jax loads: a SIGTERM or SIGINT from here on stops the run cleanly. The CLI
  # polls for it (after loading the config; the loop at its milestones and every step), except
  # where an experiment's own code runs, which the signal interrupts (`Interrupted`).
  from jaxdl.stop_signals import Interrupted, Preemption
  with Preemption() as preempt, preempt.polled():
    try:
      return _main(args, preempt)
    except Interrupted as e:
      return _stopped(e.signal_name, "; nothing new saved")


def _stopped(signal_name: str, kept: str) -> int:
  """Says in one line that a signal stopped the run (`kept`: when, and what was saved); the exit
  code: 0 after SIGTERM (a preemption: the run stopped as asked and resumes), 130 (128 + 2, the
  shell's convention) after SIGINT, so a script interrupted by Ctrl-C does not go on."""
  print(f"jaxdl: stopped by {signal_name}{kept} (rerun the same command to resume)",
        file=sys.stderr)
  return 130 if signal_name == "SIGINT" else 0


def _main(args, preempt) -> int:
  # An experiment file may name the generative and planted-bug tasks and models without
  # importing them; these imports register them.
  import jaxdl.course.planted  # noqa: F401 -- registers the planted-bug models and tasks
  import jaxdl.generative  # noqa: F401 -- registers the generative tasks and models
  from jaxdl.config import ConfigError, default_workdir, load_config
  from jaxdl.train import DiskFailure, NonFiniteLossError, RunError
  try:
    config, module = load_config(args.experiment, args.overrides)
    if args.profile and config.get("train") is not None:
      from jaxdl.train.profiling import default_window
      config, module = load_config(args.experiment, [
          *args.overrides, f"train.profile_steps={default_window(config.train.steps)}"])
  except ConfigError as e:
    print(f"jaxdl: error: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2
  if preempt.requested:  # while jax loaded or the config was read: nothing touched yet
    return _stopped(preempt.requested, " before training started; nothing saved")
  workdir = args.workdir or default_workdir(args.experiment, config)
  problem = check_workdir(workdir) or (distributed.check(args) if args.distributed else None)
  if problem:
    print(f"jaxdl: error: {problem}", file=sys.stderr)
    return 2
  if args.distributed:
    distributed.initialize(args)
  try:
    summary = _run(args, config, module, workdir, preempt)
  except NonFiniteLossError as e:
    print(f"jaxdl: {e}", file=sys.stderr)
    _locate(config, workdir, e.step)
    return 1
  except DiskFailure as e:  # one line, no traceback wall; the chained cause names the file
    return _disk_error(args, (disk_errors.disk_failure(e, workdir) or str(e)) + _KEPT, 1)
  except RunError as e:
    print(f"jaxdl: {e}", file=sys.stderr)
    return 1
  except (OSError, ValueError) as e:  # before training: bad input
    failure = disk_errors.disk_failure(e, workdir)
    if failure is not None:  # a read-only or full disk met while setting up
      return _disk_error(args, failure, 2)
    if isinstance(e, OSError):
      raise
    print(f"jaxdl: error: {str(e).splitlines()[0]}", file=sys.stderr)  # bad config or value,
    return 2                                                              # another run's workdir
  print(json.dumps({"workdir": workdir, **_jsonable(summary)}, indent=2, allow_nan=False))
  if summary.get("preempted") and preempt.requested:
    return _stopped(preempt.requested, f" at step {summary['step']}; " + (
        "its checkpoint is saved" if summary["step"] > summary["start_step"] else
        "nothing new to save"))
  return 0


def _run(args, config, module, workdir: str, preempt) -> dict:
  """Trains `config` through the loop, or through the experiment's own `run`."""
  from jaxdl import doctor
  from jaxdl.train import loop
  from jaxdl.train import workdir as workdirs
  from jaxdl.train.errors import disk_failures_fail_the_run
  if hasattr(module, "run"):  # an experiment with its own loop (the optimizer toys)
    with workdirs.lock(workdir, expect_config=workdirs.read_config(workdir)):
      with disk_failures_fail_the_run(workdir), preempt.polled(False):
        return module.run(config, workdir)
  # An experiment may add its own hooks: `hooks(config) -> [jaxdl.train.Hook, ...]`.
  own = module.hooks(config) if hasattr(module, "hooks") else []
  summary = loop.run(config, workdir, force=args.force, progress=not args.no_progress,
                     hooks=[*doctor.hooks_for(config), *own], preempt=preempt)
  if hasattr(module, "after_training") and not summary.get("preempted"):
    with preempt.polled(False):  # e.g. print a sample from the trained model
      summary.update(module.after_training(config, workdir, summary) or {})
  return summary


def _disk_error(args, line: str, code: int) -> int:
  """Reports a full disk or a permission error in one line. The `jaxdl` program then ends at
  once: the run has closed all it owns, and what is left are library threads retrying the same
  writes, and orbax's signalling threads of the failed save, which wait (as threads the
  interpreter joins at exit) for a signal that save never sends, for orbax's coordination
  timeout of many minutes."""
  print(f"jaxdl: error: {line}", file=sys.stderr, flush=True)
  if args.as_program:
    disk_errors.silence_stderr()
    sys.stdout.flush()
    os._exit(code)  # pylint: disable=protected-access
  return code


def _locate(config, workdir, step: int) -> None:
  """Replays the failed step from the last checkpoint and names the first non-finite module."""
  from jaxdl.doctor import locate_nonfinite
  try:
    print(locate_nonfinite(config, workdir, step).text(), file=sys.stderr)
  except Exception as e:  # noqa: BLE001 -- the locator is a diagnosis aid, never a new failure
    print(f"jaxdl: the NaN locator could not run ({type(e).__name__}: {e}); try "
          f"`jaxdl doctor {config.name} --workdir {workdir} --locate {step}`", file=sys.stderr)


def _jsonable(x):
  """`x` as JSON values: a non-finite number becomes None (`null`; JSON has no NaN or Inf)."""
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, (str, int, bool)) or x is None:
    return x
  try:
    x = float(x)
  except (TypeError, ValueError):
    return str(x)
  return x if math.isfinite(x) else None
