"""The `jaxdl` command line: train, list, sample, likelihood, doctor, reproduce, bench, data, plot,
sweep, export.

Exit codes: 0 success (also after a SIGTERM, which stops `train` cleanly at any moment, saving
the current step during training), 130 a `train` stopped as cleanly by SIGINT (Ctrl-C), 1 a run
that failed (a `jaxdl.train.RunError`: non-finite loss, unrecoverable spike, failed preflight,
full disk while training), 2 bad input (a `jaxdl.schema.ConfigError` or another ValueError
before training: unknown experiment, key, type or value; a workdir of another run). Bad input is
one line on stderr and leaves the workdir untouched.

Each command is one module of this package defining `HELP`, `add_arguments(parser)` and
`main(args) -> int`; it imports jax and the library inside `main`, so `jaxdl --help` and
`jaxdl list` start without loading jax.
"""

from __future__ import annotations

import argparse
import gc
import sys

from jaxdl.cli import (bench, data, doctor, export, likelihood, listing, logs, plot, reproduce,
                       sample, sweep, train)

# The commands in the order `jaxdl --help` lists them.
COMMANDS = {"train": train, "list": listing, "sample": sample, "likelihood": likelihood,
            "doctor": doctor, "reproduce": reproduce, "bench": bench, "data": data, "plot": plot,
            "sweep": sweep, "export": export}


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


def main(argv: list[str] | None = None) -> int:
  """Runs one `jaxdl` command; `argv` None reads sys.argv (the program), a list is a call from
  Python (tests, notebooks), whose stderr is never silenced."""
  as_program = argv is None
  argv = split_config_flags(list(sys.argv[1:] if argv is None else argv))
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.command is None:  # `jaxdl` alone trains the default experiment
    args = parser.parse_args(["train", *argv])
  args.as_program = as_program
  if as_program and FREEZE_LIBRARY_HEAP and args.command not in LIGHT_COMMANDS:
    load_library_frozen()  # a caller from Python keeps its own heap as it is
  logs.setup()
  try:
    return COMMANDS[args.command].main(args)
  except (ValueError, RuntimeError) as e:  # interim: the `cli` branch's one handler replaces it
    from jaxdl.train.errors import RunError
    if not isinstance(e, (ValueError, RunError)):
      raise
    error = "error: " if isinstance(e, ValueError) else ""
    print(f"jaxdl: {error}{str(e).splitlines()[0]}", file=sys.stderr)
    return 2 if isinstance(e, ValueError) else 1

