"""`jaxdl reproduce`: measure the course material's claims (`jaxdl.course.reproduce`) and print
the table claim | expected | measured | tolerance | ok.

Exit codes (`jaxdl.cli.main`'s handler): 0 every selected claim holds, 1 some claim failed (a
`RunError`), 2 bad input (an unknown name, an unwritable --json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from jaxdl import disk_errors

HELP = "measure every worked number of the course material through jaxdl (claims table)"


def _fmt(x) -> str:
  """A table cell: floats to 6 significant digits, lists elementwise."""
  if isinstance(x, bool):
    return str(x)
  if isinstance(x, float):
    return f"{x:.6g}"
  if isinstance(x, list):
    return "[" + ", ".join(_fmt(v) for v in x) + "]"
  return str(x)


def format_table(rows: list, width: int = 60) -> str:
  """claim | expected | measured | tolerance | ok, one line per `jaxdl.course.rows.Row` (long
  cells cut)."""
  cut = lambda s: s if len(s) <= width else s[:width - 3] + "..."  # noqa: E731
  cells = [("claim", "expected", "measured", "tolerance", "ok")] + [
      (r.name, cut(_fmt(r.expected)), cut(_fmt(r.measured)), r.tolerance,
       "ok" if r.ok else "FAIL") for r in rows]
  widths = [max(len(c[i]) for c in cells) for i in range(5)]
  lines = [" | ".join(c[i].ljust(widths[i]) for i in range(5)).rstrip() for c in cells]
  lines.insert(1, "-+-".join("-" * w for w in widths))
  return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("--only", metavar="NAME[,NAME]", action="append", default=[],
                 help="run only these claims (repeatable or comma-separated); see --list")
  p.add_argument("--json", metavar="FILE", help="write the rows as a JSON list to FILE")
  p.add_argument("--quick", action="store_true",
                 help="skip the slow claims (those that train a model); < 1 min")
  p.add_argument("--list", action="store_true", help="list the claims and exit")


def main(args) -> None:
  from jaxdl.config import load_config
  from jaxdl.course.reproduce import CLAIMS, experiments_of, run_claims
  from jaxdl.schema import ConfigError
  from jaxdl.train import RunError
  if args.list:
    for c in CLAIMS.values():
      print(f"{c.name:<26} {'(slow) ' if c.slow else ''}{c.doc}")
    return
  names = [n for part in args.only for n in part.split(",") if n]
  unknown = [n for n in names if n not in CLAIMS]
  if unknown:
    raise ConfigError(f"--only: unknown claim(s) {unknown}; expected some of {list(CLAIMS)}")
  problem = args.json and disk_errors.unwritable_file(args.json, "--json")
  if problem:  # before the claims are measured, not after
    raise ConfigError(problem)
  t0 = time.perf_counter()
  configs = {spec: load_config(spec)[0] for spec in experiments_of(names or None, args.quick)}
  rows = run_claims(names or None, quick=args.quick, configs=configs,
                    log=lambda s: print(s, file=sys.stderr, flush=True))
  print(format_table(rows))
  failed = [r.name for r in rows if not r.ok]
  print(f"\n{len(rows) - len(failed)}/{len(rows)} ok in {time.perf_counter() - t0:.0f}s"
        + (f"; failed: {', '.join(failed)}" if failed else ""))
  if args.json:
    with open(args.json, "w") as f:
      json.dump([r.as_json() for r in rows], f, indent=2)
  if failed:
    raise RunError(f"{len(failed)} claim(s) failed: {', '.join(failed)}")
