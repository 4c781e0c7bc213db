"""`jaxdl train [EXPERIMENT[:ARG]]`: train an experiment, resuming its workdir's run.

Prints the run's summary as JSON. Exit codes come from the error's type: a
`jaxdl.train.RunError` (non-finite loss, unrecoverable spike, failed preflight, a full disk while
training) is a failed run, 1; a ValueError before training (`jaxdl.schema.ConfigError`, a workdir
of another run or in use) and a full disk or permission error during setup are bad input, 2.
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
  """Why `workdir` cannot hold a run, as one line naming the path, or None; creates nothing.

  Refused: a path that is (or lies under) a file, a name longer than the file system allows,
  and a folder that cannot be written (no write permission, or no write bits at all, which
  even root is refused so a folder made read-only on purpose stays untouched).
  """
  path = os.path.abspath(workdir)
  existing = path
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    return f"--workdir {workdir}: {existing} is a file, not a directory"
  try:
    name_max = os.pathconf(existing, "PC_NAME_MAX")
  except (OSError, ValueError):
    name_max = 255
  for part in path[len(existing):].split(os.sep):
    if len(os.fsencode(part)) > name_max:
      return (f"--workdir {workdir}: the name is too long for the file system "
              f"({len(os.fsencode(part))} > {name_max} bytes per name)")
  mode = os.stat(existing).st_mode
  if not os.access(existing, os.W_OK | os.X_OK) or not mode & 0o222:
    return f"--workdir {workdir}: {existing} is read-only"
  return None


def main(args) -> int:
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
  workdir = args.workdir or default_workdir(args.experiment, config)
  problem = check_workdir(workdir) or (distributed.check(args) if args.distributed else None)
  if problem:
    print(f"jaxdl: error: {problem}", file=sys.stderr)
    return 2
  if args.distributed:
    distributed.initialize(args)
  try:
    summary = _run(args, config, module, workdir)
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
  return 0


def _run(args, config, module, workdir: str) -> dict:
  """Trains `config` through the loop, or through the experiment's own `run`."""
  from jaxdl import doctor
  from jaxdl.train import loop
  from jaxdl.train import workdir as workdirs
  from jaxdl.train.errors import disk_failures_fail_the_run
  if hasattr(module, "run"):  # an experiment with its own loop (the optimizer toys)
    with workdirs.lock(workdir, expect_config=workdirs.read_config(workdir)):
      with disk_failures_fail_the_run(workdir):
        return module.run(config, workdir)
  # An experiment may add its own hooks: `hooks(config) -> [jaxdl.train.Hook, ...]`.
  own = module.hooks(config) if hasattr(module, "hooks") else []
  summary = loop.run(config, workdir, force=args.force, progress=not args.no_progress,
                     hooks=[*doctor.hooks_for(config), *own])
  if hasattr(module, "after_training"):  # e.g. print a sample from the trained model
    summary.update(module.after_training(config, workdir, summary) or {})
  return summary


def _disk_error(args, line: str, code: int) -> int:
  print(f"jaxdl: error: {line}", file=sys.stderr, flush=True)
  if args.as_program:  # what is left are library threads retrying the same writes
    disk_errors.silence_stderr()
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
