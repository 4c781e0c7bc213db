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
import json
import os
import shutil
import socket
from typing import Callable, Iterator

from jaxdl.data import records
from jaxdl.data.tokenize import Tokenizer, load_bpe
from jaxdl.schema import ConfigError

# The files a prepared folder's data consists of; a new build replaces all of them.
DATA_SUFFIXES = (".array_record", ".lengths.npy")
# The tokenizer a folder's text data is read with ('bpe'), and the record of the split it was
# trained on when `jaxdl data tokenizer` made it (`jaxdl.data.prepare.check_trained_on`).
TOKENIZER = "tokenizer.json"
TRAINED_ON = "tokenizer.trained_on.json"


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
  """Removes the entries (folders or files) `<prefix><host>-<pid>` of `folder` left by dead
  processes of this host (another host's pids mean nothing here, so its entries are left alone),
  and `<prefix><pid>`, the name earlier versions gave a cached build's sibling."""
  host = socket.gethostname()
  try:
    names = os.listdir(folder)
  except OSError:
    return
  for name in names:
    rest = name[len(prefix):] if name.startswith(prefix) else ""
    pid = rest[len(host) + 1:] if rest.startswith(f"{host}-") else rest
    if pid.isdigit() and not alive(int(pid)):
      _remove(os.path.join(folder, name))


def _remove(path: str) -> None:
  """Removes a file or a folder tree, whichever `path` is; gone already is fine."""
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path, ignore_errors=True)
  else:
    with contextlib.suppress(OSError):
      os.remove(path)


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


def _short(fingerprint: str | None) -> str:
  return (fingerprint or "none")[:12]


def check_out(out_dir: str, src: str, tok: Tokenizer | None, spec: str = "") -> None:
  """One-line ConfigError when preparing `src` with `tok` (None: images) into `out_dir` would
  leave it holding two things at once: data prepared from another source or with another
  tokenizer (its manifest.json says which), or a tokenizer.json other than `tok`. Data of the
  same source and tokenizer is simply prepared again. `--force` (no check) replaces it whole."""
  hint = "; pass --force to replace it whole, or choose another --out"
  manifest = _prepared(out_dir)
  if manifest is not None:
    if manifest.get("source") != os.path.abspath(src):
      raise ConfigError(f"--out {out_dir}: holds data prepared from {manifest.get('source')!r}, "
                        f"not {os.path.abspath(src)!r}{hint}")
    was, now = _tokenizer_of(manifest), tok.fingerprint if tok is not None else None
    if was != now:
      raise ConfigError(f"--tokenizer {spec or now}: {out_dir} holds data prepared with another "
                        f"tokenizer (sha256 {_short(was)}, this one {_short(now)}){hint}")
  own = os.path.join(out_dir, TOKENIZER)
  if tok is not None and os.path.isfile(own):
    was_tok = load_bpe(own, "--out").fingerprint
    if was_tok != tok.fingerprint:
      raise ConfigError(f"--tokenizer {spec or tok.name}: {own} is another tokenizer (sha256 "
                        f"{_short(was_tok)}, this one {_short(tok.fingerprint)}); pass "
                        "--tokenizer bpe to use it, --force to replace it, or choose another "
                        "--out")


@contextlib.contextmanager
def staged_output(out_dir: str, tok: Tokenizer | None) -> Iterator[str]:
  """`staged` for data tokenized by `tok` (None: images): the stage holds the tokenizer.json the
  data is read with (out_dir's own, linked, when it is `tok`, so the manifest's checksum is of
  the file that stays), and a tokenizer.json of another tokenizer (replaced under --force)
  leaves together with its TRAINED_ON record."""
  own = os.path.join(out_dir, TOKENIZER)
  same = tok is not None and os.path.isfile(own) and (
      load_bpe(own, "--out").fingerprint == tok.fingerprint)
  stale = (TOKENIZER, TRAINED_ON) if tok is not None and not same else ()
  with staged(out_dir, remove=stale) as stage:
    if same:
      try:
        os.link(own, os.path.join(stage, TOKENIZER))
      except OSError:  # a file system without hard links
        shutil.copy2(own, os.path.join(stage, TOKENIZER))
    elif tok is not None and tok.hf is not None:
      tok.save(os.path.join(stage, TOKENIZER))  # the data carries its tokenizer
    yield stage


def _prepared(out_dir: str) -> dict | None:
  """The manifest of the data prepared in `out_dir` (as written, unchecked), None when it holds
  none; one that cannot be read is a one-line ConfigError."""
  try:
    with open(os.path.join(out_dir, records.MANIFEST)) as f:
      manifest = json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError):
    manifest = None
  if not isinstance(manifest, dict):
    raise ConfigError(f"--out {out_dir}: its {records.MANIFEST} cannot be read; pass --force to "
                      "replace the folder's data, or choose another --out")
  return manifest


def _tokenizer_of(manifest: dict) -> str | None:
  entry = manifest.get("tokenizer")
  return entry.get("sha256") if isinstance(entry, dict) else None


def check_new_tokenizer(out_dir: str, tok: Tokenizer, *, force: bool = False) -> bool:
  """Whether `out_dir` holds data prepared with `tok` and its tokenizer.json (which then stay as
  they are: `jaxdl data tokenizer` trained the same tokenizer again). Data prepared with another
  tokenizer is a one-line ConfigError (it would be left beside a tokenizer that did not make it),
  unless `force` (the data is then removed with the old tokenizer)."""
  manifest = None if force else _prepared(out_dir)
  if manifest is None:
    return False
  was = _tokenizer_of(manifest)
  if was != tok.fingerprint:
    raise ConfigError(f"--out {out_dir}: holds data prepared with another tokenizer (sha256 "
                      f"{_short(was)}, the one trained now {_short(tok.fingerprint)}); pass "
                      "--force to replace it (the data is removed), or choose another --out")
  return os.path.isfile(os.path.join(out_dir, TOKENIZER))


def temporary(path: str) -> str:
  """This process's temporary name for `path`, <path>.tmp-<host>-<pid>, once the ones of dead
  processes are removed; `path`'s folder must exist."""
  sweep_stale(os.path.dirname(os.path.abspath(path)), f"{os.path.basename(path)}.tmp-")
  return f"{path}.tmp-{_tag()}"


def build_once(path: str, build: Callable[[str], object]) -> None:
  """`build(tmp)` writes a folder's content into `tmp`, which is then renamed to `path` (module
  docstring). Stale siblings of dead builds are removed first."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = temporary(path)
  try:
    build(tmp)
    os.rename(tmp, path)
  except OSError:
    if not os.path.isdir(path):  # not another process's finished build: a real failure
      raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
