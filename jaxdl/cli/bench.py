"""`jaxdl bench [--only NAME[,NAME]] [--json FILE]`: run the benchmarks of `jaxdl.bench` and
print their table (bench, measure, jaxdl, baseline, ratio, target, met); see `jaxdl.bench` for
what each one measures."""

from __future__ import annotations

import json
import sys

from jaxdl import disk_errors
from jaxdl.bench import BENCHES  # the names only: the benchmarks import jax when they run

HELP = "measure throughput, MFU, compile time, loop/checkpoint/sampler/data costs vs baselines"


def add_arguments(parser) -> None:
  parser.add_argument("--only", action="append", default=[], metavar="NAME",
                      help=f"run only these benchmarks (repeatable or comma-separated): "
                           f"{', '.join(BENCHES)}")
  parser.add_argument("--json", metavar="FILE", help="also write the results as JSON here")


def selected(only: list[str]) -> list[str]:
  """The benchmarks `--only` names (each repeatable or comma-separated), in registry order; all
  when none; ValueError naming the first unknown one."""
  names = [n.strip() for item in only for n in item.split(",") if n.strip()]
  unknown = [n for n in names if n not in BENCHES]
  if unknown:
    raise ValueError(f"--only: unknown benchmark {unknown[0]!r}; expected some of "
                     f"{', '.join(BENCHES)}")
  return [n for n in BENCHES if n in names] if names else list(BENCHES)


def _fmt(x) -> str:
  """A table cell: '-' for nothing, yes / NO for a verdict, 3 significant digits."""
  if x is None:
    return "-"
  if isinstance(x, bool):
    return "yes" if x else "NO"
  if isinstance(x, float):
    return f"{x:.3g}"
  return str(x)


def format_table(rows: list[dict]) -> str:
  """The rows (`jaxdl.bench.registry._row`) as aligned columns under a header, one line each."""
  cols = ("bench", "measure", "jaxdl", "baseline", "ratio", "target", "met")
  cells = [cols] + [tuple(_fmt(r[c]) for c in cols) for r in rows]
  widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
  lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines)


def _jsonable(x):
  """`x` with numpy and jax scalars as Python numbers, for the --json file."""
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if hasattr(x, "item"):
    return x.item()
  return x


def main(args) -> None:
  from jaxdl.bench import experiments_of, run_benches
  from jaxdl.config import load_config
  names = selected(args.only)
  problem = args.json and disk_errors.unwritable_file(args.json, "--json")
  if problem:  # before the benchmarks run, not after
    raise ValueError(problem)
  log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
  configs = {spec: load_config(spec)[0] for spec in experiments_of(names)}
  results, rows = run_benches(names, log, configs)
  print(format_table(rows))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(_jsonable({"results": results, "table": rows}), f, indent=2)
