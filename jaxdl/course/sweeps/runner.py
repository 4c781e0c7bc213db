"""Running a sweep on this machine: each run a `python -m jaxdl train` subprocess, J at a time.

A run is an ordinary workdir trained by the ordinary command, so a crash of one run is its exit
code and log, never the sweep's, and a rerun of the sweep resumes each unfinished run from its
checkpoints as `jaxdl train` always does (bit-exact). On a rerun:

  finished  (summary.json in its workdir, or a recorded exit 0) skipped;
  failed    (exit 1, a failed run, or 2, bad input: the same again would fail the same way)
            skipped unless `retry_failed`;
  otherwise (never started, stopped by a signal, killed) started; `jaxdl train` resumes it.
A workdir whose lock a live process holds (a run left over from a killed sweep, finishing its
last step) is waited for, running the others meanwhile.

Devices: J slots (`jaxdl.course.sweeps.slots`), each with its share of this process's CPUs and,
where GPUs are visible, one GPU. On Linux a run gets SIGTERM when the sweep dies, so even a
SIGKILLed sweep stops its runs cleanly, each saving its current step; each run applies its slot
itself at startup, so the sweep starts it by a plain fork-exec (why, in `slots`). SIGTERM or
SIGINT to the sweep stops it the same way (`jaxdl.stop_signals.Preemption`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import shlex
import signal
import socket
import subprocess
import sys
import time
from typing import Callable

from jaxdl.course.sweeps import index as jindex
from jaxdl.course.sweeps.grid import Plan
from jaxdl.course.sweeps.slots import Slot, child_env, make_slots
from jaxdl.stop_signals import Preemption
from jaxdl.train import workdir as jworkdir

_POLL_S = 0.05
_HEADER = "# jaxdl sweep: "  # starts the lines the sweep writes into a run's log


def train_command(plan: Plan, record: dict, workdir: pathlib.Path) -> list[str]:
  sets = [a for o in (*plan.shared, *record["overrides"]) for a in ("--set", o)]
  return [sys.executable, "-m", "jaxdl", "train", plan.experiment, "--workdir", str(workdir),
          "--no-progress", *sets]


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


def lock_holder(workdir: pathlib.Path) -> str | None:
  """Who holds `workdir`'s lock (one line), or None when no live process does."""
  try:
    jworkdir.check_unlocked(workdir)
  except jworkdir.WorkdirLockedError as e:
    return str(e).split(" (", 1)[0]
  return None


@contextlib.contextmanager
def sweep_lock(sweep_dir: pathlib.Path):
  """The sweep directory's lock, in the workdir lock's format (so `check_unlocked` reads it):
  two sweeps never drive one directory. Taken without jax, which would claim a GPU here."""
  path = sweep_dir / jworkdir.LOCK
  for _ in range(3):
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      break
    except FileExistsError:
      holder = lock_holder(sweep_dir)
      if holder:
        raise jworkdir.WorkdirLockedError(f"--out {sweep_dir}: {holder.split(' is ', 1)[1]}; "
                                          f"another sweep runs there") from None
      with contextlib.suppress(FileNotFoundError):
        path.unlink()  # stale: the sweep that took it is gone
  else:
    raise jworkdir.WorkdirLockedError(f"--out {sweep_dir}: cannot take its lock {path}")
  with os.fdopen(fd, "w") as f:
    f.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                        "started": datetime.datetime.now().isoformat(timespec="seconds")}))
  try:
    yield
  finally:
    with contextlib.suppress(FileNotFoundError):
      path.unlink()


@dataclasses.dataclass
class _Active:
  name: str
  proc: subprocess.Popen
  log: object
  started: float


def last_error(log_path: pathlib.Path) -> str | None:
  """The last attempt's error as one line: its last `jaxdl:` line (the CLI's), else its last
  line."""
  try:
    with open(log_path, "rb") as f:
      f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
      lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
  except OSError:
    return None
  headers = [i for i, ln in enumerate(lines) if ln.startswith(_HEADER)]
  lines = lines[headers[-1] + 1:] if headers else lines  # this attempt's lines only
  said = [ln for ln in lines if ln.startswith("jaxdl:")]
  return ((said or lines or [None])[-1] or "")[:300] or None


def outcome(sweep_dir: pathlib.Path, record: dict, returncode: int) -> tuple[str, str | None]:
  """(status, error) of a run that exited with `returncode`."""
  log = sweep_dir / record["log"]
  error = last_error(log)
  stopped = returncode < 0 or returncode == 130 or (error or "").startswith("jaxdl: stopped by")
  if stopped:
    how = (signal.Signals(-returncode).name if returncode < 0 else
           (error or "a signal")).removeprefix("jaxdl: ")
    return jindex.PENDING, f"stopped ({how}); a rerun resumes it"
  if returncode == 0:
    return jindex.FINISHED, None
  return jindex.FAILED, error or f"exit code {returncode}"


def run(sweep_dir, plan: Plan, jobs: int = 1, retry_failed: bool = False,
        echo: Callable[[str], None] = print, slots: list[Slot] | None = None) -> tuple[dict, str]:
  """Runs `plan`'s unfinished runs in `sweep_dir`; returns (the index, how it ended: 'done' or
  the name of the signal that stopped it)."""
  sweep_dir = pathlib.Path(sweep_dir)
  sweep_dir.mkdir(parents=True, exist_ok=True)
  (sweep_dir / "logs").mkdir(exist_ok=True)
  (sweep_dir / "runs").mkdir(exist_ok=True)
  with sweep_lock(sweep_dir), Preemption() as preempt, preempt.polled():
    index = jindex.merge(jindex.read(sweep_dir), plan)
    todo, finished, skipped = classify(sweep_dir, plan, index, retry_failed)
    jindex.write(sweep_dir, index)
    echo(f"jaxdl sweep: {sweep_dir}: {len(plan.runs)} runs: {finished} finished, {skipped} "
         f"failed before{' (--retry-failed reruns them)' if skipped else ''}, {len(todo)} to "
         f"run, {jobs} at a time")
    slots = slots or make_slots(jobs)
    ended = _execute(sweep_dir, plan, index, collections.deque(todo), slots, preempt, echo)
    return index, ended


def _execute(sweep_dir, plan, index, queue, slots, preempt, echo) -> str:
  """Keeps every slot busy until the queue is empty; on a stop signal, stops the runs."""
  active: dict[int, _Active] = {}
  told_waiting: set[str] = set()
  forwarded = False
  try:
    while queue or active:
      if preempt.requested:
        if not forwarded:
          _forward(preempt.requested, active)
          forwarded = True
        if not active:
          break
      else:
        for i, slot in enumerate(slots):
          if i not in active and queue:
            name = _next_ready(sweep_dir, index, queue, told_waiting, echo)
            if name is None:
              break
            active[i] = _start(sweep_dir, plan, index, name, slot)
            echo(f"  start    {name}")
      for i, a in list(active.items()):
        if a.proc.poll() is not None:
          _finish(sweep_dir, index, a, echo)
          del active[i]
      time.sleep(_POLL_S)
  finally:
    for a in active.values():  # an exception here: stop the runs, keep what they saved
      with contextlib.suppress(ProcessLookupError):
        a.proc.send_signal(signal.SIGTERM)
    for a in active.values():
      a.proc.wait()
      _finish(sweep_dir, index, a, echo)
  return preempt.requested or "done"


def _forward(signal_name: str, active: dict) -> None:
  """Stops the runs with the sweep's signal; not when the terminal sent them a Ctrl-C already
  (they share its foreground process group), as a second signal would skip their last save."""
  sig = getattr(signal, signal_name)
  with contextlib.suppress(OSError):
    if sig == signal.SIGINT and os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp():
      return
  for a in active.values():
    with contextlib.suppress(ProcessLookupError):
      a.proc.send_signal(sig)


def _next_ready(sweep_dir, index, queue, told_waiting, echo) -> str | None:
  """The first queued run whose workdir no live process holds (taken off the queue), or None."""
  for _ in range(len(queue)):
    name = queue.popleft()
    holder = lock_holder(sweep_dir / index["runs"][name]["workdir"])
    if holder is None:
      return name
    if name not in told_waiting:
      told_waiting.add(name)
      echo(f"  waiting  {name}: {holder}")
    queue.append(name)
  return None


def _start(sweep_dir, plan, index, name, slot) -> _Active:
  record = index["runs"][name]
  record.update(status=jindex.RUNNING, attempts=record["attempts"] + 1, returncode=None,
                error=None, git=index["provenance"]["git"])
  jindex.write(sweep_dir, index)
  cmd = train_command(plan, record, sweep_dir / record["workdir"])
  log = open(sweep_dir / record["log"], "a")  # noqa: SIM115 -- closed by _finish
  log.write(f"{_HEADER}{datetime.datetime.now().isoformat(timespec='seconds')} attempt "
            f"{record['attempts']}: {shlex.join(cmd)}\n")
  log.flush()
  proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                          env=child_env(slot))
  return _Active(name, proc, log, time.monotonic())


def _finish(sweep_dir, index, a: _Active, echo) -> None:
  a.log.close()
  record = index["runs"][a.name]
  status, error = outcome(sweep_dir, record, a.proc.returncode)
  record.update(status=status, returncode=a.proc.returncode, error=error,
                seconds=round(record["seconds"] + time.monotonic() - a.started, 2))
  jindex.write(sweep_dir, index)
  echo(f"  {status:<8} {a.name}" + (f": {error}" if error else ""))
