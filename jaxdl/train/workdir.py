"""A workdir's ownership and housekeeping: the lock, moving an old run aside, the stored summary.

The lock is `workdir/.lock`, a JSON record {host, pid, started} created with O_CREAT|O_EXCL, so of
two runs starting at once exactly one gets it; it is taken before the run writes anything to the
workdir and removed when the run ends, also on an exception. A second run finds it and stops with
one line naming the holder (`host:pid since HH:MM`). A lock whose process is gone (same host, pid
not alive) is stale: it is taken over, said in one line. A lock from another host cannot be
checked from here and is always honoured. In a multi-host run only process 0 takes it.

`move_aside` puts a run's artifacts into `workdir/previous-<YYYYmmdd-HHMMSS>/` (what `--force`
with an incompatible config does instead of mixing two runs); `summary.json` is the final summary
of a completed run, returned when the same run is started again.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import math
import os
import pathlib
import socket
import time

import jax

from jaxdl.data.staging import alive
from jaxdl.train import checkpoint as jckpt

log = logging.getLogger("jaxdl")

LOCK = ".lock"
SUMMARY = "summary.json"
# What one run leaves in its workdir (moved together by `move_aside`).
ARTIFACTS = ("config.json", "checkpoints", "metrics.jsonl", "tensorboard", "loss.png", SUMMARY,
             "corrupt_checkpoints")
# A lock file still empty after this long was left by a process killed while creating it.
_EMPTY_LOCK_GRACE_S = 30.0


class WorkdirError(ValueError):
  """The workdir cannot be used (a ValueError, so the CLI exits 2 with its one line)."""


class WorkdirLockedError(WorkdirError):
  """Another live run holds the workdir's lock."""


def _holder(path: pathlib.Path) -> dict | None:
  """The lock's record; {} for a lock being written right now; None if there is no lock."""
  try:
    text = path.read_text()
    age = time.time() - path.stat().st_mtime
  except OSError:  # no lock (or no such directory: `_acquire` says what is wrong with it)
    return None
  try:
    return json.loads(text)
  except ValueError:  # created but not yet written (or torn by a kill while writing)
    return {} if age < _EMPTY_LOCK_GRACE_S else {"host": socket.gethostname(), "pid": -1}


def _stale(holder: dict) -> bool:
  return bool(holder) and holder.get("host") == socket.gethostname() and not alive(
      int(holder.get("pid", -1)))


def _describe(holder: dict) -> str:
  if not holder:
    return "a run that is starting now"
  started = holder.get("started", "")
  since = started[11:16] if len(started) >= 16 else "?"
  return f"{holder.get('host', '?')}:{holder.get('pid', '?')} since {since}"


def _locked_error(workdir: pathlib.Path, holder: dict,
                  flag: str = "--workdir") -> WorkdirLockedError:
  what = "workdir" if flag == "--workdir" else flag
  return WorkdirLockedError(
      f"{what} {workdir} is in use by {_describe(holder)} ({workdir / LOCK}); wait for that "
      f"run to finish or stop it, or use another {flag} (if it runs on another host and is "
      f"gone, delete the lock file)")


def check_unlocked(workdir) -> None:
  """Raises WorkdirLockedError if a live run holds `workdir` (reads only; stale locks pass)."""
  workdir = pathlib.Path(workdir)
  holder = _holder(workdir / LOCK)
  if holder is not None and not _stale(holder):
    raise _locked_error(workdir, holder)


def _create(path: pathlib.Path) -> bool:
  """Creates the lock with this process's record; False if a lock file already exists."""
  try:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
  except FileExistsError:
    return False
  record = {"host": socket.gethostname(), "pid": os.getpid(),
            "started": datetime.datetime.now().isoformat(timespec="seconds")}
  with os.fdopen(fd, "w") as f:
    f.write(json.dumps(record))
  return True


def _take_over(workdir: pathlib.Path, holder: dict, flag: str) -> None:
  """Removes a stale lock, making sure it is the one inspected and not a newer run's."""
  path = workdir / LOCK
  aside = workdir / f"{LOCK}.stale-{os.getpid()}"
  try:
    path.rename(aside)  # atomic: of two runs taking over, one renames the stale lock
  except FileNotFoundError:
    return
  if _holder(aside) != holder:  # a live run created its lock in between: give it back
    aside.rename(path)
    raise _locked_error(workdir, _holder(path) or {}, flag)
  aside.unlink()
  log.warning("%s %s: took over the stale lock of %s (that process is gone)",
              "workdir" if flag == "--workdir" else flag, workdir, _describe(holder))


def _acquire(workdir: pathlib.Path, flag: str) -> bool:
  """Takes the lock; returns whether this call created the workdir directory."""
  created = not workdir.exists()
  try:
    workdir.mkdir(parents=True, exist_ok=True)
    for _ in range(3):
      if _create(workdir / LOCK):
        return created
      holder = _holder(workdir / LOCK)
      if holder is None:
        continue  # released in between: try again
      if not _stale(holder):
        raise _locked_error(workdir, holder, flag)
      _take_over(workdir, holder, flag)
  except OSError as e:  # a file where the workdir should be, no permission, a name too long
    raise WorkdirError(f"{'workdir' if flag == '--workdir' else flag} {workdir}: cannot "
                       f"create its lock file ({e.strerror or type(e).__name__})") from None
  raise _locked_error(workdir, _holder(workdir / LOCK) or {}, flag)


def read_config(workdir) -> dict | None:
  """The workdir's config.json, or None if it has none."""
  path = pathlib.Path(workdir) / "config.json"
  return json.loads(path.read_text()) if path.exists() else None


@contextlib.contextmanager
def lock(workdir, expect_config: dict | None = None, flag: str = "--workdir"):
  """Holds `workdir`'s lock for the block (process 0 only); released on any exit.

  `flag` is the option that named the directory, for the messages (`jaxdl data` locks its
  `--out` folder the same way, so two runs writing one output cannot interleave).

  `expect_config` is the workdir's config.json as read (unlocked) before: if another run changed
  it in between, the run stops rather than act on a stale reading. A workdir this call had to
  create is removed again if the block leaves it empty (a run refused before writing anything
  leaves no trace).
  """
  workdir = pathlib.Path(workdir)
  if jax.process_index() != 0:
    yield
    return
  created = _acquire(workdir, flag)
  try:
    if read_config(workdir) != expect_config:
      raise WorkdirError(f"workdir {workdir}: another run wrote it while this one was starting; "
                         f"run again")
    yield
  finally:
    with contextlib.suppress(FileNotFoundError):
      (workdir / LOCK).unlink()
    if created:
      with contextlib.suppress(OSError):
        workdir.rmdir()  # only succeeds when empty


def move_aside(workdir) -> None:
  """Moves the run held in `workdir` to `workdir/previous-<time>/`; returns None (no run left).

  Every process calls it; process 0 moves, the others wait for it (they read the same files).
  """
  workdir = pathlib.Path(workdir)
  present = [name for name in ARTIFACTS if (workdir / name).exists()]
  if present and jax.process_index() == 0:
    _move(workdir, present)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("jaxdl.workdir.move_aside")


def _move(workdir: pathlib.Path, present: list[str]) -> None:
  dest = workdir / f"previous-{datetime.datetime.now():%Y%m%d-%H%M%S}"
  n = 1
  while dest.exists():  # two moves within a second
    dest, n = dest.with_name(f"{dest.name.split('.')[0]}.{n}"), n + 1
  dest.mkdir()
  for name in present:
    (workdir / name).rename(dest / name)
  log.warning("workdir %s held a run of a different config: moved it to %s (--force); "
              "starting fresh", workdir, dest)


def write_summary(workdir, summary: dict) -> None:
  """Stores a completed run's summary (written whole, then renamed: never a torn file)."""
  path = pathlib.Path(workdir) / SUMMARY
  tmp = path.with_name(SUMMARY + ".tmp")
  tmp.write_text(json.dumps(_finite_or_null(summary), indent=2, allow_nan=False))
  tmp.replace(path)


def _finite_or_null(x):
  """JSON has no NaN or Infinity: non-finite numbers are stored as null (as in metrics.jsonl)."""
  if isinstance(x, dict):
    return {k: _finite_or_null(v) for k, v in x.items()}
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x


def read_summary(workdir) -> dict | None:
  """The stored summary of a completed run, or None (none stored, or unreadable)."""
  try:
    return json.loads((pathlib.Path(workdir) / SUMMARY).read_text())
  except (OSError, ValueError):
    return None


def completed_summary(workdir, steps: int) -> dict | None:
  """The stored summary when `workdir`'s run is complete, else None.

  Complete: the latest checkpoint is at `steps` or beyond and matches its checksums, and the
  stored summary is of that step; said in one line. A latest checkpoint at `steps` without a
  verified summary (a run killed before writing it, or of an older jaxdl) is said too, and left
  to the loop, which restores it and recomputes the summary (evaluating that checkpoint).
  """
  workdir = pathlib.Path(workdir)
  ckpts = workdir / "checkpoints"
  saved = jckpt.saved_steps(ckpts)
  if not saved or max(saved) < steps:
    return None
  latest, summary = max(saved), read_summary(workdir)
  problem = jckpt.verify_checksums(ckpts / str(latest))
  if problem is None and summary is not None and summary.get("step") == latest:
    log.info("workdir %s: already complete at step %d (train.steps=%d); returning its stored "
             "summary (%s)", workdir, latest, steps, workdir / SUMMARY)
    return summary
  if problem in (None, "unverified"):
    log.info("workdir %s: already complete at step %d (train.steps=%d), without a verified "
             "stored summary; restoring it to recompute the summary", workdir, latest, steps)
  return None
