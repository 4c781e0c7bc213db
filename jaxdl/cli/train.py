"""`jaxdl train [EXPERIMENT[:ARG]]`: train an experiment, resuming its workdir's run.

Prints the run's summary as JSON. A SIGTERM or SIGINT (Ctrl-C) at any moment stops the run
cleanly, in one line on stderr: during training the current step is saved; before it nothing is
written; the workdir's lock is released; exit 0 after SIGTERM (a preemption), 130 after SIGINT.
Failures raise, and the CLI's handler (`jaxdl.cli.main`) turns their type into the exit code: a
`jaxdl.train.RunError` (non-finite loss, unrecoverable spike, failed preflight, a full disk while
training) is a failed run, 1; a ValueError before training (`jaxdl.schema.ConfigError`, a
workdir of another run or in use) and a full disk or permission error during setup are bad
input, 2. After a full disk or permission error the program ends at once.
"""

from __future__ import annotations

import json
import math

from jaxdl import disk_errors
from jaxdl.cli import distributed
from jaxdl.stop_signals import Interrupted, Stopped

HELP = "train an experiment (resumes automatically)"
DEFAULT_EXPERIMENT = "char_gpt"


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


def main(args) -> None:
  # The CLI's stop handler (`args.preempt`) was installed before jax loaded. The run polls for a
  # signal (after loading the config; the loop at its milestones and every step), except where
  # an experiment's own code runs, which the signal interrupts (`Interrupted`).
  try:
    _main(args, args.preempt)
  except Interrupted as e:
    raise _stopped(e.signal_name, "; nothing new saved") from None


def _stopped(signal_name: str, kept: str) -> Stopped:
  """The stop to raise after a signal stopped the run (`kept`: when, and what was saved)."""
  return Stopped(signal_name, f"stopped by {signal_name}{kept} (rerun the same command to "
                              f"resume)")


def _main(args, preempt) -> None:
  # An experiment file may name the generative and planted-bug tasks and models without
  # importing them; these imports register them.
  import jaxdl.course.planted  # noqa: F401 -- registers the planted-bug models and tasks
  import jaxdl.generative  # noqa: F401 -- registers the generative tasks and models
  from jaxdl import stop_signals
  from jaxdl.config import ConfigError, default_workdir, load_config
  from jaxdl.train import DiskFailure, NonFiniteLossError
  config, module = load_config(args.experiment, args.overrides)
  if args.profile and config.get("train") is not None:
    from jaxdl.train.profiling import default_window
    config, module = load_config(args.experiment, [
        *args.overrides, f"train.profile_steps={default_window(config.train.steps)}"])
  stop_signals.reached("config")
  if preempt.requested:  # while jax loaded or the config was read: nothing touched yet
    raise _stopped(preempt.requested, " before training started; nothing written")
  workdir = args.workdir or default_workdir(args.experiment, config)
  problem = check_workdir(workdir) or (distributed.check(args) if args.distributed else None)
  if problem:
    raise ConfigError(problem)
  if args.distributed:
    distributed.initialize(args)
  try:
    summary = _run(args, config, module, workdir, preempt)
  except NonFiniteLossError as e:
    e.add_note(_locate(config, workdir, e.step))  # the handler prints it below the error
    raise
  except DiskFailure as e:  # one line, no traceback wall; the chained cause names the file
    raise DiskFailure((disk_errors.disk_failure(e, workdir) or str(e))
                      + _kept(workdir)) from e
  except (OSError, ValueError) as e:  # before training: bad input
    failure = disk_errors.disk_failure(e, workdir)
    if failure is not None:  # a read-only or full disk met while setting up: named in workdir
      raise ConfigError(failure) from e
    raise
  print(json.dumps({"workdir": workdir, **_jsonable(summary)}, indent=2, allow_nan=False))
  if summary.get("preempted") and preempt.requested:
    raise _stopped(preempt.requested, f" at step {summary['step']}; " + (
        "its checkpoint is saved" if summary["step"] > summary["start_step"] else
        "nothing new to save"))


def _kept(workdir: str) -> str:
  """What a run that failed on a full disk keeps: its last good checkpoint, or none yet."""
  from jaxdl.train.checkpoint import latest_saved_step
  step = latest_saved_step(f"{workdir}/checkpoints")
  if step is None:
    return ("; the run stopped before its first checkpoint, so nothing is kept (fix it and "
            "rerun the same command to start again)")
  return (f"; the run stopped, its last good checkpoint (step {step}) is kept (fix it and rerun "
          f"the same command to resume)")


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
                     hooks=[*doctor.hooks_for(config), *own], preempt=preempt,
                     overrides=args.overrides)  # what they may set: init_from.check_overrides
  if hasattr(module, "after_training") and not summary.get("preempted"):
    with preempt.polled(False):  # e.g. print a sample from the trained model
      summary.update(module.after_training(config, workdir, summary) or {})
  return summary


def _locate(config, workdir, step: int) -> str:
  """Replays the failed step from the last checkpoint and names the first non-finite module."""
  from jaxdl.doctor import locate_nonfinite
  try:
    return locate_nonfinite(config, workdir, step).text()
  except Exception as e:  # noqa: BLE001 -- the locator is a diagnosis aid, never a new failure
    return (f"jaxdl: the NaN locator could not run ({type(e).__name__}: {e}); try "
            f"`jaxdl doctor {config.name} --workdir {workdir} --locate {step}`")


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
