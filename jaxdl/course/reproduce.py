"""`jaxdl reproduce`: every worked number of the course material, measured through jaxdl.

    jaxdl reproduce                       all claims (< 5 min on a 2-core CPU)
    jaxdl reproduce --quick               the claims that take seconds (< 1 min)
    jaxdl reproduce --only NAME[,NAME]    some claims (`jaxdl reproduce --list` names them)
    jaxdl reproduce --json FILE           also write [{"name", "expected", "measured",
                                          "tolerance", "ok"}, ...]

Exit codes: 0 every selected claim holds, 1 some claim failed, 2 bad input (an unknown name).

A claim is a function registered with `@claim(name, slow=...)` that measures one statement
through jaxdl's public API (`jaxdl.optim`, `jaxdl.models`, `jaxdl.generative`, `jaxdl.train`,
`jaxdl.course.measure`) and returns rows. Each row is a `Row`: `expected` and `measured` are
numbers, lists of numbers, or booleans; `tolerance` says how they are compared:
  'abs X'     |measured - expected| <= X, elementwise
  'rel X%'    |measured - expected| <= X/100 |expected|, elementwise
  'exact'     equal (integers, booleans, or floats meant to agree bit for bit)
  otherwise   a stated relation (e.g. 'bn < plain'), decided by the claim itself
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from jaxdl.course import claims as _claims  # noqa: F401 -- registers the claims
from jaxdl.course import claims_data as _claims_data  # noqa: F401 -- registers the data claims
from jaxdl.course import claims_arch as _claims_arch  # noqa: F401 -- architecture claims
from jaxdl.course import claims_generative as _claims_gen  # noqa: F401 -- generative claims
from jaxdl.course.rows import CLAIMS, Claim, Row, claim, close, exact

HELP = "measure every worked number of the course material through jaxdl (claims table)"


# ============================================================================ running


def run_claims(names=None, quick: bool = False, log=None) -> list[Row]:
  """Runs the selected claims (all, or `names`; `quick` drops slow ones) and returns the rows.

  A claim that raises becomes one failed row carrying the error, so one broken API does not
  hide the other claims.
  """
  selected = [CLAIMS[n] for n in (names or CLAIMS)]
  if quick:
    selected = [c for c in selected if not c.slow]
  rows = []
  for c in selected:
    t0 = time.perf_counter()
    try:
      got = c.fn()
    except Exception as e:  # noqa: BLE001  reported as a failed claim, with the error
      got = [Row(c.name, c.doc, f"{type(e).__name__}: {e}", "-", False)]
    if log is not None:
      log(f"{c.name}: {time.perf_counter() - t0:.1f}s")
    rows += got
  return rows


def _fmt(x) -> str:
  if isinstance(x, bool):
    return str(x)
  if isinstance(x, float):
    return f"{x:.6g}"
  if isinstance(x, list):
    return "[" + ", ".join(_fmt(v) for v in x) + "]"
  return str(x)


def format_table(rows: list[Row], width: int = 60) -> str:
  """claim | expected | measured | tolerance | ok, one line per row (long cells cut)."""
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


def main(args) -> int:
  if args.list:
    for c in CLAIMS.values():
      print(f"{c.name:<26} {'(slow) ' if c.slow else ''}{c.doc}")
    return 0
  names = [n for part in args.only for n in part.split(",") if n]
  unknown = [n for n in names if n not in CLAIMS]
  if unknown:
    print(f"jaxdl: error: --only: unknown claim(s) {unknown}; expected some of {list(CLAIMS)}",
          file=sys.stderr)
    return 2
  t0 = time.perf_counter()
  rows = run_claims(names or None, quick=args.quick,
                    log=lambda s: print(s, file=sys.stderr, flush=True))
  print(format_table(rows))
  failed = [r.name for r in rows if not r.ok]
  print(f"\n{len(rows) - len(failed)}/{len(rows)} ok in {time.perf_counter() - t0:.0f}s"
        + (f"; failed: {', '.join(failed)}" if failed else ""))
  if args.json:
    with open(args.json, "w") as f:
      json.dump([r.as_json() for r in rows], f, indent=2)
  return 1 if failed else 0


__all__ = ["CLAIMS", "Claim", "Row", "claim", "close", "exact", "run_claims", "format_table",
           "add_arguments", "main", "HELP"]
