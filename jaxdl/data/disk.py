"""Sources on disk: prepared ArrayRecord shards, Parquet files, Hugging Face `save_to_disk` folders.

All of them are `Split`s the grain pipeline (`jaxdl.data.pipeline`) indexes like the in-memory
ones, so shuffling, per-process sharding and the checkpointed iterator position are unchanged.

  arrayrecord  a prepared directory (`jaxdl data prepare`, format in `jaxdl.data.records`); every
               file's sha256 is checked against the manifest when the source is built. lm data is
               read document by document as windows need them (`packing.DocStream`); image
               records are decoded to x = pixels / 255, float32 (H, W, C), and take `augment`
               (`jaxdl.data.augment`) like the other image sources; fewer train images than
               data.batch_size is refused naming that key (`DataSource.check_batch`).
  parquet      a .parquet file, or a folder of them (the split's files: <split>*.parquet or
               <split>/*.parquet).
  stdlib_bpe   the `text` source's standard-library files prepared with a BPE trained by jaxdl
               (once, into a cache directory): what `experiments/bpe_gpt.py` trains on.
  stdlib_instructions  an instruction set built from the standard library (prompt: a function's
               docstring line, response: its `def` line; `jaxdl.data.chat`), prepared once into
               the cache directory with `prepare_with`'s tokenizer: what
               `experiments/finetune_lora.py` fine-tunes on.
Prepared instruction data (a manifest with `loss_mask`) is read as a masked stream: its batches
carry `loss_mask` (B, T), zero on prompts (`jaxdl.data.packing`).
  hf_disk      a `datasets` folder written by `save_to_disk` (a Dataset, or a DatasetDict with one
               folder per split), read with pyarrow from its arrow files; `datasets` is not needed.
Tables give language-model text (kind 'lm': `columns` names the text column, each row one
document, tokenized with `tokenizer` and packed) or feature columns with a `label` column. The
eval split is `eval_split`, or else the last val_frac of the rows.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sysconfig

import numpy as np

from jaxdl import cache
from jaxdl.data import chat, packing, prepare, records, staging
from jaxdl.data.augment import augment_setting
from jaxdl.data.prepare import import_pyarrow
from jaxdl.schema import NONNEG, OPEN_UNIT, POSITIVE, one_of, setting
from jaxdl.data.registry import DataSource, Source, Split, register_source
from jaxdl.data.sources import existing_path
from jaxdl.data.tokenize import Tokenizer, get_tokenizer


@dataclasses.dataclass(frozen=True)
class TextWindows(DataSource):
  """The language-model keys: windows of T tokens, packed documents (`jaxdl.data.packing`)."""
  batch_size: int = 32
  eval_batch_size: int | None = 64
  context_length: int = setting(128, POSITIVE)   # T
  max_eval_windows: int = setting(512, NONNEG)   # 0: every stride-T val window
  segment_ids: bool = False   # the batch carries segment and position ids (document masking)
  tokenizer: str = ""         # bytes | bpe | path/tokenizer.json ("": the data's own)

  def windows(self, train, val, tok: Tokenizer, key: str) -> Source:
    src = packing.packed_source(train, val, t=self.context_length,
                                max_eval_windows=self.max_eval_windows, eot_id=tok.eot_id,
                                vocab_size=tok.vocab_size, segment_ids=self.segment_ids, key=key,
                                bytes_V=tok.token_bytes())
    src.info["tokenizer"] = {"name": tok.name, "sha256": tok.fingerprint}
    return src


def _image_split(reader: records.RecordReader) -> Split:
  def gather(idx_B):
    exs = reader.get(idx_B)
    return {"x": np.stack([e["x"] for e in exs]).astype(np.float32) / 255.0,
            "y": np.asarray([e["y"] for e in exs], np.int32)}
  return Split(len(reader), gather)


def _tokens_of(reader: records.RecordReader):
  return lambda indices: [e["tokens"] for e in reader.get(indices)]


def _tokens_masks_of(reader: records.RecordReader, field: str, column: int):
  """`indices -> [(ids, mask), ...]` of instruction records (`jaxdl.data.chat`)."""
  def get(indices):
    out = []
    for e in reader.get(indices):
      both_Nx2 = e[field]
      out.append((both_Nx2[:, 1 - column], both_Nx2[:, column]))
    return out
  return get


@register_source("arrayrecord")
@dataclasses.dataclass(frozen=True)
class ArrayRecord(TextWindows):
  """A prepared directory of ArrayRecord shards (module docstring)."""
  path: str = ""
  augment: tuple = augment_setting()   # prepared images: training ops (jaxdl.data.augment)

  def directory(self) -> str:
    return os.path.expanduser(self.path)

  def build(self) -> Source:
    return self.build_from(self.path)

  def build_from(self, path: str) -> Source:
    directory = os.path.expanduser(path)
    manifest = records.read_manifest(path)
    readers = {s: records.RecordReader(directory, manifest["splits"][s], manifest["fields"])
               for s in ("train", "val")}
    if manifest["kind"] == "classification":
      tr, ev = _image_split(readers["train"]), _image_split(readers["val"])
      shape = manifest["fields"]["x"]["shape"]
      info = dict(kind="classification", num_classes=len(manifest["classes"]), vocab_size=None,
                  input_shape=tuple(shape), num_train=tr.num, num_eval=ev.num)
      src = Source(tr, ev, info)
      self.check_batch(tr.num, f"images in the train split of {path!r}")
    else:
      tok = self._tokenizer(directory, manifest)
      mask = manifest.get("loss_mask")
      streams = []
      for s in ("train", "val"):
        lengths = np.load(os.path.join(directory, f"{s}.lengths.npy"))
        get = (_tokens_of(readers[s]) if mask is None else
               _tokens_masks_of(readers[s], mask["field"], int(mask["column"])))
        streams.append(packing.DocStream(get, lengths, tok.eot_id, masked=mask is not None))
      src = self.windows(*streams, tok, "data.path")
    src.info["data_checksum"] = records.manifest_digest(manifest)
    return src

  def _tokenizer(self, directory: str, manifest: dict) -> Tokenizer:
    """The folder's tokenizer (tokenizer.json for 'bpe', else bytes), which must be the one
    every shard names (`prepare.write_split`) and the manifest's; data.tokenizer, when set, must
    be that same tokenizer. Each refusal names both fingerprints."""
    entry = manifest["tokenizer"]
    own = get_tokenizer(entry["name"], directory)
    where = (os.path.join(directory, staging.TOKENIZER) if own.hf is not None
             else "the bytes tokenizer")
    again = f"; prepare it again with `jaxdl data prepare SRC --out {directory} --force`"
    made_with = {repr(os.path.join(directory, f)): sha for s in ("train", "val")
                 for f, sha in manifest["splits"][s].get("tokenizer_sha256", {}).items()}
    # A folder prepared before shards named their tokenizer: the manifest's entry for all.
    made_with[f"the data of {directory!r}"] = entry["sha256"]
    for what, sha in made_with.items():
      if sha != own.fingerprint:
        raise ValueError(f"data.path: {what} was made with the tokenizer of sha256 {sha[:12]}, "
                         f"but the folder's tokenizer ({where}) is sha256 "
                         f"{own.fingerprint[:12]}{again}")
    if not self.tokenizer:
      return own
    tok = get_tokenizer(self.tokenizer, directory)
    if tok.fingerprint != own.fingerprint:
      raise ValueError(f"data.tokenizer: {self.tokenizer!r} is not the tokenizer {directory!r} "
                       f"was prepared with (sha256 {tok.fingerprint[:12]} vs the manifest's "
                       f"{own.fingerprint[:12]})")
    return tok


def cache_dir() -> str:
  """Where built-in corpora are prepared once: the cache root (`jaxdl.cache`)."""
  return cache.cache_dir()


@register_source("stdlib_bpe")
@dataclasses.dataclass(frozen=True)
class StdlibBPE(ArrayRecord):
  """The `text` source's files and split (the standard library's .py files, crc32 of the path
  against val_frac) prepared to ArrayRecord with a byte-level BPE of `vocab` ids trained on the
  train split; prepared on first use into `path` (default: under `cache_dir()`)."""
  vocab: int = setting(4096, POSITIVE)
  max_bytes: int = setting(2_000_000, POSITIVE)
  val_frac: float = setting(0.1, OPEN_UNIT)

  def directory(self) -> str:
    return os.path.expanduser(self.path) or os.path.join(
        cache_dir(), f"stdlib-{self.max_bytes}-{self.val_frac}-bpe{self.vocab}")

  def build(self) -> Source:
    path = self.directory()
    if not os.path.isfile(os.path.join(path, records.MANIFEST)):
      root = sysconfig.get_paths()["stdlib"]
      text = dict(pattern="*.py", max_bytes=self.max_bytes, val_frac=self.val_frac)

      def build(tmp):
        prepare.train_tokenizer(root, tmp, vocab=self.vocab, **text)
        prepare.prepare_text(root, tmp, tokenizer="bpe", **text)
      # Built aside and renamed into place: a concurrent run never sees half of it, and a killed
      # build's leftovers are removed by the next one.
      staging.build_once(path, build)
    return self.build_from(path)


@register_source("stdlib_instructions")
@dataclasses.dataclass(frozen=True)
class StdlibInstructions(ArrayRecord):
  """Instruction records from the standard library's .py files (`jaxdl.data.chat.
  stdlib_instructions`: prompt = a documented function's docstring line, response = its `def`
  line), at most `max_records` of lines at most `max_line` characters, split by crc32 of the
  module path against val_frac (the `text` source's and `stdlib_bpe`'s rule, so with the same
  val_frac a val record comes from a file those train splits left out), tokenized with
  `prepare_with` (bytes | a tokenizer.json | a model directory holding one) and prepared on first
  use into `path` (default: under `cache_dir()`, named by the settings and the tokenizer)."""
  prepare_with: str = "bytes"
  max_records: int = setting(20_000, POSITIVE)
  max_line: int = setting(100, POSITIVE)
  val_frac: float = setting(0.1, OPEN_UNIT)

  def directory(self) -> str:
    if self.path:
      return os.path.expanduser(self.path)
    tok = get_tokenizer(os.path.expanduser(self.prepare_with), key="data.prepare_with")
    return os.path.join(cache_dir(), f"stdlib-instructions-{self.max_records}-{self.max_line}-"
                        f"{self.val_frac}-{tok.name}-{tok.fingerprint[:12]}")

  def build(self) -> Source:
    path = self.directory()
    if not os.path.isfile(os.path.join(path, records.MANIFEST)):
      root = sysconfig.get_paths()["stdlib"]
      recs = [(r["split_key"], [("user", r["prompt"]), ("assistant", r["response"])])
              for r in chat.stdlib_instructions(root, self.max_records, self.max_line)]
      staging.build_once(path, lambda tmp: chat.prepare_chat(  # aside, as StdlibBPE's
          root, tmp, tokenizer=os.path.expanduser(self.prepare_with), val_frac=self.val_frac,
          records_=recs))
    return self.build_from(path)


@dataclasses.dataclass(frozen=True)
class Table(TextWindows):
  """Rows of a table (module docstring); a subclass reads the table of a split."""
  path: str = ""
  split: str = "train"
  eval_split: str = ""                            # "": the last val_frac of the rows
  val_frac: float = setting(0.1, OPEN_UNIT)
  kind: str = setting("lm", one_of("lm", "classification", "regression"))
  columns: str = "text"                           # lm: the text column; else feature columns
  label: str = "label"                            # the label column (not lm)
  tokenizer: str = "bytes"

  def read(self, split: str):
    raise NotImplementedError

  def build(self) -> Source:
    names = [c.strip() for c in self.columns.split(",") if c.strip()]
    if self.kind == "lm" and len(names) != 1:
      raise ValueError(f"data.columns: kind 'lm' reads one text column, got {self.columns!r}")
    needed = names if self.kind == "lm" else [*names, self.label]
    table = self._select(self.read(self.split), needed, self.split)
    if self.eval_split:
      eval_table = self._select(self.read(self.eval_split), needed, self.eval_split)
    else:
      cut = table.num_rows - int(round(self.val_frac * table.num_rows))
      table, eval_table = table.slice(0, cut), table.slice(cut)
    if self.kind == "lm":
      tok = get_tokenizer(self.tokenizer)
      streams = [packing.ArrayStream(packing.join_documents(
          tok.encode_batch([str(t) for t in t_.column(names[0]).to_pylist()]), tok.eot_id))
          for t_ in (table, eval_table)]
      return self.windows(*streams, tok, "data.path")
    from jaxdl.data.sources import arrays_source  # pylint: disable=g-import-not-at-top
    splits = [{"x": np.stack([_column(t_, c) for c in names], axis=1).astype(np.float32),
               "y": _column(t_, self.label)} for t_ in (table, eval_table)]
    num_classes = None
    if self.kind == "classification":
      for s in splits:
        s["y"] = s["y"].astype(np.int32)
      num_classes = int(max(s["y"].max() for s in splits)) + 1
    else:
      for s in splits:
        s["y"] = s["y"].astype(np.float32)
    return arrays_source(self.kind, *splits, num_classes=num_classes)

  def _select(self, table, needed: list[str], split: str):
    missing = [c for c in needed if c not in table.column_names]
    if missing:
      raise ValueError(f"data.columns: {self.path!r} split {split!r} has no column "
                       f"{missing[0]!r}; it has {table.column_names}")
    if table.num_rows == 0:
      raise ValueError(f"data.path: {self.path!r} split {split!r} has no rows")
    return table.select(needed)


def _column(table, name: str) -> np.ndarray:
  a = np.asarray(table.column(name).to_pylist())
  if a.dtype == object or not np.issubdtype(a.dtype, np.number):
    raise ValueError(f"data.columns: column {name!r} is not numeric ({a.dtype})")
  return a


@register_source("parquet")
@dataclasses.dataclass(frozen=True)
class Parquet(Table):
  """A .parquet file or a folder of them (module docstring)."""

  def read(self, split: str):
    pa, pq = import_pyarrow(), import_pyarrow("parquet")
    full = existing_path(self.path, file=False)
    if os.path.isfile(full):
      if split != self.split:
        raise ValueError(f"data.eval_split: {self.path!r} is one file; name a folder with split "
                         "files, or leave eval_split empty for a val_frac holdout")
      files = [full]
    else:
      files = sorted(os.path.join(d, f) for d, _, fs in os.walk(full) for f in fs
                     if f.endswith(".parquet") and (f.startswith(split) or
                                                    os.path.basename(d) == split))
      if not files:
        raise ValueError(f"data.split: no {split}*.parquet or {split}/*.parquet in {self.path!r}")
    try:
      return pa.concat_tables([pq.read_table(f) for f in files])
    except Exception as e:  # noqa: BLE001 -- ArrowInvalid, OSError on a truncated file
      raise ValueError(f"data.path: cannot read {files} as Parquet: {e}") from e


@register_source("hf_disk")
@dataclasses.dataclass(frozen=True)
class HFDisk(Table):
  """A Hugging Face `save_to_disk` folder (module docstring)."""

  def read(self, split: str):
    pa = import_pyarrow()
    full = existing_path(self.path, file=False)
    if os.path.isfile(os.path.join(full, "dataset_dict.json")):
      with open(os.path.join(full, "dataset_dict.json")) as f:
        splits = json.load(f).get("splits", [])
      if split not in splits:
        raise ValueError(f"data.split: {split!r} is not a split of {self.path!r}; it has "
                         f"{splits}")
      full = os.path.join(full, split)
    state = os.path.join(full, "state.json")
    if not os.path.isfile(state):
      raise ValueError(f"data.path: {full!r} has no state.json (not a save_to_disk folder)")
    with open(state) as f:
      files = [os.path.join(full, d["filename"]) for d in json.load(f)["_data_files"]]
    tables = []
    for fpath in files:
      try:
        with pa.memory_map(fpath) as source:
          tables.append(pa.ipc.open_stream(source).read_all())
      except Exception as e:  # noqa: BLE001 -- ArrowInvalid, OSError on a truncated file
        raise ValueError(f"data.path: cannot read {fpath!r} as an Arrow stream: {e}") from e
    return pa.concat_tables(tables)
