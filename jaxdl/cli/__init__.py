"""The `jaxdl` command line: train, list, sample, generate, nfe, likelihood, doctor, reproduce,
bench, data, plot, sweep, export, eval.

Exit codes, from the type of what a command raised, through one handler (`main`): 0 success, also
after a SIGTERM (a preemption), which stops any command cleanly at any moment (`train` saves its
current step during training; a rerun resumes); 130 stopped as cleanly by SIGINT (Ctrl-C); 1 a
run that failed (a `jaxdl.train.RunError`: non-finite loss, unrecoverable spike, failed
preflight or check, a sweep run or claim that failed, a full disk while training); 2 bad input
(a `jaxdl.schema.ConfigError` or another ValueError, a missing file, a full disk or unwritable
folder before the work: unknown experiment, key, type or value; a workdir of another run). Each
is one line on stderr, `jaxdl: error: ...` for bad input, `jaxdl: ...` otherwise; bad input and a
stop before the work leave the workdir untouched.

Each command is one module of this package defining `HELP`, `add_arguments(parser)` and
`main(args)`, which returns on success and raises otherwise (never an exit code or an error
line of its own); it imports jax and the library inside `main`, so `jaxdl --help` and
`jaxdl list` start without loading jax. `args.preempt` is the stop handler, entered before
anything else (`jaxdl.stop_signals`): a command in `POLLING_COMMANDS` polls its `requested`
and raises `Stopped` once it has stopped cleanly; in any other a signal raises `Interrupted`.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

from jaxdl import disk_errors, stop_signals
from jaxdl.cli import (bench, data, doctor, export, generate, likelihood, listing, logs, nfe, plot,
                       reproduce, sample, sweep, train)
from jaxdl.cli import eval as eval_command  # as 'eval' it would hide the builtin

# The commands in the order `jaxdl --help` lists them.
COMMANDS = {"train": train, "list": listing, "sample": sample, "generate": generate, "nfe": nfe,
            "likelihood": likelihood, "doctor": doctor, "reproduce": reproduce, "bench": bench,
            "data": data, "plot": plot, "sweep": sweep, "export": export, "eval": eval_command}


def build_parser() -> argparse.ArgumentParser:
  summary = " ".join(__doc__.split("\n\n")[0].split())  # the docstring's first paragraph
  parser = argparse.ArgumentParser(prog="jaxdl", description=summary)
  sub = parser.add_subparsers(dest="command")
  for name, command in COMMANDS.items():
    command.add_arguments(sub.add_parser(name, help=command.HELP))
  return parser


def split_config_flags(argv: list[str]) -> list[str]:
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


# Commands that run without the library (`jaxdl list` reads experiment docstrings only).
LIGHT_COMMANDS = ("list",)
FREEZE_LIBRARY_HEAP = True  # `jaxdl bench --only startup`'s baseline process sets it False


def load_library_frozen() -> None:
  """Imports the library (jax, flax, optax, orbax, grain and jaxdl.train) with the cyclic
  garbage collector paused, then moves every object the imports made to the collector's
  permanent generation (`gc.freeze`) and resumes it.

  Those objects, modules, classes and functions, live as long as the process. Left in the
  tracked generations, each full collection walks all of them again, and tracing and compiling
  a model allocate enough to trigger many. Frozen, a collection walks only what the run itself
  made. Measured by `jaxdl bench --only startup` (whole `python -m jaxdl train` processes).
  """
  gc.disable()
  try:
    import jaxdl.train  # noqa: F401 -- what every command but LIGHT_COMMANDS runs on
  finally:
    gc.freeze()
    gc.enable()


# Commands whose code polls `Preemption.requested` itself (the training loop, a sweep's
# scheduler): there a first signal only sets it. In the others it raises `Interrupted` at once.
POLLING_COMMANDS = ("train", "sweep")
# Set in every run a local sweep starts (`jaxdl.sweep.slots.PARENT_VAR`): only then is
# the sweep package imported, to take the run's slot.
SWEEP_CHILD_VAR = "JAXDL_SWEEP_PARENT"


def main(argv: list[str] | None = None) -> int:
  """Runs one `jaxdl` command and returns its exit code (module docstring); `argv` None reads
  sys.argv (the program), a list is a call from Python (tests, notebooks), whose stderr is never
  silenced and whose heap is left as it is.

  Its first act is the stop handler (`jaxdl.stop_signals.Preemption`): a SIGTERM or SIGINT
  while the library imports is recorded and the command stops once the import is done, in one
  line, before anything is written (a KeyboardInterrupt inside an extension's import would be
  an ImportError wall instead).
  """
  as_program = argv is None
  with stop_signals.Preemption() as preempt, preempt.polled():
    stop_signals.reached("start")
    try:
      _run(list(sys.argv[1:] if argv is None else argv), as_program, preempt)
      return 0
    except SystemExit:  # argparse's usage errors (2) and --help (0), said by argparse
      raise
    except BaseException as e:  # pylint: disable=broad-except -- the one exit-code handler
      return _exit_code(e, as_program)


def _run(argv: list[str], as_program: bool, preempt: stop_signals.Preemption) -> None:
  """Parses `argv`, imports the library, then runs the command; raises what it raised."""
  argv = split_config_flags(argv)
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.command is None:  # `jaxdl` alone trains the default experiment
    args = parser.parse_args(["train", *argv])
  args.as_program, args.preempt = as_program, preempt
  if as_program and os.environ.get(SWEEP_CHILD_VAR):  # before anything starts threads
    from jaxdl.sweep.slots import enter_slot  # pylint: disable=g-import-not-at-top
    enter_slot()
  if (as_program and FREEZE_LIBRARY_HEAP and args.command not in LIGHT_COMMANDS
      and not preempt.requested):  # (stopped already: why load it)
    stop_signals.reached("importing")  # a signal from here on is met while jax loads
    load_library_frozen()  # a caller from Python keeps its own heap as it is
  if preempt.requested:  # while the library imported: nothing done yet
    raise stop_signals.Stopped(preempt.requested, f"stopped by {preempt.requested} before "
                                                  f"jaxdl {args.command} started; nothing written")
  logs.setup()
  with preempt.polled(args.command in POLLING_COMMANDS):
    COMMANDS[args.command].main(args)
  if preempt.requested:  # a signal that arrived after the command's last poll
    raise stop_signals.Stopped(preempt.requested, f"stopped by {preempt.requested} as "
                                                  f"jaxdl {args.command} finished")


def _exit_code(e: BaseException, as_program: bool) -> int:
  """Reports what a command raised in one line on stderr and returns the exit code (module
  docstring); anything else is a bug, re-raised with its traceback."""
  stop = stop_signals.stop_in(e)
  if stop is None and isinstance(e, KeyboardInterrupt):  # SIGINT at Python's own handler
    stop = stop_signals.Stopped("SIGINT")
  if stop is not None:
    print(f"jaxdl: {stop.line}", file=sys.stderr)
    return stop_signals.exit_code(stop.signal_name)
  run_error = _is_run_error(e)
  code = 1 if run_error else 2
  if run_error or isinstance(e, (OSError, ValueError)):
    if disk_errors.disk_failure(e) is not None:  # one raised about it says it already
      _disk_error(disk_errors.own_disk_failure(e) or str(e).splitlines()[0], code, as_program)
      return code
  if run_error:
    print(f"jaxdl: {e}", *getattr(e, "__notes__", ()), sep="\n", file=sys.stderr)
    return code
  if isinstance(e, (ValueError, FileNotFoundError)):
    print(f"jaxdl: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
          file=sys.stderr)
    return code
  raise e


def _is_run_error(e: BaseException) -> bool:
  """Whether `e` is a `jaxdl.train.RunError`; one exists only once jaxdl.train has loaded, so
  the check never imports jax itself (`jaxdl list`, `--help`)."""
  errors = sys.modules.get("jaxdl.train.errors")
  return errors is not None and isinstance(e, errors.RunError)


def _disk_error(line: str, code: int, as_program: bool) -> None:
  """Reports a full disk or a permission error in one line. The `jaxdl` program then ends at
  once: the command has closed all it owns, and what is left are library threads retrying the
  same writes, and orbax's signalling threads of a failed save, which wait (as threads the
  interpreter joins at exit) for a signal that save never sends, for orbax's coordination
  timeout of many minutes. A call from Python returns to its caller."""
  print(f"jaxdl: error: {line}", file=sys.stderr, flush=True)
  if as_program:
    disk_errors.silence_stderr()
    sys.stdout.flush()
    os._exit(code)  # pylint: disable=protected-access
