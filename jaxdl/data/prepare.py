"""Converting a user's files to prepared data (`jaxdl data prepare`, `jaxdl data tokenizer`).

Sources (SRC):
  a folder of text files   each file one document (`pattern` picks them, sorted by relative
                           path, read until `max_bytes`); must be UTF-8
  a .parquet file          each row of `column` one document
  a folder of images       root/<class>/*.png|jpg, every image of one size and mode

Split: an example goes to val when crc32(its relative path, or its row number) / 2^32 < val_frac,
so the split does not depend on which other files exist (the rule the `text` source uses for
the standard library). Text is tokenized (`jaxdl.data.tokenize`) into one record of token ids per
document; images become (x uint8 (H, W, C), y int32) records. The output format is in
`jaxdl.data.records`.
"""

from __future__ import annotations

import fnmatch
import math
import os
import zlib
from typing import Iterator

import numpy as np

from jaxdl.data import records
from jaxdl.data.tokenize import Tokenizer, check_vocab_size, get_tokenizer, train_bpe

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def in_val(name: str, val_frac: float) -> bool:
  return zlib.crc32(name.encode()) / 2**32 < val_frac


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


def _walk(root: str, pattern: str) -> list[str]:
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
  `max_bytes` > 0 caps the bytes read (the last file is cut there)."""
  check_source(src)
  if src.endswith(".parquet"):
    texts = [(str(i), t) for i, t in enumerate(read_parquet_column(src, column))]
  else:
    if not os.path.isdir(src):
      raise ValueError(f"SRC: expected a folder of text files or a .parquet file, got {src!r}")
    texts, total = [], 0
    for rel in _walk(src, pattern):
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
    raise ValueError(f"SRC: no documents in {src!r} (pattern {pattern!r})")
  out = {"train": [], "val": []}
  for name, text in texts:
    out["val" if in_val(name, val_frac) else "train"].append(text)
  return out


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


def write_split(out_dir: str, split: str, examples: Iterator[dict[str, np.ndarray]], count: int,
                fields: dict[str, dict], shard_size: int, desc: str) -> dict:
  """Writes `count` examples to ceil(count / shard_size) ArrayRecord shards; the split entry."""
  from array_record.python.array_record_module import ArrayRecordWriter  # noqa: E501 pylint: disable=g-import-not-at-top
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  n_shards = max(1, math.ceil(count / shard_size))
  files = [f"{split}-{i:05d}-of-{n_shards:05d}.array_record" for i in range(n_shards)]
  writers = [ArrayRecordWriter(os.path.join(out_dir, f), "group_size:1") for f in files]
  for i, ex in enumerate(tqdm(examples, total=count, desc=desc, unit="ex", leave=False)):
    writers[i * n_shards // count].write(records.encode_record(ex, fields))
  for w in writers:
    w.close()
  return {"count": count, "files": files}


def prepare_text(src: str, out_dir: str, *, tokenizer: str = "bytes", pattern: str = "*.txt",
                 max_bytes: int = 0, column: str = "text", val_frac: float = 0.1,
                 shard_size: int = 4096) -> dict:
  """Text documents -> token-id records + lengths + manifest in `out_dir` (the manifest)."""
  tok = get_tokenizer(tokenizer, out_dir, key="--tokenizer")
  docs = text_documents(src, pattern=pattern, max_bytes=max_bytes, column=column,
                        val_frac=val_frac)
  for split, texts in docs.items():
    if not texts:
      raise ValueError(f"--val-frac: {val_frac} leaves the {split} split of {src!r} empty")
  os.makedirs(out_dir, exist_ok=True)  # only once the input has been read and checked
  if tok.hf is not None and not os.path.isfile(os.path.join(out_dir, "tokenizer.json")):
    tok.save(os.path.join(out_dir, "tokenizer.json"))  # the data carries its tokenizer
  dtype = "uint16" if tok.vocab_size <= 2**16 else "int32"
  fields = {"tokens": {"shape": [-1], "dtype": dtype}}
  splits = {}
  for split, texts in docs.items():
    ids = tok.encode_batch(texts)
    np.save(os.path.join(out_dir, f"{split}.lengths.npy"), np.array([len(t) for t in ids]))
    splits[split] = write_split(out_dir, split, ({"tokens": t} for t in ids), len(ids), fields,
                                shard_size, f"{split} documents")
    splits[split]["bytes"] = sum(len(t.encode("utf-8")) for t in texts)
    splits[split]["tokens"] = int(sum(len(t) for t in ids))
  return records.write_manifest(out_dir, {
      "kind": "lm", "fields": fields, "splits": splits, "source": os.path.abspath(src),
      "tokenizer": tokenizer_entry(tok)})


def tokenizer_entry(tok: Tokenizer) -> dict:
  return {"name": tok.name, "vocab_size": tok.vocab_size, "eot_id": tok.eot_id,
          "sha256": tok.fingerprint}


def train_tokenizer(src: str, out_dir: str, *, vocab: int, pattern: str = "*.txt",
                    max_bytes: int = 0, column: str = "text", val_frac: float = 0.1) -> Tokenizer:
  """A BPE of `vocab` ids trained on the train split of `src`, saved as out_dir/tokenizer.json."""
  check_vocab_size(vocab)  # before reading anything
  docs = text_documents(src, pattern=pattern, max_bytes=max_bytes, column=column,
                        val_frac=val_frac)
  tok = train_bpe(docs["train"], vocab)
  os.makedirs(out_dir, exist_ok=True)
  tok.save(os.path.join(out_dir, "tokenizer.json"))
  return tok
