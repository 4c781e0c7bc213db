"""Claim rows and the claim registry: how a measured number is compared with the course's."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np


@dataclasses.dataclass
class Row:
  name: str
  expected: Any
  measured: Any
  tolerance: str
  ok: bool

  def as_json(self) -> dict:
    return {"name": self.name, "expected": _plain(self.expected),
            "measured": _plain(self.measured), "tolerance": self.tolerance, "ok": bool(self.ok)}


@dataclasses.dataclass(frozen=True)
class Claim:
  name: str
  fn: Callable[..., list[Row]]
  slow: bool
  doc: str
  experiments: tuple[str, ...] = ()  # specs whose configs `fn` takes, in order


CLAIMS: dict[str, Claim] = {}


def claim(name: str, slow: bool = False, experiments: tuple[str, ...] = ()):
  """Registers `fn(*configs) -> list[Row]` as the claim `name` (slow claims are left out of
  --quick). `experiments`: the specs ('moons_mlp:bn') of the experiment configs the claim
  measures, which `fn` receives in that order; the caller loads them (`jaxdl reproduce`)."""

  def wrap(fn):
    CLAIMS[name] = Claim(name, fn, slow, (fn.__doc__ or "").strip().splitlines()[0],
                         tuple(experiments))
    return fn

  return wrap


def _plain(x):
  if isinstance(x, (bool, np.bool_)):
    return bool(x)
  if isinstance(x, (int, np.integer)):
    return int(x)
  if isinstance(x, (float, np.floating)):
    return float(x)
  if isinstance(x, (list, tuple, np.ndarray)):
    return [_plain(v) for v in np.asarray(x).tolist()] if isinstance(x, np.ndarray) else [
        _plain(v) for v in x]
  return x


def close(name: str, expected, measured, *, atol: float | None = None,
          rtol: float | None = None) -> Row:
  """A row comparing numbers (or equal-length lists) within an absolute or relative tolerance."""
  e = np.asarray(expected, np.float64)
  m = np.asarray(measured, np.float64)
  if atol is not None:
    ok, tol = bool(np.all(np.abs(m - e) <= atol)), f"abs {atol:g}"
  else:
    ok, tol = bool(np.all(np.abs(m - e) <= rtol * np.abs(e))), f"rel {100 * rtol:g}%"
  return Row(name, _plain(expected), _plain(measured), tol, ok and bool(np.all(np.isfinite(m))))


def exact(name: str, expected, measured) -> Row:
  return Row(name, _plain(expected), _plain(measured), "exact",
             _plain(expected) == _plain(measured))


# ============================================================================ over seeds
#
# A claim that compares two settings A and B measures both on seeds k = 1..n (paired: seed k's
# two runs share what the seed draws, where the settings allow) and reports the per-seed
# difference d_k = A_k - B_k (or a per-seed ratio) as its mean with a 95% t interval:
#
#   m = (1/n) sum d_k,   s^2 = (1/(n-1)) sum (d_k - m)^2,   m +- t_{0.975, n-1} s / sqrt(n)
#
# (t_{0.975, 2} = 4.303, t_{0.975, 4} = 2.776). The claim holds when the interval lies on the
# stated side of its bound: a difference that one seed shows but the seeds' spread covers does
# not pass.


def seed_interval(values_S, level: float = 0.95) -> tuple[float, float, float]:
  """(mean, low, high) of the two-sided t interval of the mean of S >= 2 per-seed values (the
  sweep report's `t_interval`)."""
  from jaxdl.sweep.report import t_interval
  values_S = [float(v) for v in values_S]
  if len(values_S) < 2:
    raise ValueError(f"seed_interval: {len(values_S)} value(s); an interval needs 2 or more")
  mean, half = t_interval(values_S, level)
  return mean, mean - half, mean + half


def interval_row(name: str, label: str, values_S, *, above: float | None = None,
                 below: float | None = None, digits: int = 3) -> Row:
  """A row for a per-seed quantity: measured 'label = m [95% CI lo, hi] over n seeds (v_1, ...)'.
  Ok when the interval lies above `above` and below `below` (both given: inside)."""
  mean, lo, hi = seed_interval(values_S)
  f = lambda x: f"{x:.{digits}f}"  # noqa: E731
  measured = (f"{label} = {f(mean)} [95% CI {f(lo)}, {f(hi)}] over {len(values_S)} seeds "
              f"({', '.join(f(v) for v in values_S)})")
  bounds = ([f"> {above:g}"] if above is not None else []) + (
      [f"< {below:g}"] if below is not None else [])
  ok = ((above is None or lo > above) and (below is None or hi < below)
        and bool(np.all(np.isfinite(values_S))))
  return Row(name, f"95% CI {' and '.join(bounds)}", measured, "95% t interval", bool(ok))
