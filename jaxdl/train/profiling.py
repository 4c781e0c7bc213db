"""`train.profile_steps=(a, b)`: a `jax.profiler` trace of updates a..b in workdir/profile/.

The trace starts before update a is dispatched and stops once update b has finished (the one
host sync the window costs, paid only when it is asked for). View it with TensorBoard's profile
plugin (`tensorboard --logdir WORKDIR/profile`) or open the `.xplane.pb`/`.trace.json.gz` in
Perfetto (ui.perfetto.dev). `jaxdl train ... --profile` picks a window after the compile step.
Each update's dispatch is a `jax.profiler.StepTraceAnnotation('train', step_num=s)`, which the
profile plugin uses to split the trace into steps.

`read_trace(workdir)` summarizes the newest trace for `jaxdl plot --profile WORKDIR`
(`jaxdl.train.plots.plot_profile`): the host's dispatch span of each step, the span of each
execution of a compiled program (first op start to last op end of one run of one XLA module),
and the time per op kind (an op's name less its numeric suffix, `fusion.12` -> `fusion`)
summed over the executions and over the threads that ran ops (on a CPU several threads run ops
at once, so this sum can exceed the wall time).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import pathlib
import re

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
    self.step = None   # the open StepTraceAnnotation

  def before(self, update: int) -> None:
    """Called before dispatching `update`."""
    if self.enabled and update == self.start and not self.active:
      self.dir.mkdir(parents=True, exist_ok=True)
      jax.profiler.start_trace(str(self.dir))
      self.active = True
    if self.active:
      self.step = jax.profiler.StepTraceAnnotation("train", step_num=update)
      self.step.__enter__()

  def after(self, update: int, outputs) -> None:
    """Called after dispatching `update`: stops the trace once the window's last update ran."""
    if self.step is not None:
      self.step.__exit__(None, None, None)
      self.step = None
    if self.active and update >= self.stop:
      jax.block_until_ready(outputs)  # the trace must hold the last step's device work
      self.close()
      log.info("profile of steps %d-%d written to %s", self.start, self.stop, self.dir)

  def close(self) -> None:
    if self.step is not None:  # a step that raised between before() and after()
      self.step.__exit__(None, None, None)
      self.step = None
    if self.active:
      jax.profiler.stop_trace()
      self.active = False
      self.enabled = False  # one window per run, even if a rewind passes it again


@dataclasses.dataclass
class Trace:
  """What `read_trace` found; times in ms from the first event shown."""
  path: pathlib.Path
  steps: list[tuple[int, float, float]]          # (step, start, duration): host dispatch
  executions: list[tuple[str, float, float]]     # (XLA module, start, duration)
  op_ms: dict[str, float]                        # op kind -> ms summed over its executions


def _op_kind(name: str) -> str:
  return re.sub(r"[.:]\d+$", "", name.removeprefix("end: "))


def read_trace(workdir) -> Trace:
  """Summarizes the newest `*.xplane.pb` under workdir/profile/ (see the module docstring)."""
  found = sorted((pathlib.Path(workdir) / "profile").rglob("*.xplane.pb"),
                 key=lambda p: p.stat().st_mtime)
  if not found:
    raise FileNotFoundError(f"{pathlib.Path(workdir) / 'profile'}: no trace (*.xplane.pb); "
                            f"train with --profile or train.profile_steps=(start, stop)")
  data = jax.profiler.ProfileData.from_file(str(found[-1]))
  steps, runs, op_ns = [], {}, collections.Counter()
  for plane in data.planes:
    for line in plane.lines:
      for event in line.events:
        stats = dict(event.stats)
        start, end = event.start_ns, event.start_ns + event.duration_ns
        if event.name == "train" and "step_num" in stats:
          steps.append((int(stats["step_num"]), start, end))
        op = "hlo_op" in stats or line.name == "XLA Ops"
        if op and not event.name.startswith("end: "):
          op_ns[_op_kind(event.name)] += event.duration_ns
          key = (stats.get("hlo_module", plane.name), stats.get("run_id", start))
          lo, hi = runs.get(key, (start, end))
          runs[key] = (min(lo, start), max(hi, end))
  if not runs:
    raise ValueError(f"{found[-1]}: the trace holds no XLA op events")
  t0 = min([lo for lo, _ in runs.values()] + [s for _, s, _ in steps])
  ms = lambda ns: ns / 1e6  # noqa: E731
  return Trace(found[-1],
               sorted((s, ms(a - t0), ms(b - a)) for s, a, b in steps),
               sorted(((m, ms(a - t0), ms(b - a)) for (m, _), (a, b) in runs.items()),
                      key=lambda e: e[1]),
               {k: ms(v) for k, v in op_ns.most_common()})
