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
  fn: Callable[[], list[Row]]
  slow: bool
  doc: str


CLAIMS: dict[str, Claim] = {}


def claim(name: str, slow: bool = False):
  """Registers `fn() -> list[Row]` as the claim `name` (slow claims are left out of --quick)."""

  def wrap(fn):
    CLAIMS[name] = Claim(name, fn, slow, (fn.__doc__ or "").strip().splitlines()[0])
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
