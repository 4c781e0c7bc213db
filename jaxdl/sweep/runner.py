"""Running a grid on this machine: its unfinished runs through the scheduler, J at a time.

On a rerun each run of the plan is

  finished  (summary.json in its workdir, or a recorded exit 0) skipped;
  failed    (exit 1, a failed run, or 2, bad input: the same again would fail the same way)
            skipped unless `retry_failed`;
  otherwise (never started, stopped by a signal, vanished) started; `jaxdl train` resumes it.
A workdir whose lock a live process holds (a run left over from a killed sweep, finishing its
last step) is waited for, running the others meanwhile. How runs are started, stopped and
judged: `jaxdl.sweep.scheduler`.
"""

from __future__ import annotations

import collections
import pathlib
from typing import Callable

from jaxdl.sweep import index as jindex
from jaxdl.sweep import scheduler
from jaxdl.sweep.grid import Plan
from jaxdl.sweep.slots import Slot, make_slots
from jaxdl.train import workdir as jworkdir


def classify(sweep_dir, plan, index, retry_failed: bool, skip=()) -> tuple[list[str], int, int]:
  """(runs to start, finished count, failed-before count) of `plan`'s runs not in `skip`; marks
  each record finished or pending in `index` (a run that failed on its config, exit 1 or 2,
  stays failed unless `retry_failed`)."""
  todo, finished, skipped = [], 0, 0
  for r in plan.runs:
    record = index["runs"][r.name]
    if r.name in skip:
      continue
    if is_finished(sweep_dir, record):
      record["status"], finished = jindex.FINISHED, finished + 1
    elif (record["status"] == jindex.FAILED and record["returncode"] in (1, 2)
          and not retry_failed):
      skipped += 1
    else:
      record["status"] = jindex.PENDING
      todo.append(r.name)
  return todo, finished, skipped


def is_finished(sweep_dir: pathlib.Path, record: dict) -> bool:
  return ((sweep_dir / record["workdir"] / jworkdir.SUMMARY).exists()
          or record["status"] == jindex.FINISHED)


class GridSource:
  """A grid's runs as the scheduler takes them: a queue, a workdir still held waited for."""

  def __init__(self, sweep_dir: pathlib.Path, index: dict, todo: list[str], echo,
               announce: bool = True):
    self.dir, self.index, self.echo, self.announce = sweep_dir, index, echo, announce
    self.queue = collections.deque(todo)
    self.told_waiting: set[str] = set()

  def take(self) -> str | None:
    """The first queued run whose workdir no live process holds (taken off the queue)."""
    for _ in range(len(self.queue)):
      name = self.queue.popleft()
      holder = scheduler.lock_holder(self.dir / self.index["runs"][name]["workdir"])
      if holder is None:
        return name
      if name not in self.told_waiting:
        self.told_waiting.add(name)
        self.echo(f"  waiting  {name}: {holder}")
      self.queue.append(name)
    return None

  def done(self) -> bool:
    return not self.queue

  def started(self, run: scheduler.Active) -> None:
    if self.announce:
      self.echo(f"  start    {run.name}")

  def watch(self, run: scheduler.Active) -> bool:
    del run
    return False

  def retry(self, name: str) -> None:
    self.queue.appendleft(name)

  def ended(self, run: scheduler.Active, status: str, error: str | None) -> None:
    self.index["runs"][run.name].update(status=status, error=error)
    jindex.write(self.dir, self.index)
    self.echo(f"  {status:<8} {run.name}" + (f": {error}" if error else ""))


def run(sweep_dir, plan: Plan, jobs: int = 1, retry_failed: bool = False,
        echo: Callable[[str], None] = print, slots: list[Slot] | None = None) -> tuple[dict, str]:
  """Runs `plan`'s unfinished runs in `sweep_dir`; returns (the index, how it ended: 'done' or
  the name of the signal that stopped it)."""
  sweep_dir = pathlib.Path(sweep_dir)
  with scheduler.invocation(sweep_dir) as preempt:
    index = jindex.merge(jindex.read(sweep_dir), plan)
    todo, finished, skipped = classify(sweep_dir, plan, index, retry_failed)
    jindex.write(sweep_dir, index)
    echo(f"jaxdl sweep: {sweep_dir}: {len(plan.runs)} runs: {finished} finished, {skipped} "
         f"failed before{' (--retry-failed reruns them)' if skipped else ''}, {len(todo)} to "
         f"run, {jobs} at a time")
    source = GridSource(sweep_dir, index, todo, echo)
    ended = scheduler.execute(sweep_dir, plan, index, source, slots or make_slots(jobs),
                              preempt, echo)
    return index, ended
