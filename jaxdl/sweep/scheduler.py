"""The one scheduler of a local sweep: `jaxdl train` subprocesses, J at a time, and how each ended.

A grid (`runner`) and a search (`search`) differ only in where their runs come from, a `Source`:
a queue of grid points, or an Optuna study asked for trials and told their results. This module
keeps every slot busy with the source's runs, watches them, stops them, and decides what each
exit means; the course's studies and the SLURM executor classify runs with the same `outcome`.

A run is an ordinary workdir trained by the ordinary command (`train_command`), so a crash of
one run is its exit code and log, never the sweep's, and a rerun resumes each unfinished run from
its checkpoints as `jaxdl train` always does (bit-exact). How a run ended (`outcome`):

  finished  exit 0 (its summary.json written);
  stopped   by a signal: exit 0 after its "jaxdl: stopped by" line, 130 or 128 + N, killed by
            SIGTERM or SIGINT, or any exit after the sweep signalled it: `pending`, a rerun
            resumes it; never `failed`;
  vanished  killed by another signal (SIGKILL from the OOM killer): started once more at once
            (`jaxdl train` resumes it); vanished twice, it stays `pending` with the signal as its
            error, and `jaxdl sweep` exits 1 naming it;
  failed    exit 1 (a failed run) or 2 (bad input): the same again would fail the same way.

Signals: each run is started in a session of its own (`start_new_session`), so a signal to the
sweep's process group (Ctrl-C in a terminal, systemd's stop, `kill -TERM -PGID`) reaches the
sweep only, and the sweep stops each run once, with the signal it got; a second signal landing
while a run saves its stop step would cut the save short. A SIGKILLed sweep cannot forward
anything: each run asked the kernel for SIGTERM when the sweep dies (`slots.enter_slot`, run by
`jaxdl.cli.main` before jax loads), so it saves its step and exits, never orphaned.
"""

from __future__ import annotations

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
from typing import Callable, Protocol

from jaxdl import stop_signals
from jaxdl.stop_signals import Preemption
from jaxdl.sweep import index as jindex
from jaxdl.sweep.slots import Slot, child_env
from jaxdl.train import workdir as jworkdir

POLL_S = 0.05
HEADER = "# jaxdl sweep: "  # starts the lines the sweep writes into a run's log
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def train_command(plan, record: dict, workdir: pathlib.Path) -> list[str]:
  """The run's `jaxdl train` command line: the experiment, its workdir, the shared overrides,
  then the run's own (what a user types to train the run alone)."""
  sets = [a for o in (*plan.shared, *record["overrides"]) for a in ("--set", o)]
  return [sys.executable, "-m", "jaxdl", "train", plan.experiment, "--workdir", str(workdir),
          "--no-progress", *sets]


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


@contextlib.contextmanager
def invocation(sweep_dir: pathlib.Path, subdirs=("logs", "runs")):
  """One invocation's hold on the sweep directory: made (with `subdirs`), locked, and stop
  signals turned into a flag the invocation polls; yields that `Preemption`."""
  for sub in subdirs:
    (sweep_dir / sub).mkdir(parents=True, exist_ok=True)
  with sweep_lock(sweep_dir), Preemption() as preempt, preempt.polled():
    stop_signals.reached("locked")
    yield preempt


def last_error(log_path: pathlib.Path) -> str | None:
  """The last attempt's error as one line: its last `jaxdl:` line (the CLI's), else its last
  line."""
  try:
    with open(log_path, "rb") as f:
      f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
      lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
  except OSError:
    return None
  headers = [i for i, ln in enumerate(lines) if ln.startswith(HEADER)]
  lines = lines[headers[-1] + 1:] if headers else lines  # this attempt's lines only
  said = [ln for ln in lines if ln.startswith("jaxdl:")]
  return ((said or lines or [None])[-1] or "")[:300] or None


def _signal_name(number: int) -> str:
  try:
    return signal.Signals(number).name
  except ValueError:
    return f"signal {number}"


def vanished(returncode: int | None, signalled: str | None = None) -> str | None:
  """The signal that killed a run no one here stopped (SIGKILL: the OOM killer), else None."""
  if returncode is None or returncode >= 0 or signalled or -returncode in STOP_SIGNALS:
    return None
  return _signal_name(-returncode)


def outcome(sweep_dir: pathlib.Path, record: dict, returncode: int,
            signalled: str | None = None) -> tuple[str, str | None]:
  """(status, error) of a run that exited with `returncode` (negative: killed by that signal)
  after the sweep sent it `signalled` (None: nothing). A run stopped by a signal, or gone, is
  `pending` (a rerun resumes it); only an exit the run chose, 1 or 2, is `failed`."""
  error = last_error(sweep_dir / record["log"])
  gone = vanished(returncode, signalled)
  if gone:
    return jindex.PENDING, f"vanished (killed by {gone}); a rerun resumes it"
  said_stop = (error or "").startswith("jaxdl: stopped by")
  if returncode == 0 and not said_stop:
    return jindex.FINISHED, None
  by_signal = returncode < 0 or returncode == 130 or returncode - 128 in STOP_SIGNALS
  if said_stop or by_signal or signalled:
    how = (error or "").removeprefix("jaxdl: ") if said_stop else (
        _signal_name(-returncode) if returncode < 0 else
        _signal_name(returncode - 128) if returncode > 128 else signalled or "a signal")
    return jindex.PENDING, f"stopped ({how}); a rerun resumes it"
  return jindex.FAILED, error or f"exit code {returncode}"


@dataclasses.dataclass
class Active:
  """A run this sweep started: its process, its log, its slot, the signal it was sent."""
  name: str
  proc: subprocess.Popen
  log: object
  started: float
  signalled: str | None = None

  def stop(self, signal_name: str) -> None:
    """Sends the run `signal_name` once (a second would cut its stop-step save short)."""
    if self.signalled is None and self.proc.poll() is None:
      self.signalled = signal_name
      with contextlib.suppress(ProcessLookupError):
        self.proc.send_signal(getattr(signal, signal_name))


class Source(Protocol):
  """Where a sweep's runs come from (a grid's queue, a search's study)."""

  def take(self) -> str | None:
    """The name of a run to start now (its record in the index), or None: none ready now."""

  def done(self) -> bool:
    """Whether no run will come any more (one waiting for its workdir still will)."""

  def started(self, run: Active) -> None:
    """`run` started (echo it)."""

  def watch(self, run: Active) -> bool:
    """Reads a running run's progress; True stops it (a search's pruner)."""

  def retry(self, name: str) -> None:
    """Queues `name` again (it vanished)."""

  def ended(self, run: Active, status: str, error: str | None) -> None:
    """`run` exited: `status` and `error` by `outcome` (record them, echo)."""


def start(sweep_dir: pathlib.Path, plan, index: dict, name: str, slot: Slot) -> Active:
  """Starts run `name` of `index` in `slot`, in a session of its own; its record says running,
  its log gets a header line with the command."""
  record = index["runs"][name]
  record.update(status=jindex.RUNNING, attempts=record["attempts"] + 1, returncode=None,
                error=None, git=index["provenance"]["git"], slot=slot.describe())
  jindex.write(sweep_dir, index)
  cmd = train_command(plan, record, sweep_dir / record["workdir"])
  log = open(sweep_dir / record["log"], "a")  # noqa: SIM115 -- closed by `execute`
  log.write(f"{HEADER}{datetime.datetime.now().isoformat(timespec='seconds')} attempt "
            f"{record['attempts']}: {shlex.join(cmd)}\n")
  log.flush()
  proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                          stderr=subprocess.STDOUT, env=child_env(slot), start_new_session=True)
  return Active(name, proc, log, time.monotonic())


class InProcess:
  """A run trained in this process, standing where a subprocess stands (`Active.proc`): `train()`
  runs to its end when the scheduler starts it, and its exit code is the one `jaxdl train` would
  give (0; 1 for a `RunError`, `error` its message; 128 + N when a signal stopped it, `preempt`
  then told so the scheduler starts nothing more). For the course's studies, which train their
  variants one after another inside the study's own run."""

  def __init__(self, train: Callable[[], dict], preempt: Preemption, failures=None):
    from jaxdl.stop_signals import Stopped
    from jaxdl.train import RunError
    failures = failures or RunError  # what a failed run raises; anything else propagates
    self.pid, self.error, self.summary = os.getpid(), None, None
    try:
      self.summary = train()
      stopped = "SIGTERM" if self.summary.get("preempted") else None
    except failures as e:
      self.returncode, self.error, stopped = 1, str(e).splitlines()[0], None
    except Stopped as e:
      stopped = e.signal_name
    if stopped:
      self.returncode = 128 + getattr(signal, stopped)
      preempt.requested = preempt.requested or stopped
    elif self.error is None:
      self.returncode = 0

  def poll(self) -> int:
    return self.returncode

  def wait(self) -> int:
    return self.returncode

  def send_signal(self, sig) -> None:
    del sig  # it has ended


def execute(sweep_dir: pathlib.Path, plan, index: dict, source: Source, slots: list,
            preempt: Preemption, echo: Callable[[str], None],
            launch: Callable[[list], list[Active]] | None = None, *, adopted=(),
            leave: bool = False, once: bool = False, poll_s: float = POLL_S) -> str:
  """Keeps every slot busy with `source`'s runs until it has none left; on a stop signal to the
  sweep, stops each run once with it and waits for them. Returns 'done', the signal's name, or
  'submitted' (`once`).

  Args:
    launch: starts runs, [(name, slot)] -> [Active], all of one round at once (SLURM submits
      them as one job array); default `start` each, a `jaxdl train` subprocess in its slot.
    adopted: runs an earlier invocation started and this one watches (they hold the first
      slots).
    leave: on a stop signal, or after `once`, the runs are left running as they are (SLURM's jobs
      go on; a rerun watches them again) instead of being stopped and waited for.
    once: one round of starts, then return.
  """
  launch = launch or (lambda pairs: [start(sweep_dir, plan, index, n, s) for n, s in pairs])
  active: dict[int, Active] = dict(enumerate(adopted))
  retried: set[str] = set()
  left = False
  try:
    while True:
      if preempt.requested:
        if leave:
          left = True
          return preempt.requested
        # Each run is stopped by SIGTERM, the preemption every `jaxdl` command handles from its
        # first instruction, whichever signal stopped the sweep (which still exits by its own):
        # a run met while its interpreter starts dies of SIGTERM silently, where Python's
        # default SIGINT handler would print a KeyboardInterrupt traceback into its log.
        for a in active.values():
          a.stop("SIGTERM")
      else:
        pairs = []
        for i, slot in enumerate(slots):
          if i not in active:
            name = source.take()
            if name is None:
              break
            pairs.append((i, name, slot))
        if pairs:
          for (i, _, _), a in zip(pairs, launch([(name, slot) for _, name, slot in pairs])):
            active[i] = a
            source.started(a)
          stop_signals.reached("launched")
        if once:
          left = True
          return "submitted"
      for i, a in list(active.items()):
        if a.proc.poll() is None:
          if a.signalled is None and source.watch(a):
            a.stop("SIGTERM")
          continue
        del active[i]
        _end(sweep_dir, index, source, a, retried, echo, retry=not preempt.requested)
      if not active and (preempt.requested or source.done()):
        break
      time.sleep(poll_s)
  finally:
    if not left:  # an exception here: stop the runs, keep what they saved
      for a in active.values():
        a.stop("SIGTERM")
      for a in active.values():
        a.proc.wait()
        _end(sweep_dir, index, source, a, retried, echo, retry=False)
  return preempt.requested or "done"


def conclude(sweep_dir: pathlib.Path, index: dict, a: Active) -> tuple[str, str | None]:
  """(status, error) of run `a`, which has exited; its record gets the exit code and the time
  it took."""
  if a.log is not None:
    a.log.close()
  record = index["runs"][a.name]
  returncode = a.proc.returncode
  record.update(returncode=returncode,
                seconds=round(record["seconds"] + time.monotonic() - a.started, 2))
  status, error = outcome(sweep_dir, record, returncode, a.signalled)
  return status, getattr(a.proc, "error", None) or error  # its own message where it has one


def _end(sweep_dir, index, source: Source, a: Active, retried: set, echo, retry: bool) -> None:
  """Records how `a` ended; a run that vanished the first time is queued again."""
  status, error = conclude(sweep_dir, index, a)
  gone = vanished(a.proc.returncode, a.signalled)
  if gone and retry and a.name not in retried:
    retried.add(a.name)
    index["runs"][a.name].update(status=jindex.PENDING, error=error)
    jindex.write(sweep_dir, index)
    echo(f"  retry    {a.name}: vanished (killed by {gone}); starting it again")
    source.retry(a.name)
    return
  source.ended(a, status, error)


def unfinished(index: dict, names) -> list[str]:
  """The runs among `names` left neither finished, failed nor pruned (stopped, vanished)."""
  ended = (jindex.FINISHED, jindex.FAILED, jindex.PRUNED)
  return [n for n in names if index["runs"][n]["status"] not in ended]
