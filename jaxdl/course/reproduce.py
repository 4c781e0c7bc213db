"""Every worked number of the course material, measured through jaxdl (`jaxdl reproduce`, in
`jaxdl.cli.reproduce`):

    jaxdl reproduce                       all claims (< 5 min on a 2-core CPU)
    jaxdl reproduce --quick               the claims that take seconds (< 1 min)
    jaxdl reproduce --only NAME[,NAME]    some claims (`jaxdl reproduce --list` names them)
    jaxdl reproduce --json FILE           also write [{"name", "expected", "measured",
                                          "tolerance", "ok"}, ...]

Exit codes: 0 every selected claim holds, 1 some claim failed, 2 bad input (an unknown name).

A claim is a function registered with `@claim(name, slow=...)` that measures one statement
through jaxdl's public API (`jaxdl.optim`, `jaxdl.models`, `jaxdl.generative`, `jaxdl.train`,
`jaxdl.course.measure`) and returns rows. Each row is a `Row`: `expected` and `measured` are
numbers, lists of numbers, booleans or (an interval's) text; `tolerance` says how they are
compared:
  'abs X'     |measured - expected| <= X, elementwise
  'rel X%'    |measured - expected| <= X/100 |expected|, elementwise
  'exact'     equal (integers, booleans, or floats meant to agree bit for bit)
  '95% t interval'  a comparison over seeds: measured 'A - B = m [95% CI lo, hi] over n seeds
              (d_1, ...)', m +- t_{0.975, n-1} s / sqrt(n) of the per-seed differences (or
              ratios); ok when the interval lies on the side `expected` states
              (`jaxdl.course.rows.interval_row`)
  otherwise   a stated relation (e.g. 'bn < plain'), decided by the claim itself
"""

from __future__ import annotations

import time

from jaxdl.course import claims as _claims  # noqa: F401 -- registers the claims
from jaxdl.course import claims_data as _claims_data  # noqa: F401 -- registers the data claims
from jaxdl.course import claims_arch as _claims_arch  # noqa: F401 -- architecture claims
from jaxdl.course import claims_generative as _claims_gen  # noqa: F401 -- generative claims
from jaxdl.course.rows import CLAIMS, Claim, Row, claim, close, exact

# ============================================================================ running


def selected_claims(names=None, quick: bool = False) -> list[Claim]:
  """The claims `names` (all when None), less the slow ones when `quick`."""
  selected = [CLAIMS[n] for n in (names or CLAIMS)]
  return [c for c in selected if not (quick and c.slow)]


def experiments_of(names=None, quick: bool = False) -> list[str]:
  """The experiment specs whose configs the selected claims measure (`run_claims`' `configs`)."""
  return sorted({spec for c in selected_claims(names, quick) for spec in c.experiments})


def run_claims(names=None, quick: bool = False, log=None, configs=None) -> list[Row]:
  """Runs the selected claims (all, or `names`; `quick` drops slow ones) and returns the rows.

  `configs`: {spec: config} holding every spec of `experiments_of(names, quick)`, loaded by the
  caller (with `jaxdl.config.load_config`): claims measure configs, they load none.
  A claim that raises becomes one failed row carrying the error, so one broken API does not
  hide the other claims.
  """
  selected = selected_claims(names, quick)
  configs = configs or {}
  missing = [s for s in experiments_of(names, quick) if s not in configs]
  if missing:
    raise ValueError(f"run_claims: configs of {missing} missing; the claims measure them "
                     "(load each with jaxdl.config.load_config)")
  rows = []
  for c in selected:
    t0 = time.perf_counter()
    try:
      got = c.fn(*(configs[spec] for spec in c.experiments))
    except Exception as e:  # noqa: BLE001  reported as a failed claim, with the error
      got = [Row(c.name, c.doc, f"{type(e).__name__}: {e}", "-", False)]
    if log is not None:
      log(f"{c.name}: {time.perf_counter() - t0:.1f}s")
    rows += got
  return rows


__all__ = ["CLAIMS", "Claim", "Row", "claim", "close", "exact", "experiments_of", "run_claims",
           "selected_claims"]
