"""The `jaxdl` command line: train, list, sample, likelihood, doctor, reproduce, bench, data, plot.

Exit codes: 0 success (also after a SIGTERM checkpoint), 1 a run that failed (non-finite loss),
2 bad input (unknown experiment, key, type or value; a workdir of another run). Bad input is one
line on stderr and leaves the workdir untouched.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import os
import sys
import traceback

from jaxdl import disk_errors

DEFAULT_EXPERIMENT = "char_gpt"


def _train_args(p: argparse.ArgumentParser) -> None:
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
  dist = p.add_argument_group("multi-host")
  dist.add_argument("--distributed", action="store_true",
                    help="call jax.distributed.initialize (auto-detects SLURM, TPU pods, ...)")
  dist.add_argument("--coordinator", help="host:port of process 0")
  dist.add_argument("--num-processes", type=int)
  dist.add_argument("--process-id", type=int)


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="jaxdl", description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command")
  _train_args(sub.add_parser("train", help="train an experiment (resumes automatically)"))
  sub.add_parser("list", help="list the experiments with their descriptions")
  for name, module in _EXTENSIONS.items():
    ext = _load_extension(module)
    if ext is not None:
      ext.add_arguments(sub.add_parser(name, help=ext.HELP))
  return parser


# Commands provided by other packages: each module defines HELP, add_arguments(parser), main(args).
_EXTENSIONS = {"sample": "jaxdl.generative.cli", "likelihood": "jaxdl.generative.likelihood_cli",
               "doctor": "jaxdl.doctor",
               "reproduce": "jaxdl.course.reproduce", "bench": "jaxdl.bench",
               "data": "jaxdl.data.cli", "plot": "jaxdl.train.plots"}


# Packages whose tasks and models register on import; an experiment file may name them without
# importing them itself.
_PLUGINS = ("jaxdl.generative", "jaxdl.course.planted")


def _load_extension(module: str):
  try:
    mod = importlib.import_module(module)
  except ModuleNotFoundError as e:
    if e.name and module.startswith(e.name):
      return None
    raise
  return mod if hasattr(mod, "add_arguments") else None


def _split_config_flags(argv: list[str]) -> list[str]:
  """Rewrites `--config.key=value` / `--config.key value` into `--set key=value`."""
  out, i = [], 0
  while i < len(argv):
    a = argv[i]
    if a.startswith("--config."):
      if "=" in a:
        out += ["--set", a[len("--config."):]]
      elif i + 1 < len(argv):
        out += ["--set", f"{a[len('--config.'):]}={argv[i + 1]}"]
        i += 1
    else:
      out.append(a)
    i += 1
  return out


class _StderrHandler(logging.StreamHandler):
  """Writes to whatever `sys.stderr` is when a record is emitted, not the one at setup: a second
  in-process `main` call (tests, notebooks) may run after the first one's stream was closed."""

  @property
  def stream(self):
    return sys.stderr

  @stream.setter
  def stream(self, value):
    del value


def _setup_logging() -> None:
  # jaxdl's own messages go to stderr at INFO whatever absl did to the root logger on import.
  logger = logging.getLogger("jaxdl")
  if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  logger.propagate = False
  if not isinstance(sys.unraisablehook, disk_errors.QuietClosedLoop):
    sys.unraisablehook = disk_errors.QuietClosedLoop(sys.unraisablehook)
  for noisy in ("absl", "orbax", "jax._src", "etils", "asyncio"):
    noisy = logging.getLogger(noisy)
    noisy.setLevel(logging.WARNING)
    if not any(isinstance(f, disk_errors.DiskErrorFilter) for f in noisy.filters):
      noisy.addFilter(disk_errors.DiskErrorFilter())
  try:
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)
  except ImportError:
    pass


def _initialize_distributed(args) -> None:
  import jax
  kwargs = {}
  if args.coordinator:
    kwargs["coordinator_address"] = args.coordinator
  if args.num_processes is not None:
    kwargs["num_processes"] = args.num_processes
  if args.process_id is not None:
    kwargs["process_id"] = args.process_id
  timeout = int(os.environ.get("JAXDL_DIST_TIMEOUT", "120"))
  kwargs["initialization_timeout"] = timeout + 30  # the watchdog below speaks first

  def give_up():
    # jax would abort with a C++ fatal log when a process or the coordinator never answers.
    print(f"jaxdl: error: --distributed: the processes did not all connect through coordinator "
          f"{args.coordinator or '(auto-detected)'} within {timeout} s (JAXDL_DIST_TIMEOUT); "
          f"check that all {args.num_processes or ''} processes were started and that the "
          f"address is reachable", file=sys.stderr, flush=True)
    os._exit(2)

  import threading
  watchdog = threading.Timer(timeout, give_up)
  watchdog.daemon = True
  watchdog.start()
  try:
    jax.distributed.initialize(**kwargs)
  finally:
    watchdog.cancel()


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


def _cluster_detected() -> bool:
  """Whether jax.distributed.initialize can find the coordinator itself (SLURM, Open MPI,
  TPU VMs), using jax's own detectors minus the opt-in ones."""
  try:
    from jax._src import clusters
    return any(env.is_env_present() for env in clusters.ClusterEnv._cluster_types
               if not getattr(env, "opt_in_only_method", None)
               and env.__name__ not in ("Mpi4pyCluster", "K8sCluster"))
  except Exception:  # noqa: BLE001 -- a private API; without it, ask for the flags
    return False


def _check_distributed(args) -> str | None:
  """Why the multi-host flags cannot work, as one line, or None (before jax.distributed,
  whose own failures are aborts or waits on a coordinator that will never answer)."""
  n, pid = args.num_processes, args.process_id
  if n is not None and n < 1:
    return f"--num-processes: must be >= 1, got {n}"
  if pid is not None and n is None:
    return "--process-id: needs --num-processes"
  if pid is not None and not 0 <= pid < n:
    return f"--process-id: must be in 0..{n - 1} for --num-processes {n}, got {pid}"
  if args.coordinator is None and not _cluster_detected():
    return ("--distributed: no --coordinator HOST:PORT given and no cluster environment "
            "(SLURM, Open MPI, TPU VM) to find one; pass --coordinator, --num-processes and "
            "--process-id")
  if args.coordinator is not None and (n is None or pid is None) and not _cluster_detected():
    return ("--coordinator: needs --num-processes and --process-id outside a cluster "
            "environment")
  return None


def cmd_train(args) -> int:
  from jaxdl.config import ConfigError, default_workdir, load_config
  for plugin in _PLUGINS:
    importlib.import_module(plugin)
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
  problem = check_workdir(workdir) or (_check_distributed(args) if args.distributed else None)
  if problem:
    print(f"jaxdl: error: {problem}", file=sys.stderr)
    return 2
  if args.distributed:
    _initialize_distributed(args)
  from jaxdl import doctor
  from jaxdl.train import loop
  try:
    if hasattr(module, "run"):  # an experiment with its own loop (the optimizer toys)
      from jaxdl.train import workdir as workdirs
      with workdirs.lock(workdir, expect_config=workdirs.read_config(workdir)):
        summary = module.run(config, workdir)
    else:
      # An experiment may add its own hooks: `hooks(config) -> [jaxdl.train.Hook, ...]`.
      own = module.hooks(config) if hasattr(module, "hooks") else []
      summary = loop.run(config, workdir, force=args.force, progress=not args.no_progress,
                         hooks=[*doctor.hooks_for(config), *own])
      if hasattr(module, "after_training"):  # e.g. print a sample from the trained model
        summary.update(module.after_training(config, workdir, summary) or {})
  except (OSError, ValueError) as e:
    failure = disk_errors.disk_failure(e, workdir)
    if failure is not None:  # a full disk or a permission error: one line, no traceback wall
      during = hasattr(module, "run") or _in_training_loop(e)
      print(f"jaxdl: error: {failure}" + ("; the run stopped, its last good checkpoint is kept "
            "(fix it and rerun the same command to resume)" if during else ""), file=sys.stderr,
            flush=True)
      if args.as_program:
        disk_errors.silence_stderr()
      return 1 if during else 2
    if isinstance(e, OSError):
      raise
    print(f"jaxdl: error: {str(e).splitlines()[0]}", file=sys.stderr)  # bad config or value,
    return 2                                                              # another run's workdir
  except loop.NonFiniteLossError as e:
    print(f"jaxdl: {e}", file=sys.stderr)
    _locate(config, workdir, e.step)
    return 1
  except (loop.SpikeError, loop.PreflightError) as e:
    print(f"jaxdl: {e}", file=sys.stderr)
    return 1
  print(json.dumps({"workdir": workdir, **_jsonable(summary)}, indent=2, allow_nan=False))
  return 0


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


def _in_training_loop(e: BaseException) -> bool:
  """Whether `e` came out of the training loop (steps, logs, saves, the plot) rather than the
  run's setup (config, workdir, restore): a failed run exits 1, a setup failure 2."""
  from jaxdl.train import loop
  code = loop._Loop.train.__code__  # noqa: SLF001 -- the loop's one entry point
  return any(frame.f_code is code for frame, _ in traceback.walk_tb(e.__traceback__))


def cmd_list(args) -> int:
  del args
  from jaxdl.config import list_experiments
  rows = list_experiments()
  width = max((len(n) for n, _ in rows), default=0)
  for name, desc in rows:
    print(f"{name:<{width}}  {desc}")
  return 0


def main(argv: list[str] | None = None) -> int:
  as_program = argv is None  # `jaxdl ...` / `python -m jaxdl`, not a call from Python code
  argv = _split_config_flags(list(sys.argv[1:] if argv is None else argv))
  parser = build_parser()
  args = parser.parse_args(argv)
  args.as_program = as_program
  _setup_logging()
  if args.command in (None, "train"):
    if args.command is None:
      args = parser.parse_args(["train", *argv])
      args.as_program = as_program
    return cmd_train(args)
  if args.command == "list":
    return cmd_list(args)
  return _load_extension(_EXTENSIONS[args.command]).main(args)


if __name__ == "__main__":
  sys.exit(main())
