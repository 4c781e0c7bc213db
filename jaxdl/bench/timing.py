"""Timing on a shared, noisy machine: alternate the contenders, keep each one's best round.

Every number `jaxdl bench` reports is a ratio of two timings taken in the same run; alternating
them round by round exposes both to the same background load, and the minimum over rounds is the
estimate least disturbed by it.
"""

from __future__ import annotations

from typing import Callable


def interleaved(runs: dict[str, Callable[[int], float]], *, steps: int,
                rounds: int) -> dict[str, float]:
  """Seconds per step of each `run(n) -> seconds for n steps`, best of `rounds` alternations."""
  best = {k: float("inf") for k in runs}
  for _ in range(rounds):
    for k, run in runs.items():
      best[k] = min(best[k], run(steps) / steps)
  return best


def linear_fit(xs, ys) -> tuple[float, float, float]:
  """Least squares y = a + b x; returns (a, b, max relative residual)."""
  n = len(xs)
  mx, my = sum(xs) / n, sum(ys) / n
  b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
  a = my - b * mx
  worst = max(abs(a + b * x - y) / y for x, y in zip(xs, ys))
  return a, b, worst
