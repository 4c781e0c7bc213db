"""A PyTorch DataLoader doing the work of jaxdl's grain pipelines (`jaxdl bench --only data`).

torch is optional (`pip install -e ".[bench]"`, a CPU wheel is enough) and imported only inside
`dataloader`; everything else here is numpy, so the suite checks the baseline without torch.

The same work. For each pipeline a map-style dataset whose item is one record, as a PyTorch user
writes it, read from the same prepared ArrayRecord shards through the same reader
(`grain.sources.ArrayRecordDataSource`, one record per `__getitem__` call: `source[i]`) and
decoded by `records.decode_record`; its `collate` (the DataLoader's collate_fn) builds the batch
with jaxdl's own numpy:

  TextWindows   item (epoch, row) -> training window `row`: T + 1 tokens of the packed stream,
                from the documents it overlaps (`packing.DocStream`); collate stacks B windows
                into x, y and adds segment ids, positions (`packing.segment_positions`) and
                bytes per token, as `packing.window_split` does.
  ImageRecords  item (epoch, row) -> (uint8 image, label); collate scales to float32 / 255 and
                applies the record-level ops (`Augmentation.records`: crop, flip, jitter, drawn
                from (seed, epoch, row)). Mixup / cutmix (pairs across the batch) are refused.

`StepRows` is the batch sampler: step s lists the rows of the grain stream's step s (the
pipeline's own `_EpochPermutations`), so the DataLoader's batch s is `train_iter()`'s batch s bit
for bit (tests/test_bench_loaders.py checks that without torch).

Contenders at W workers, each given `warm` batches to start, then timed alternately for `rounds`
rounds of `batches` batches (best round each; wall clock, the workers' CPU is not this process's):

  grain        W = 0: `Dataset.train_iter()`, exactly as jaxdl trains (in-process, no threads);
               W > 0: the same stream (`TrainIterator.dataset`) with `mp_prefetch(W)` (spawned
               worker processes, `prefetch` batches buffered per worker, arrays under
               SHM_MIN_BYTES pickled rather than put in shared memory)
  DataLoader   `torch.utils.data.DataLoader(dataset, batch_sampler=StepRows, collate_fn=collate,
               num_workers=W, prefetch_factor=prefetch)`, workers started by forkserver

Ratio = grain batches/s over the DataLoader's at the same W (target >= 1). jaxdl trains at W = 0;
W = 2 is what a user of this 2-core machine would pick. A worker contender's buffers refill while
the other one runs, so each round starts with up to W x prefetch batches ready, the same number
for both.

Measured here (`jaxdl bench --only data`, torch 2.15.0 run on the CPU, this 2-core CPU otherwise
idle, 2026-12-03; grain over DataLoader, three runs, median first):

  packed BPE   0 workers 1.03x (1.03, 1.01, 1.04), 2 workers 1.54x (1.43, 1.54, 1.69)
  images       0 workers 1.04x (1.00, 1.04, 1.04), 2 workers 1.49x (1.40, 1.61, 1.49)

Before small arrays were pickled (SHM_MIN_BYTES) grain's text at 2 workers was at parity or
below: 1.01x (0.92, 1.03, 1.01) on 2026-12-02, 0.95x (0.80, 0.95, 1.02) on 2026-12-03.

Both contenders read documents through the same `packing.DocStream`, and its reads were the cost:
a py-spy profile of the grain stream had 62% of a batch in `ArrayRecordDataSource.__getitem__`
(a window of 65 tokens reads every document it overlaps whole, 3,800 tokens on average), 10%
joining documents and 7% decoding, grain's own iterator layers about 1%. With the stream's cache
of decoded documents (`packing.DOC_CACHE_TOKENS`) this corpus is read once, and both went from
about 340 to 1,600 batches/s; before it three runs gave 0.96x (1.00, 0.96, 0.80), and an earlier
one under load 0.85x. Before `records.RecordReader.get` read record by record it was
0.17-0.29x: the batched `ArrayRecordDataSource.__getitems__` starts a thread pool on every call
(~400 us for one record against ~45 us for `source[i]`), and the text pipeline reads once per
window, 32 times a batch.
"""

from __future__ import annotations

import os
import tempfile
from typing import Iterator

import numpy as np

from jaxdl.bench.timing import Clock, interleaved
from jaxdl.data import packing, records
from jaxdl.data.augment import Augmentation
from jaxdl.data.pipeline import _EpochPermutations  # the stream's own row order
from jaxdl.data.tokenize import get_tokenizer

INSTALL = 'pip install -e ".[bench]"'
# grain's workers hand the main process an array of this many bytes or more through shared
# memory, a smaller one pickled through the queue (grain's `min_shm_size`; its default, 0, sends
# every array through shared memory). A packed-text batch is five arrays of at most 8 KB, and a
# segment for each (create, map, unlink) cost more than copying them: at 2 workers grain's text
# stream went from 734, 647, 664 to 1010, 1022, 889 batches/s (the two settings side by side in
# one process, each the best of 5 alternated rounds of 40 batches, three times). An image batch's
# 1.5 MB of pixels still goes through shared memory: 77.1 and 65.8 batches/s at 0 bytes against
# 77.1 and 67.5 at this size, and 0.96x with every array pickled (the same way, twice).
SHM_MIN_BYTES = 1 << 16
IMAGE_OPS = ("crop=4", "flip", "jitter")   # every record-level op, on 32 x 32 RGB


def torch_available() -> bool:
  import importlib.util  # pylint: disable=g-import-not-at-top
  return importlib.util.find_spec("torch") is not None


class _Records:
  """One split's ArrayRecord shards, read a record at a time (module docstring)."""

  def __init__(self, directory: str, split: str = "train"):
    self.directory = os.path.expanduser(directory)
    self.manifest = records.read_manifest(self.directory)
    reader = records.RecordReader(self.directory, self.manifest["splits"][split],
                                  self.manifest["fields"])
    self.source, self.fields = reader.source, self.manifest["fields"]

  def record(self, i: int) -> dict[str, np.ndarray]:
    return records.decode_record(self.source[int(i)], self.fields)


class TextWindows(_Records):
  """The packed BPE pipeline's training windows of `context` tokens (module docstring)."""

  def __init__(self, directory: str, context: int):
    super().__init__(directory)
    tok = get_tokenizer(self.manifest["tokenizer"]["name"], self.directory)
    lengths_N = np.load(os.path.join(self.directory, "train.lengths.npy"))
    self.stream = packing.DocStream(self._docs, lengths_N, tok.eot_id)
    self.starts_N = np.arange(0, self.stream.length - context, context)  # as packed_source
    self.t, self.eot_id, self.bytes_V = context, tok.eot_id, tok.token_bytes()

  def _docs(self, indices: list[int]) -> list[np.ndarray]:
    return [self.record(i)["tokens"] for i in indices]

  def __len__(self) -> int:
    return len(self.starts_N)

  def __getitem__(self, index: tuple[int, int]) -> np.ndarray:
    start = int(self.starts_N[index[1]])
    return self.stream.read(start, start + self.t + 1)

  def collate(self, windows: list[np.ndarray]) -> dict[str, np.ndarray]:
    win_BxT1 = np.stack(windows).astype(np.int32)
    batch = {"x": win_BxT1[:, :-1], "y": win_BxT1[:, 1:]}
    batch["segment_ids"], batch["positions"] = packing.segment_positions(batch["x"], self.eot_id)
    batch["bytes_per_token"] = self.bytes_V[batch["y"]].mean(-1, dtype=np.float32)
    return batch


class ImageRecords(_Records):
  """The prepared image pipeline's training records, augmented per batch (module docstring)."""

  def __init__(self, directory: str, augment: Augmentation | None):
    if augment is not None and augment.mixes:
      raise ValueError("ImageRecords: mixup / cutmix pair records across the batch; this "
                       "baseline does the record-level ops only (crop, flip, jitter)")
    super().__init__(directory)
    self.augment = augment

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, index: tuple[int, int]) -> tuple[int, int, np.ndarray, np.ndarray]:
    epoch, row = index
    ex = self.record(row)
    return epoch, row, ex["x"], ex["y"]

  def collate(self, items: list[tuple]) -> dict[str, np.ndarray]:
    epochs, rows, xs, ys = zip(*items)
    batch = {"x": np.stack(xs).astype(np.float32) / 255.0, "y": np.asarray(ys, np.int32)}
    if self.augment is not None:  # one step's rows share its epoch
      batch, _ = self.augment.records(batch, epochs[0], np.asarray(rows))
    return batch


class StepRows:
  """Batch sampler: step s -> [(epoch, row), ...], the grain stream's rows of step s (its seed,
  shuffle and global batch; one process), for steps `start`, `start` + 1, ... forever."""

  def __init__(self, num: int, batch_size: int, seed: int, shuffle: bool, start: int = 0):
    self.perms = _EpochPermutations(num, batch_size, seed, shuffle)
    self.start = start

  @classmethod
  def of(cls, ds, start: int = 0) -> "StepRows":
    """The stream of `jaxdl.data.Dataset` `ds`."""
    return cls(ds.source.train.num, ds.batch_size, ds.seed, ds.shuffle, start)

  def rows(self, step: int) -> list[tuple[int, int]]:
    epoch = step // self.perms.steps_per_epoch
    return [(epoch, int(r)) for r in self.perms.rows(step)]

  def __iter__(self) -> Iterator[list[tuple[int, int]]]:
    step = self.start
    while True:
      yield self.rows(step)
      step += 1


def dataloader(dataset, steps: StepRows, num_workers: int, prefetch: int = 2):
  """`torch.utils.data.DataLoader` over `dataset` (a map-style object: DataLoader needs only
  `__getitem__` and `__len__`) in `steps`' order, `dataset.collate` making numpy batches."""
  from torch.utils.data import DataLoader  # pylint: disable=g-import-not-at-top
  # forkserver, not the default fork: a process running JAX's threads must not fork (JAX warns
  # of deadlocks), and grain's workers are fresh processes too (spawned).
  more = dict(prefetch_factor=prefetch, multiprocessing_context="forkserver") if num_workers else {}
  return DataLoader(dataset, batch_sampler=steps, collate_fn=dataset.collate,
                    num_workers=num_workers, **more)


def grain_batches(ds, num_workers: int, prefetch: int = 2) -> Iterator[dict[str, np.ndarray]]:
  """jaxdl's training stream of `ds`: in-process at 0 workers (as it trains), else the same
  grain dataset on `num_workers` spawned processes."""
  it = ds.train_iter()
  if not num_workers:
    return it
  import grain  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS.is_parsed():  # grain's worker processes read its absl flags' defaults
    flags.FLAGS.mark_as_parsed()
  opts = grain.MultiprocessingOptions(num_workers=num_workers, per_worker_buffer_size=prefetch)
  stream = it.dataset.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
  stream = grain.experimental.WithOptionsIterDataset(
      stream, grain.experimental.DatasetOptions(min_shm_size=SHM_MIN_BYTES))
  return iter(stream.mp_prefetch(opts))


def compare(ds, dataset, *, workers=(0, 2), batches: int = 40, rounds: int = 5, warm: int = 3,
            prefetch: int = 2) -> dict:
  """{W: {'grain', 'dataloader' (batches/s), 'ratio' (+ 'ratio_cpu' at W = 0: CPU seconds per
  batch, DataLoader over grain)}} for each worker count W (module docstring): `ds` a built
  `jaxdl.data.Dataset`, `dataset` the DataLoader's records of it."""
  out = {}
  for w in workers:
    its = {"grain": grain_batches(ds, w, prefetch),
           "dataloader": iter(dataloader(dataset, StepRows.of(ds), w, prefetch))}
    try:
      for it in its.values():
        for _ in range(warm):  # starts the workers
          next(it)

      def timed(it):
        def run(n):
          with Clock() as clock:
            for _ in range(n):
              next(it)
          return clock
        return run

      best = interleaved({k: timed(it) for k, it in its.items()}, steps=batches, rounds=rounds)
    finally:
      for it in its.values():
        close = getattr(it, "close", None) or getattr(it, "_shutdown_workers", None)
        if close is not None:
          close()
    rate = {k: 1.0 / v["wall"] for k, v in best.items()}
    out[w] = {**rate, "ratio": rate["grain"] / rate["dataloader"]}
    if not w:  # both in this process: its CPU seconds barely feel the machine's other load
      out[w]["ratio_cpu"] = best["dataloader"]["cpu"] / best["grain"]["cpu"]
  return out


def prepare_images(out_dir: str, num: int = 4096, shape=(32, 32, 3), classes: int = 10,
                   seed: int = 0) -> str:
  """A prepared image directory (the format `jaxdl data prepare` writes) of `num` random uint8
  images of `shape` and labels in [0, classes), plus a 1/16-size val split; returns it."""
  from jaxdl.data.prepare import write_split  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  fields = {"x": {"shape": list(shape), "dtype": "uint8"}, "y": {"shape": [], "dtype": "int32"}}
  os.makedirs(out_dir, exist_ok=True)
  splits = {}
  for split, n in (("train", num), ("val", max(1, num // 16))):
    x = rng.integers(0, 256, (n, *shape), np.uint8)
    y = rng.integers(0, classes, n).astype(np.int32)
    examples = ({"x": x[i], "y": y[i]} for i in range(n))
    splits[split] = write_split(out_dir, split, examples, n, fields, 1024, f"{split} images")
  records.write_manifest(out_dir, {"kind": "classification", "fields": fields, "splits": splits,
                                   "classes": [str(c) for c in range(classes)]})
  return out_dir


def image_dataset(directory: str, ops: tuple = IMAGE_OPS, batch: int = 128):
  """The prepared images at `directory` as jaxdl trains on them: the `arrayrecord` source with
  `data.augment=ops`, batch 128 (the image sources' default), seed 0."""
  from jaxdl import data as jdata  # pylint: disable=g-import-not-at-top
  from jaxdl.config import base_config  # pylint: disable=g-import-not-at-top
  config = base_config()
  config.data = jdata.default_data_config("arrayrecord")
  config.data.update(path=directory, batch_size=batch, augment=tuple(ops))
  return jdata.make_dataset(config)


def bench_dataloader(pipelines=("bpe", "images"), workers=(0, 2), **kw) -> dict:
  """{pipeline: `compare`'s result} for bpe_gpt's packed BPE pipeline ('bpe',
  `jaxdl.bench.text_data`: batch 32 x 64 tokens, segment ids) and the augmented image pipeline
  ('images': 4096 prepared 32 x 32 RGB records, batch 128, IMAGE_OPS); {'skipped': why} when
  torch is not installed."""
  if not torch_available():
    return {"skipped": f"torch is not installed; {INSTALL} enables it"}
  out = {}
  if "bpe" in pipelines:
    from jaxdl.bench import text_data  # pylint: disable=g-import-not-at-top
    ds = text_data.bpe_dataset()
    windows = TextWindows(text_data.bpe_directory(), int(ds.info["input_shape"][0]))
    out["bpe"] = compare(ds, windows, workers=workers, **kw)
  if "images" in pipelines:
    with tempfile.TemporaryDirectory() as tmp:
      ds = image_dataset(prepare_images(tmp))
      out["images"] = compare(ds, ImageRecords(tmp, ds.augment), workers=workers, **kw)
  return out
