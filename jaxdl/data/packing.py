"""Documents packed into fixed language-model windows, with segment and position ids.

Shapes: N documents, L stream length, B batch rows, T context length.

The stream puts an end-of-text token e before every document:

    stream = e d_0 e d_1 e d_2 ...          L = sum_n (len(d_n) + 1)

and window j is stream[j T : j T + T + 1], x = its first T tokens, y = its last T (each x's next
token). A document's e opens its segment, so every target is predictable from its own segment:
the first token of a document from e alone, e itself (closing a document) from the document. With
segment ids the batch also carries

    segment_ids[i] = #{k <= i : x[k] = e}          (0 for a document cut by the window start)
    positions[i]   = i - (last k <= i with x[k] = e, else 0)

so attention restricted to equal segment ids and positions restarting at 0 make each document
see exactly what it would see alone (`jaxdl.models.gpt`).

Bits per byte. Given the tokenizer's byte counts b(v) (`Tokenizer.token_bytes`, b(e) = 0), the
batch also carries `bytes_per_token` (B,), which the lm task divides its loss by:

    train windows   r_i = sum_t b(y_it) / T                  (window i's own)
    eval windows    r   = sum_{i,t} b(y_it) / (N_eval T)      (the eval split's, on every row)

so a batch's bits per byte, mean_i(CE_i) / mean_i(r_i) / ln 2, is its total nats over its total
UTF-8 bytes, and the eval average over batches (weighted by rows) is exactly the eval split's
total nats / ln 2 / total bytes the target tokens decode to.
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from jaxdl.data.registry import Source, Split


class TokenStream(Protocol):
  """The packed stream: `length` L and `read(a, b)` = stream[a:b] as an int array."""
  length: int

  def read(self, start: int, stop: int) -> np.ndarray: ...


def join_documents(docs: list[np.ndarray], eot_id: int) -> np.ndarray:
  """e d_0 e d_1 ... as one int32 array."""
  parts = []
  for d in docs:
    parts += [np.asarray([eot_id], np.int32), np.asarray(d, np.int32)]
  return np.concatenate(parts) if parts else np.zeros((0,), np.int32)


class ArrayStream:
  """A stream held in memory."""

  def __init__(self, tokens_L: np.ndarray):
    self.tokens_L, self.length = tokens_L, len(tokens_L)

  def read(self, start: int, stop: int) -> np.ndarray:
    return self.tokens_L[start:stop]


class DocStream:
  """A stream over documents read on demand: `get(indices) -> list of token arrays` (e.g. an
  ArrayRecord source) and their lengths; a window reads only the documents it overlaps."""

  def __init__(self, get: Callable[[list[int]], list[np.ndarray]], lengths_N: np.ndarray,
               eot_id: int):
    sizes_N = np.asarray(lengths_N, np.int64) + 1
    self.starts_N = np.concatenate([[0], np.cumsum(sizes_N)[:-1]])
    self.length = int(sizes_N.sum())
    self.get, self.eot_id = get, eot_id

  def read(self, start: int, stop: int) -> np.ndarray:
    first = int(np.searchsorted(self.starts_N, start, side="right")) - 1
    last = int(np.searchsorted(self.starts_N, stop, side="left"))  # documents starting < stop
    docs = self.get(list(range(first, last)))
    piece = join_documents(docs, self.eot_id)
    lo = start - int(self.starts_N[first])
    return piece[lo:lo + stop - start]


def segment_positions(x_BxT: np.ndarray, eot_id: int) -> tuple[np.ndarray, np.ndarray]:
  """(segment_ids, positions), each int32 (B, T), as defined in the module docstring."""
  is_eot_BxT = x_BxT == eot_id
  seg_BxT = np.cumsum(is_eot_BxT, axis=1)
  idx_BxT = np.broadcast_to(np.arange(x_BxT.shape[1]), x_BxT.shape)
  start_BxT = np.maximum.accumulate(np.where(is_eot_BxT, idx_BxT, 0), axis=1)
  return seg_BxT.astype(np.int32), (idx_BxT - start_BxT).astype(np.int32)


def window_split(stream: TokenStream, starts_N: np.ndarray, t: int, eot_id: int,
                 segment_ids: bool, bytes_V: np.ndarray | None = None,
                 split_rate: bool = False) -> Split:
  """Windows of T + 1 tokens at `starts_N`: {'x', 'y'} (+ 'segment_ids', 'positions'; with
  `bytes_V`, 'bytes_per_token': each window's, or with `split_rate` the split's, module
  docstring)."""

  def windows(idx_B):
    win_BxT1 = np.stack([stream.read(int(s), int(s) + t + 1) for s in starts_N[idx_B]])
    return win_BxT1.astype(np.int32)

  rate = None
  if bytes_V is not None and split_rate:
    chunks = np.array_split(np.arange(len(starts_N)), max(1, len(starts_N) // 256))
    total = sum(int(bytes_V[windows(c)[:, 1:]].sum()) for c in chunks)
    rate = total / (len(starts_N) * t)

  def gather(idx_B):
    win_BxT1 = windows(idx_B)
    batch = {"x": win_BxT1[:, :-1], "y": win_BxT1[:, 1:]}
    if segment_ids:
      batch["segment_ids"], batch["positions"] = segment_positions(batch["x"], eot_id)
    if bytes_V is not None:
      batch["bytes_per_token"] = (np.full(len(idx_B), rate, np.float32) if split_rate else
                                  bytes_V[batch["y"]].mean(-1, dtype=np.float32))
    return batch

  return Split(len(starts_N), gather)


def packed_source(train: TokenStream, val: TokenStream, *, t: int, max_eval_windows: int,
                  eot_id: int, vocab_size: int, segment_ids: bool, key: str,
                  bytes_V: np.ndarray | None = None) -> Source:
  """The lm `Source` of two streams: train windows every T tokens; eval windows every T tokens,
  or `max_eval_windows` starts spread evenly when that is fewer (0: all). `key` names the setting
  to blame for a split shorter than one window. `bytes_V`: the tokenizer's bytes per id, for
  the batches' `bytes_per_token` (module docstring)."""
  for name, stream in (("train", train), ("val", val)):
    if stream.length < t + 1:
      raise ValueError(f"{key}: the {name} split has {stream.length} tokens, fewer than "
                       f"context_length + 1 = {t + 1}")
  train_starts = np.arange(0, train.length - t, t)
  val_starts = np.arange(0, val.length - t, t)
  if 0 < max_eval_windows < len(val_starts):
    val_starts = np.linspace(0, val.length - t - 1, max_eval_windows).astype(np.int64)
  tr = window_split(train, train_starts, t, eot_id, segment_ids, bytes_V)
  ev = window_split(val, val_starts, t, eot_id, segment_ids, bytes_V, split_rate=True)
  info = dict(kind="lm", num_classes=None, vocab_size=vocab_size, input_shape=(t,),
              num_train=tr.num, num_eval=ev.num)
  return Source(tr, ev, info)
