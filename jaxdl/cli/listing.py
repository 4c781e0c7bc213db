"""`jaxdl list`: the experiments with their one-line descriptions (read from the files' docstrings,
nothing imported, so listing needs no jax)."""

from __future__ import annotations

HELP = "list the experiments with their descriptions"


def add_arguments(parser) -> None:
  del parser  # no options


def main(args) -> None:
  del args
  from jaxdl.config import list_experiments
  rows = list_experiments()
  width = max((len(n) for n, _ in rows), default=0)
  for name, desc in rows:
    print(f"{name:<{width}}  {desc}")
