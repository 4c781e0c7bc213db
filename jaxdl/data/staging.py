"""Prepared folders are written whole: built aside, moved into place, never left half-written.

Two ways a prepared folder is written, both through here:

  `staged(out_dir)`        `jaxdl data prepare | tokenizer` write into OUT, a folder the user
                           names, which may already hold what the command reads (OUT's
                           tokenizer.json, a chat template) and files of the user's. The outputs
                           are written into a hidden stage OUT/.staging-<host>-<pid>/ and moved
                           into OUT only once every one of them is written: the old outputs go
                           first (manifest.json before the rest, so no moment shows a manifest
                           over a mix of shards), then the new ones arrive, manifest.json last.
                           On any exception the stage is removed and OUT is as it was.
  `build_once(path, fn)`   a dataset prepared once into the cache (`jaxdl.data.disk`): built into
                           the sibling <path>.tmp-<host>-<pid>, renamed into place; on any
                           exception the sibling is removed; a concurrent build that finished
                           first wins (its data is the same).

A process killed while building (SIGKILL, the OOM killer) cannot clean up after itself; the next
build on the same host removes every stage or sibling whose process is gone (`sweep_stale`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from typing import Callable, Iterator

from jaxdl.data import records

# The files a prepared folder's data consists of; a new build replaces all of them.
DATA_SUFFIXES = (".array_record", ".lengths.npy")


def alive(pid: int) -> bool:
  """Whether process `pid` (of this host) is running."""
  if pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, owned by someone else
    return True
  return True


def _tag() -> str:
  return f"{socket.gethostname()}-{os.getpid()}"


def sweep_stale(folder: str, prefix: str) -> None:
  """Removes the entries `<prefix><host>-<pid>` of `folder` left by dead processes of this host
  (another host's pids mean nothing here, so its entries are left alone), and `<prefix><pid>`,
  the name earlier versions gave a cached build's sibling."""
  host = socket.gethostname()
  try:
    names = os.listdir(folder)
  except OSError:
    return
  for name in names:
    rest = name[len(prefix):] if name.startswith(prefix) else ""
    pid = rest[len(host) + 1:] if rest.startswith(f"{host}-") else rest
    if pid.isdigit() and not alive(int(pid)):
      shutil.rmtree(os.path.join(folder, name), ignore_errors=True)


def _is_data(name: str) -> bool:
  return name == records.MANIFEST or name.endswith(DATA_SUFFIXES)


@contextlib.contextmanager
def staged(out_dir: str, remove: tuple[str, ...] = (), keep_data: bool = False
           ) -> Iterator[str]:
  """Yields an empty stage folder inside `out_dir` (created if needed) to write the outputs in;
  when the block ends normally they replace `out_dir`'s (module docstring): the files of the
  stage replace their namesakes, the old data (manifest, shards, lengths; unless `keep_data`)
  and the names in `remove` are deleted. On any exception the stage is removed, and `out_dir`
  too if this call created it."""
  created = not os.path.isdir(out_dir)
  os.makedirs(out_dir, exist_ok=True)
  sweep_stale(out_dir, ".staging-")
  stage = os.path.join(out_dir, f".staging-{_tag()}")
  os.mkdir(stage)
  try:
    yield stage
    new = sorted(os.listdir(stage), key=lambda n: n == records.MANIFEST)  # manifest last
    old = [n for n in os.listdir(out_dir) if (_is_data(n) and not keep_data) or n in remove
           or n in new]
    for name in sorted(old, key=lambda n: n != records.MANIFEST):  # manifest first
      os.remove(os.path.join(out_dir, name))
    for name in new:
      os.replace(os.path.join(stage, name), os.path.join(out_dir, name))
  finally:
    shutil.rmtree(stage, ignore_errors=True)
    if created:
      with contextlib.suppress(OSError):
        os.rmdir(out_dir)  # only when empty: the build failed before anything arrived


def build_once(path: str, build: Callable[[str], object]) -> None:
  """`build(tmp)` writes a folder's content into `tmp`, which is then renamed to `path` (module
  docstring). Stale siblings of dead builds are removed first."""
  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  sweep_stale(parent, f"{os.path.basename(path)}.tmp-")
  tmp = f"{path}.tmp-{_tag()}"
  try:
    build(tmp)
    os.rename(tmp, path)
  except OSError:
    if not os.path.isdir(path):  # not another process's finished build: a real failure
      raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
