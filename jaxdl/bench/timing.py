"""Timing on a shared, noisy machine: alternate the contenders, keep each one's best round.

Every number `jaxdl bench` reports is a ratio of two timings taken in the same run; alternating
them round by round exposes both to the same background load, and the minimum over rounds is the
estimate least disturbed by it. Two clocks are kept: wall time (what a user waits) and this
process's CPU time (all threads; on a machine shared with other jobs it is barely disturbed by
their load, while wall time can swing 2x).
"""

from __future__ import annotations

import time
from typing import Callable


class Clock:
  """`with Clock() as c: ...` then c.wall, c.cpu in seconds."""

  def __enter__(self):
    self._wall, self._cpu = time.perf_counter(), time.process_time()
    return self

  def __exit__(self, *exc):
    self.wall = time.perf_counter() - self._wall
    self.cpu = time.process_time() - self._cpu


def interleaved(runs: dict[str, Callable[[int], Clock]], *, steps: int,
                rounds: int) -> dict[str, dict[str, float]]:
  """{name: {'wall': s, 'cpu': s}} per step: each clock's best over `rounds` alternations of
  `run(n) -> Clock` (n steps)."""
  best = {k: {"wall": float("inf"), "cpu": float("inf")} for k in runs}
  for _ in range(rounds):
    for k, run in runs.items():
      c = run(steps)
      best[k]["wall"] = min(best[k]["wall"], c.wall / steps)
      best[k]["cpu"] = min(best[k]["cpu"], c.cpu / steps)
  return best

