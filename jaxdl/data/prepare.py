"""Converting a user's files to prepared data (`jaxdl data prepare`, `jaxdl data tokenizer`).

Sources (SRC):
  a folder of text files   each file one document (`pattern` picks them, sorted by relative
                           path, read until `max_bytes`); must be UTF-8
  a .parquet file          each row of `column` one document
  a folder of images       root/<class>/*.png|jpg, every image of one size and mode
  a .jsonl file            instruction data: prompt/response pairs or chat messages, templated
                           with a loss mask that is zero on the prompt (`jaxdl.data.chat`)

Split: an example goes to val when crc32(its relative path, or its row number) / 2^32 < val_frac,
so the split does not depend on which other files exist (the rule the `text` source uses for
the standard library). Both splits must hold an example: a split left empty is refused in one
line naming `--val-frac` and a value that works (`split_error`). `jaxdl data tokenizer` and
`jaxdl data prepare` read SRC through the same `text_documents`, so they refuse and accept the
same inputs, and the tokenizer records the train split it saw (TRAINED_ON, beside its
tokenizer.json); `prepare_text` refuses a tokenizer trained on another split of the same SRC (its
val documents would have shaped the tokenizer) and, for OUT's own tokenizer.json, one trained
on other files. Text is tokenized (`jaxdl.data.tokenize`) into one record of token ids per
document; images become (x uint8 (H, W, C), y int32) records. The output format is in
`jaxdl.data.records`.

The output folder is whole or refused: one prepared from another source or with another
tokenizer, or holding a tokenizer.json other than the one given, is refused before SRC is read
(`jaxdl.data.staging.check_out`; `force` replaces its data whole), and the outputs are written
aside and moved in once complete (`staging.staged_output`), so a failure or a full disk leaves
it as it was. Each shard names the tokenizer fingerprint it was made with (`write_split`).
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import math
import os
import re
import zlib
from typing import Iterator

import numpy as np

from jaxdl.data import records, staging
from jaxdl.data.tokenize import Tokenizer, check_vocab_size, get_tokenizer, train_bpe
from jaxdl.schema import ConfigError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def in_val(name: str, val_frac: float) -> bool:
  return zlib.crc32(name.encode()) / 2**32 < val_frac


def split_error(names: list[str], val_frac: float, src: str, noun: str) -> str | None:
  """None when `val_frac` puts at least one of `names` in each split; else the one-line reason,
  naming --val-frac and a round value that leaves both splits non-empty."""
  if len(names) < 2:
    return (f"SRC: {src!r} holds {len(names)} {noun[:-1] if names else noun}; a train and a val "
            "split need at least 2 (one each)")
  fracs = sorted(zlib.crc32(n.encode()) / 2**32 for n in names)
  n_val = sum(f < val_frac for f in fracs)
  if 0 < n_val < len(names):
    return None
  # Any val_frac in (fracs[0], fracs[-1]] leaves both splits non-empty; suggest the roundest one
  # nearest the value given.
  lo, hi = fracs[0], fracs[-1]
  for digits in range(2, 10):
    scale = 10**digits
    v = (math.ceil(lo * scale) if n_val == 0 else math.floor(hi * scale)) / scale
    if lo < v <= hi:
      break
  else:
    v = (lo + hi) / 2
  which = "none" if n_val == 0 else "all"
  name = "its row number" if noun == "rows" else "its relative path"
  return (f"--val-frac: {val_frac} puts {which} of the {len(names)} {noun} of {src!r} in the val "
          f"split (one goes there when crc32({name}) / 2^32 < val_frac); set --val-frac "
          f"{v:g} {'or more' if n_val == 0 else 'or less'}")


def check_source(src: str) -> None:
  """One-line ValueError unless `src` exists and can be read (a folder listed, a file opened):
  an unreadable source is named as such, never mistaken for one without documents."""
  if not os.path.exists(src):
    raise ValueError(f"SRC: not found: {src!r}")
  try:
    if os.path.isdir(src):
      os.listdir(src)
    else:
      with open(src, "rb"):
        pass
  except OSError as e:
    raise ValueError(f"SRC: cannot read {src!r} ({e.strerror or type(e).__name__}); expected "
                     f"a readable folder or file") from None


def _unreadable(e: OSError):
  raise ValueError(f"SRC: cannot read {e.filename!r} ({e.strerror or type(e).__name__})")


def walk(root: str, pattern: str) -> list[str]:
  """Relative paths under `root` matching `pattern`, sorted; caches and packages skipped; a
  folder that cannot be listed is a one-line ValueError naming it."""
  out = []
  for dirpath, dirnames, filenames in os.walk(root, onerror=_unreadable):
    dirnames[:] = [d for d in dirnames if d not in ("site-packages", "dist-packages",
                                                      "__pycache__") and not d.startswith(".")]
    out += [os.path.relpath(os.path.join(dirpath, f), root) for f in filenames
            if fnmatch.fnmatch(f, pattern)]
  return sorted(out)


def text_documents(src: str, *, pattern: str = "*.txt", max_bytes: int = 0, column: str = "text",
                   val_frac: float = 0.1) -> dict[str, list[str]]:
  """{'train': [...], 'val': [...]} documents of a text folder or a Parquet file (module doc);
  `max_bytes` > 0 caps the bytes read (the last file is cut there). A split left empty is a
  one-line ValueError naming --val-frac (`split_error`), and --max-bytes when the cap cut the
  files short."""
  check_source(src)
  parquet = src.endswith(".parquet")
  if parquet:
    texts = [(str(i), t) for i, t in enumerate(read_parquet_column(src, column))]
  else:
    if not os.path.isdir(src):
      raise ValueError(f"SRC: expected a folder of text files or a .parquet file, got {src!r}")
    texts, total = [], 0
    for rel in walk(src, pattern):
      if max_bytes and total >= max_bytes:
        break
      try:
        with open(os.path.join(src, rel), "rb") as f:
          data = f.read(max_bytes - total if max_bytes else -1)
      except OSError as e:
        _unreadable(e)
      total += len(data)
      try:
        texts.append((rel, data.decode("utf-8")))
      except UnicodeDecodeError as e:
        if max_bytes and total >= max_bytes and len(data) - e.start <= 3:
          texts.append((rel, data[:e.start].decode("utf-8")))  # the cap cut a character
          continue
        raise ValueError(f"SRC: {os.path.join(src, rel)!r} is not UTF-8 text (byte "
                         f"{e.start}: {e.reason})") from e
  if not texts:
    raise ValueError(_no_documents(src, pattern, column))
  noun = "rows" if parquet else "files"
  problem = split_error([name for name, _ in texts], val_frac, src, noun)
  if problem:
    capped = not parquet and max_bytes and total >= max_bytes
    raise ValueError(problem + (f" (or raise --max-bytes {max_bytes}, which stopped the "
                                f"reading after {len(texts)} files)" if capped else ""))
  out = {"train": [], "val": []}
  for name, text in texts:
    out["val" if in_val(name, val_frac) else "train"].append(text)
  return out


def _no_documents(src: str, pattern: str, column: str) -> str:
  """Why `src` gave no documents, in the terms of the flag or folder to change: a Parquet file
  without rows; class folders without images (an image folder whose classes are all empty);
  no file matching --pattern."""
  if src.endswith(".parquet"):
    return f"SRC: {src!r} has no rows in column {column!r} (--column)"
  folders = sorted(d for d in os.listdir(src)
                   if os.path.isdir(os.path.join(src, d)) and not d.startswith("."))
  if folders and not any(f.lower().endswith(IMAGE_SUFFIXES) for d in folders
                         for f in os.listdir(os.path.join(src, d))):
    shown = ", ".join(repr(d) for d in folders[:5]) + (", ..." if len(folders) > 5 else "")
    return (f"SRC: the class folders of {src!r} hold no images ({shown}: no "
            f"{'/'.join(IMAGE_SUFFIXES)} files), and no file matches --pattern {pattern!r}")
  return f"SRC: no file in {src!r} matches --pattern {pattern!r}"


def read_parquet_column(path: str, column: str) -> list:
  pq = import_pyarrow("parquet")
  try:
    table = pq.read_table(path, columns=[column])
  except Exception as e:  # noqa: BLE001 -- pyarrow raises ArrowInvalid, KeyError, OSError
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise ValueError(f"SRC: cannot read column {column!r} of {path!r}: {first}") from e
  return table.column(column).to_pylist()


def import_pyarrow(module: str = ""):
  """pyarrow (or pyarrow.<module>), with a one-line error naming the extra that installs it."""
  import importlib  # pylint: disable=g-import-not-at-top
  try:
    return importlib.import_module("pyarrow" + (f".{module}" if module else ""))
  except ImportError as e:
    raise ValueError("reading Parquet / Arrow needs pyarrow: pip install jaxdl[data]") from e


def check_shard_size(shard_size) -> None:
  """One-line ConfigError naming --shard-size unless it is a positive integer."""
  if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
    raise ConfigError(f"--shard-size: expected a positive integer (records per shard), got "
                      f"{shard_size!r}")


def write_split(out_dir: str, split: str, examples: Iterator[dict[str, np.ndarray]], count: int,
                fields: dict[str, dict], shard_size: int, desc: str,
                tok: Tokenizer | None = None) -> dict:
  """Writes `count` examples to ceil(count / shard_size) ArrayRecord shards; the split entry.
  Token records name the fingerprint of the tokenizer `tok` that made them, shard by shard
  ("tokenizer_sha256": {file: sha256}), which training checks against the folder's tokenizer."""
  check_shard_size(shard_size)
  from array_record.python.array_record_module import ArrayRecordWriter  # noqa: E501 pylint: disable=g-import-not-at-top
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  n_shards = max(1, math.ceil(count / shard_size))
  files = [f"{split}-{i:05d}-of-{n_shards:05d}.array_record" for i in range(n_shards)]
  try:
    writers = [ArrayRecordWriter(os.path.join(out_dir, f), "group_size:1") for f in files]
    for i, ex in enumerate(tqdm(examples, total=count, desc=desc, unit="ex", leave=False)):
      writers[i * n_shards // count].write(records.encode_record(ex, fields))
    for w in writers:
      w.close()
  except RuntimeError as e:
    error = _os_error(e, out_dir)
    if error is None:
      raise
    raise error from e
  entry = {"count": count, "files": files}
  if tok is not None:
    entry["tokenizer_sha256"] = {f: tok.fingerprint for f in files}
  return entry


# The failed writes array_record reports as a RuntimeError naming the system's message, e.g.
# 'write() failed: No space left on device; writing D/train-00000-of-00001.array_record; ...'.
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)


def _os_error(e: RuntimeError, out_dir: str) -> OSError | None:
  """The OSError an array_record RuntimeError stands for (so `jaxdl.disk_errors` finds a full
  disk there as anywhere else), naming the shard it was writing; None for any other error."""
  text = str(e)
  code = next((c for c in _WRITE_ERRNOS if os.strerror(c) in text), None)
  if code is None:
    return None
  path = re.search(r"writing (\S+?);", text)
  return OSError(code, os.strerror(code), path.group(1) if path else out_dir)


def prepare_text(src: str, out_dir: str, *, tokenizer: str = "bytes", pattern: str = "*.txt",
                 max_bytes: int = 0, column: str = "text", val_frac: float = 0.1,
                 shard_size: int = 4096, force: bool = False) -> dict:
  """Text documents -> token-id records + lengths + manifest in `out_dir` (the manifest),
  written whole (`jaxdl.data.staging.staged_output`).

  Refused before anything is read: an `out_dir` of other data or another tokenizer, unless
  `force` (`staging.check_out`). A BPE whose TRAINED_ON record says it saw another train split
  of this `src` is refused, as is `out_dir`'s own tokenizer.json ('bpe') trained on other files
  (`check_trained_on`)."""
  tok = get_tokenizer(tokenizer, out_dir, key="--tokenizer")
  if not force:
    staging.check_out(out_dir, src, tok, tokenizer)
  docs = text_documents(src, pattern=pattern, max_bytes=max_bytes, column=column,
                        val_frac=val_frac)
  if tok.hf is not None:  # a BPE: it may carry a record of the split it was trained on
    tok_file = (os.path.join(out_dir, "tokenizer.json") if tokenizer == "bpe"
                else os.path.expanduser(tokenizer))
    check_trained_on(tok, tok_file, src, _flags(src, pattern, max_bytes, column, val_frac),
                     docs["train"], own=tokenizer == "bpe")
  dtype = "uint16" if tok.vocab_size <= 2**16 else "int32"
  fields = {"tokens": {"shape": [-1], "dtype": dtype}}
  splits = {}
  # Written only once the input has been read and checked.
  with staging.staged_output(out_dir, tok) as stage:
    for split, texts in docs.items():
      ids = tok.encode_batch(texts)
      np.save(os.path.join(stage, f"{split}.lengths.npy"), np.array([len(t) for t in ids]))
      splits[split] = write_split(stage, split, ({"tokens": t} for t in ids), len(ids), fields,
                                  shard_size, f"{split} documents", tok)
      splits[split]["bytes"] = sum(len(t.encode("utf-8")) for t in texts)
      splits[split]["tokens"] = int(sum(len(t) for t in ids))
    return records.write_manifest(stage, {
        "kind": "lm", "fields": fields, "splits": splits, "source": os.path.abspath(src),
        "tokenizer": tokenizer_entry(tok)})


def tokenizer_entry(tok: Tokenizer) -> dict:
  return {"name": tok.name, "vocab_size": tok.vocab_size, "eot_id": tok.eot_id,
          "sha256": tok.fingerprint}


def train_tokenizer(src: str, out_dir: str, *, vocab: int, pattern: str = "*.txt",
                    max_bytes: int = 0, column: str = "text", val_frac: float = 0.1,
                    force: bool = False) -> Tokenizer:
  """A BPE of `vocab` ids trained on the train split of `src`, saved as out_dir/tokenizer.json
  with its TRAINED_ON record beside it (the source, the flags that made the split, a digest of
  the train documents), both written whole (`jaxdl.data.staging`).

  An `out_dir` holding data prepared with another tokenizer is refused (the data would be left
  beside a tokenizer that did not make it), unless `force`, which removes that data; the same
  tokenizer trained again leaves the data and its tokenizer.json as they are."""
  check_vocab_size(vocab)  # before reading anything
  docs = text_documents(src, pattern=pattern, max_bytes=max_bytes, column=column,
                        val_frac=val_frac)
  tok = train_bpe(docs["train"], vocab)
  same = staging.check_new_tokenizer(out_dir, tok, force=force)
  with staging.staged(out_dir, keep_data=same or not force) as stage:
    path = os.path.join(stage, "tokenizer.json")
    if not same:  # the same tokenizer: the file the manifest checksums stays
      tok.save(path)
    with open(trained_on_path(path), "w") as f:
      json.dump({"source": os.path.abspath(src),
                 "flags": _flags(src, pattern, max_bytes, column, val_frac),
                 "train_documents": len(docs["train"]), "train_sha256": _digest(docs["train"]),
                 "tokenizer_sha256": tok.fingerprint}, f, indent=2)
  return tok


def trained_on_path(tokenizer_json: str) -> str:
  return os.path.splitext(tokenizer_json)[0] + ".trained_on.json"


def _flags(src: str, pattern: str, max_bytes: int, column: str, val_frac: float) -> dict:
  """The flags that decide `src`'s train split, as the CLI spells them."""
  if src.endswith(".parquet"):
    return {"--column": column, "--val-frac": val_frac}
  return {"--pattern": pattern, "--max-bytes": max_bytes, "--val-frac": val_frac}


def _digest(texts: list[str]) -> str:
  h = hashlib.sha256()
  for t in texts:
    b = t.encode("utf-8")
    h.update(len(b).to_bytes(8, "little") + b)  # length-prefixed: boundaries count
  return h.hexdigest()


def check_trained_on(tok: Tokenizer, tok_file: str, src: str, flags: dict, train: list[str], *,
                     own: bool) -> None:
  """One-line ValueError when the TRAINED_ON record of `tok_file` shows a train split other than
  `train`: always for the same `src` (its val documents would have shaped the tokenizer), and
  for another source when `own` (OUT's tokenizer.json, which `jaxdl data tokenizer` wrote for
  this data). A tokenizer without a record, or replaced since its record was written, is not
  checked; one passed by path and trained on other files is reuse, and accepted."""
  try:
    with open(trained_on_path(tok_file)) as f:
      record = json.load(f)
  except (OSError, ValueError):
    return
  if record.get("tokenizer_sha256") != tok.fingerprint or record.get("train_sha256") == _digest(
      train):
    return
  defaults = {"--pattern": "*.txt", "--max-bytes": 0, "--column": "text", "--val-frac": 0.1}
  retrain = " ".join([f"jaxdl data tokenizer {src} --out {os.path.dirname(tok_file) or '.'}",
                      *(f"{k} {v}" for k, v in flags.items() if defaults[k] != v)])
  if record.get("source") == os.path.abspath(src):
    saw = record.get("flags", {})
    differ = [f"{k} {saw[k]} there, {v} here" for k, v in flags.items() if saw.get(k) != v]
    if differ:
      raise ValueError(f"--tokenizer: {tok_file!r} was trained on another split of {src!r} "
                       f"({'; '.join(differ)}); prepare with its flags, or retrain it with "
                       f"`{retrain}`")
    raise ValueError(f"--tokenizer: {src!r} changed since {tok_file!r} was trained on it (train "
                     f"split then {record.get('train_documents')} documents, now {len(train)}); "
                     f"retrain it with `{retrain}`")
  if own:
    raise ValueError(f"--tokenizer: {tok_file!r} was trained on {record.get('source')!r}, not "
                     f"{src!r}; retrain it with `{retrain}`, or pass its path as --tokenizer to "
                     "reuse it on these files")
