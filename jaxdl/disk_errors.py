"""Full-disk and permission errors: recognized however a library wraps them, reported in one line.

A full disk fails a run from several places at once: orbax's save threads (as tensorstore
`ValueError`s carrying `[os_error_code='28']`, logged several times each), the metrics and event
writers, and the exit hooks that retry them. `disk_failure` finds the error under any wrapping,
`DiskErrorFilter` and `QuietClosedLoop` keep the libraries' copies off stderr, and
`silence_stderr` stops what is left once the `jaxdl` program has reported it.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys

# What a full disk or a permission problem is called, by errno.
_DISK_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
                errno.EROFS: "read-only file system"}
# tensorstore (orbax's array writer) reports an OS error inside a ValueError's message, e.g.
# 'Failed writing: "/w/checkpoints/5.orbax-checkpoint-tmp/...": ... [os_error_code='28']'.
_TS_OS_ERROR = re.compile(r"\[os_error_code='(\d+)'\]")
_TS_PATH = re.compile(r'"(/[^"]+)"')


def disk_failure(e: BaseException, workdir: str | None = None) -> str | None:
  """'<what happened>: <path>' when `e` (or an exception it wraps) is a full disk or a
  permission error, else None. An error that names no file (a write of an already open file)
  is placed in `workdir`."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    failure = own_disk_failure(e, workdir)
    if failure is not None:
      return failure
    e = e.__cause__ or e.__context__
  return None


def own_disk_failure(e: BaseException, workdir: str | None = None) -> str | None:
  """`disk_failure` of `e` itself, not of what it wraps: None for an error raised about one
  (a `jaxdl.train.DiskFailure`, a ValueError naming the flag), whose message says it already."""
  if isinstance(e, OSError) and e.errno in _DISK_ERRNOS:
    where = e.filename if e.filename is not None else (
        f"a file in {workdir}" if workdir else "a file of the run")
    return f"{_DISK_ERRNOS[e.errno]}: {where}"
  code = _TS_OS_ERROR.search(str(e))
  if code and int(code.group(1)) in _DISK_ERRNOS:
    paths = _TS_PATH.findall(str(e))
    return f"{_DISK_ERRNOS[int(code.group(1))]}: {paths[-1] if paths else '(a checkpoint)'}"
  return None


def unwritable_dir(path: str, flag: str) -> str | None:
  """Why directory `path` (given as `flag`) cannot be written, as one line naming it, or None;
  creates nothing, so a command can refuse before its work starts.

  Refused: a path that is (or lies under) a file, a name longer than the file system allows,
  and a folder that cannot be written (no write permission, or no write bits at all, which even
  root is refused so a folder made read-only on purpose stays untouched).
  """
  full = os.path.abspath(path)
  existing = full
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    return f"{flag} {path}: {existing} is a file, not a directory"
  try:
    name_max = os.pathconf(existing, "PC_NAME_MAX")
  except (OSError, ValueError):
    name_max = 255
  for part in full[len(existing):].split(os.sep):
    if len(os.fsencode(part)) > name_max:
      return (f"{flag} {path}: the name is too long for the file system "
              f"({len(os.fsencode(part))} > {name_max} bytes per name)")
  if not os.stat(existing).st_mode & 0o222:
    return f"{flag} {path}: {existing} is read-only (no write bits)"
  if not os.access(existing, os.W_OK | os.X_OK):
    return f"{flag} {path}: {existing} is not writable by this user (permission denied)"
  return None


def unwritable_file(path: str, flag: str) -> str | None:
  """Why file `path` (given as `flag`, e.g. --json) cannot be written, as one line, or None:
  its folder must exist and be writable, and the path must not be a folder itself."""
  parent = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path):
    return f"{flag} {path}: is a directory, expected a file path"
  if not os.path.isdir(parent):
    what = "is a file" if os.path.exists(parent) else "does not exist"
    return f"{flag} {path}: its folder {parent} {what}; expected an existing folder"
  if os.path.exists(path) and not os.access(path, os.W_OK):
    return f"{flag} {path}: the file is read-only"
  if not _writable(parent):
    return f"{flag} {path}: its folder {parent} is read-only"
  return None


def _writable(directory: str) -> bool:
  """Write permission on `directory`, and at least one write bit (root passes any mode check)."""
  return os.access(directory, os.W_OK | os.X_OK) and bool(os.stat(directory).st_mode & 0o222)


def silence_stderr() -> None:
  """Points this process's stderr at /dev/null once a full disk or a permission error has been
  reported. What is left to run is library threads and exit hooks (orbax's save threads,
  tensorboardX's event writer) retrying writes to the same full disk, each failure a traceback
  whose timing depends on the machine's load; the one line already said what happened. Only
  for the `jaxdl` program: an in-process `main` call keeps its caller's stderr."""
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, sys.stderr.fileno())
  os.close(devnull)


class DiskErrorFilter(logging.Filter):
  """Drops log records (with their tracebacks) about a full disk or a permission error: orbax's
  save threads log each one several times, and the CLI reports it once, in one line."""

  def filter(self, record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    return not (disk_failure(exc) if exc is not None else None) and not (
        disk_failure(RuntimeError(record.getMessage())))


class QuietClosedLoop:
  """An unraisable-exception hook that drops "Event loop is closed" from orbax's save threads.

  When a checkpoint write fails (a full disk), orbax closes its asyncio loop while tensorstore
  still completes the other pending writes; each completion's callback then raises from a C++
  thread, which reaches this hook as a bare traceback (a dozen or more per failure, measured on a
  300 KiB tmpfs). The failure itself is reported once, in one line; anything else goes on to the
  previous hook.
  """

  def __init__(self, previous):
    self.previous = previous

  def __call__(self, unraisable) -> None:
    exc = unraisable.exc_value
    if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
      return
    self.previous(unraisable)
