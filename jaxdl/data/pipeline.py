"""grain pipelines over a `Source`: the infinite training stream and the padded eval pass.

Shapes: G global batch rows, B this process's rows (G / process_count), N examples.

Training stream. Step s (0, 1, 2, ...) of the global stream is epoch e = s // S, position
j = s % S, with S = N // G steps per epoch (drop_remainder):

    perm_e = default_rng(SeedSequence([seed, e])).permutation(N)    (identity when shuffle=False)
    global_rows(s) = perm_e[j G : (j + 1) G]
    process p yields rows global_rows(s)[p B : (p + 1) B]

so the global batch at step s is the same for any process_count, and each epoch is a fresh
permutation that depends only on (seed, e). As a grain pipeline this is

    MapDataset.range(S).repeat()            # index = s, infinite
      .map_with_index(global_rows)          # s -> the G example indices of step s
      .map(this process's slice, gather)    # -> dict of (B, ...) arrays (and `data.augment`'s
                                            #    ops, `jaxdl.data.augment`)
      .to_iter_dataset()                    # in-process, no threads: a checkpointable iterator

and the iterator's whole state is grain's `next_index` (= s), an int: resuming needs no arrays.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import grain
import numpy as np

from jaxdl.data.augment import Augmentation
from jaxdl.data.registry import Source, Split

# Everything is in memory and small: read in the calling thread so the order and the state are
# exactly those of the index stream, with no background work racing a checkpoint.
_READ_OPTIONS = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)


def _check_sharding(key: str, batch_size: int, process_index: int, process_count: int):
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} is not in [0, process_count = "
                     f"{process_count})")
  if batch_size < 1:
    raise ValueError(f"{key}: must be positive, got {batch_size}")
  if batch_size % process_count:
    raise ValueError(f"{key}: global batch size {batch_size} is not divisible by "
                     f"process_count {process_count}")


class _EpochPermutations:
  """`rows(s)`: the G example indices of global step s (one permutation cached per epoch)."""

  def __init__(self, num: int, batch_size: int, seed: int, shuffle: bool):
    self.num, self.batch_size, self.seed, self.shuffle = num, batch_size, seed, shuffle
    self.steps_per_epoch = num // batch_size
    self._cache: tuple[int, np.ndarray] | None = None

  def permutation(self, epoch: int) -> np.ndarray:
    if not self.shuffle:
      return np.arange(self.num)
    if self._cache is None or self._cache[0] != epoch:
      # SeedSequence mixes (seed, epoch) properly: seed 0 epoch 1 is unrelated to seed 1 epoch 0.
      rng = np.random.default_rng(np.random.SeedSequence([self.seed % 2**32, epoch]))
      self._cache = (epoch, rng.permutation(self.num))
    return self._cache[1]

  def rows(self, step: int) -> np.ndarray:
    epoch, j = divmod(step, self.steps_per_epoch)
    return self.permutation(epoch)[j * self.batch_size:(j + 1) * self.batch_size]


class TrainIterator(Iterator[dict[str, np.ndarray]]):
  """Infinite iterator of this process's training batches with a small JSON state.

  `get_state()` -> {'step': s, 'epoch': e, 'global_batch_size': G, 'seed': seed,
  'num_train': N, 'shuffle': 0|1} (+ 'data_checksum' of prepared data); `set_state` accepts it
  from any process_count (the stream is defined globally) but refuses one made for a different
  G, seed, N, shuffle or data checksum, since step s would then mean different data.
  """

  def __init__(self, split: Split, *, batch_size: int, seed: int, shuffle: bool,
               process_index: int, process_count: int, augment: Augmentation | None = None,
               data_checksum: str = ""):
    self._perms = _EpochPermutations(split.num, batch_size, seed, shuffle)
    b = batch_size // process_count
    lo, hi = process_index * b, (process_index + 1) * b
    spe = self._perms.steps_per_epoch
    # augment: a grain Map of (epoch, rows_G), randomness from the records (jaxdl.data.augment).
    load = (augment.transform(split.gather, lo, hi) if augment is not None
            else lambda e_rows: split.gather(e_rows[1][lo:hi]))
    perms = self._perms  # not `self`: the dataset must pickle alone (grain's worker processes)
    ds = (grain.MapDataset.range(spe).repeat(None)
          .map_with_index(lambda step, _: (step // spe, perms.rows(step)))
          .map(load))
    # Index s -> batch s: the stream itself, for running it elsewhere (`jaxdl.bench.loaders` runs
    # it on grain worker processes with `mp_prefetch`); this iterator reads it in-process.
    self.dataset = ds
    self._it = ds.to_iter_dataset(_READ_OPTIONS).__iter__()
    # data_checksum (prepared data on disk): a resumed run refuses data changed since the save.
    self._fingerprint = {**({"data_checksum": data_checksum} if data_checksum else {}),
                         "global_batch_size": int(batch_size), "seed": int(seed),
                         "num_train": int(split.num), "shuffle": int(bool(shuffle))}

  @property
  def step(self) -> int:
    """Global steps yielded so far (the index of the next batch)."""
    return int(self._it.get_state()["next_index"])

  @property
  def epoch(self) -> int:
    """The epoch the next batch belongs to."""
    return self.step // self._perms.steps_per_epoch

  @property
  def steps_per_epoch(self) -> int:
    return self._perms.steps_per_epoch

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self._it)

  def get_state(self) -> dict[str, int]:
    return {"step": self.step, "epoch": self.epoch, **self._fingerprint}

  def set_state(self, state: dict[str, Any]) -> None:
    for k, v in self._fingerprint.items():
      if k in state and (str(state[k]) if isinstance(v, str) else int(state[k])) != v:
        raise ValueError(f"data iterator state: saved {k}={state[k]} but this pipeline has "
                         f"{k}={v}; the saved step would select different data")
    step = int(state["step"])
    if step < 0:
      raise ValueError(f"data iterator state: step must be >= 0, got {step}")
    self._it.set_state({"next_index": step})


class EvalBatches:
  """Finite, re-iterable pass over an eval split in fixed order.

  The split (size N) is padded to K = ceil(N / G) global batches of G rows; padding rows repeat
  example 0 and carry mask 0, real rows mask 1, so every batch has the same shape. Process p gets
  rows [p B : (p + 1) B] of each global batch.
  """

  def __init__(self, split: Split, *, batch_size: int, process_index: int, process_count: int):
    self.global_batch_size = batch_size
    self.num_batches = math.ceil(split.num / batch_size)
    b = batch_size // process_count
    lo, hi = process_index * b, (process_index + 1) * b
    num = split.num

    def load(k):
      rows_G = np.arange(k * batch_size, (k + 1) * batch_size)[lo:hi]
      real_B = rows_G < num
      batch = split.gather(np.where(real_B, rows_G, 0))
      batch["mask"] = real_B.astype(np.float32)
      return batch

    self._ds = grain.MapDataset.range(self.num_batches).map(load)

  def __len__(self) -> int:
    return self.num_batches

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self._ds.to_iter_dataset(_READ_OPTIONS).__iter__()


class Dataset:
  """A built dataset: `info`, `train_iter(...)`, `eval_batches(...)` (see jaxdl.data)."""

  def __init__(self, source: Source, *, batch_size: int, eval_batch_size: int | None,
               seed: int, shuffle: bool, name: str, augment: Augmentation | None = None):
    self.source, self.batch_size, self.seed, self.shuffle = source, batch_size, seed, shuffle
    self.augment = augment  # the training stream's only; evaluation is never augmented
    self.eval_batch_size = eval_batch_size
    self.info = dict(source.info, name=name,
                     steps_per_epoch=source.train.num // batch_size)

  def train_iter(self, process_index: int = 0, process_count: int = 1) -> TrainIterator:
    _check_sharding("data.batch_size", self.batch_size, process_index, process_count)
    return TrainIterator(self.source.train, batch_size=self.batch_size, seed=self.seed,
                         shuffle=self.shuffle, process_index=process_index,
                         process_count=process_count, augment=self.augment,
                         data_checksum=self.info.get("data_checksum", ""))

  def eval_batches(self, batch_size: int | None = None, process_index: int = 0,
                   process_count: int = 1) -> EvalBatches:
    key = "batch_size" if batch_size is not None else "data.eval_batch_size"
    if batch_size is None:
      batch_size = self.eval_batch_size
    if batch_size is None:
      # The whole split in one batch, rounded up so that every process gets equal rows.
      batch_size = process_count * math.ceil(self.source.eval.num / process_count)
    _check_sharding(key, batch_size, process_index, process_count)
    return EvalBatches(self.source.eval, batch_size=batch_size, process_index=process_index,
                       process_count=process_count)
