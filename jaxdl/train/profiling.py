"""`train.profile_steps=(a, b)`: a `jax.profiler` trace of updates a..b in workdir/profile/.

The trace starts before update a is dispatched and stops once update b has finished (the one
host sync the window costs, paid only when it is asked for). View it with TensorBoard's profile
plugin (`tensorboard --logdir WORKDIR/profile`) or open the `.xplane.pb`/`.trace.json.gz` in
Perfetto (ui.perfetto.dev). `jaxdl train ... --profile` picks a window after the compile step.
"""

from __future__ import annotations

import logging
import pathlib

import jax

log = logging.getLogger("jaxdl")


def default_window(steps: int) -> tuple[int, int]:
  """`--profile`: three updates from the third on (1 compiles, 2 may still warm caches)."""
  start = min(3, steps)
  return start, min(start + 2, steps)


class Profiler:
  """Starts and stops the trace around the updates of `window` (1-based, inclusive)."""

  def __init__(self, workdir, window: tuple[int, int], enabled: bool = True):
    self.dir = pathlib.Path(workdir) / "profile"
    self.start, self.stop = window
    self.enabled = enabled and self.start > 0
    self.active = False

  def before(self, update: int) -> None:
    """Called before dispatching `update`."""
    if self.enabled and update == self.start and not self.active:
      self.dir.mkdir(parents=True, exist_ok=True)
      jax.profiler.start_trace(str(self.dir))
      self.active = True

  def after(self, update: int, outputs) -> None:
    """Called after dispatching `update`: stops the trace once the window's last update ran."""
    if self.active and update >= self.stop:
      jax.block_until_ready(outputs)  # the trace must hold the last step's device work
      self.close()
      log.info("profile of steps %d-%d written to %s", self.start, self.stop, self.dir)

  def close(self) -> None:
    if self.active:
      jax.profiler.stop_trace()
      self.active = False
      self.enabled = False  # one window per run, even if a rewind passes it again
