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

where the e are those that open documents: a document read from records (`DocStream`) may hold
the id e itself (a chat template's '</s>' closing each turn), which stays inside its segment,
so attention restricted to equal segment ids and positions restarting at 0 make each document
see exactly what it would see alone (`jaxdl.models.gpt`).

Bits per byte. Given the tokenizer's byte counts b(v) (`Tokenizer.token_bytes`, b(e) = 0), the
batch also carries `bytes_per_token` (B,), which the lm task divides its loss by:

    train windows   r_i = sum_t b(y_it) / T                  (window i's own)
    eval windows    r   = sum_{i,t} b(y_it) / (N_eval T)      (the eval split's, on every row)

so a batch's bits per byte, mean_i(CE_i) / mean_i(r_i) / ln 2, is its total nats over its total
UTF-8 bytes, and the eval average over batches (weighted by rows) is exactly the eval split's
total nats / ln 2 / total bytes the target tokens decode to.

Loss masks (instruction data, `jaxdl.data.chat`). A masked stream carries a mask beside its
tokens, mask[i] = 1 when stream token i is scored as a target: a document's own mask (1 on the
response), and for the e before document n > 0 the value 1 (it closes document n - 1: the model
learns to stop; the stream's first e is never a target). A window's batch then also carries

    loss_mask[i]   = mask[j T + 1 + i]                 (B, T), aligned with y
    bytes_per_token  r_i = sum_t m_it b(y_it) / max(1, sum_t m_it)        (train: window i's own)
                     R   = sum_{i,t} m_it b(y_it) / sum_{i,t} m_it        (eval: the split's)
    scored_per_row   S   = sum_{i,t} m_it / N_eval                        (eval only)

so the lm task's per-response-token loss and bits per byte are exact over the eval split
(`jaxdl.train.tasks`). An unmasked stream's batches are exactly as above, without these keys.
"""

from __future__ import annotations

import collections
from typing import Callable, Protocol

import numpy as np

from jaxdl.data.registry import Source, Split


class TokenStream(Protocol):
  """The packed stream: `length` L and `read(a, b)` = stream[a:b] as an int array; a masked one
  (`masked` True) also `read_pair(a, b)` = (stream[a:b], mask[a:b])."""
  length: int

  def read(self, start: int, stop: int) -> np.ndarray: ...


def join_documents(docs: list[np.ndarray], eot_id: int) -> np.ndarray:
  """e d_0 e d_1 ... as one int32 array."""
  parts = []
  for d in docs:
    parts += [np.asarray([eot_id], np.int32), np.asarray(d, np.int32)]
  return np.concatenate(parts) if parts else np.zeros((0,), np.int32)


def join_masks(masks: list[np.ndarray], first: int = 0) -> np.ndarray:
  """The mask of `join_documents` over documents first, first + 1, ...: each e scored (1) when
  it closes a document (n > 0), then the document's own mask (module docstring)."""
  parts = []
  for n, m in enumerate(masks, first):
    parts += [np.asarray([int(n > 0)], np.uint8), np.asarray(m, np.uint8)]
  return np.concatenate(parts) if parts else np.zeros((0,), np.uint8)


class ArrayStream:
  """A stream held in memory (with `mask_L`, a masked one)."""

  def __init__(self, tokens_L: np.ndarray, mask_L: np.ndarray | None = None):
    self.tokens_L, self.length = tokens_L, len(tokens_L)
    self.mask_L, self.masked = mask_L, mask_L is not None

  def read(self, start: int, stop: int) -> np.ndarray:
    return self.tokens_L[start:stop]

  def read_pair(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    return self.tokens_L[start:stop], self.mask_L[start:stop]


# Tokens of decoded documents a DocStream keeps (about 16 MB as int32). A window of T + 1 tokens
# reads every document it overlaps whole (bpe_gpt's: 65 tokens from documents of 3,800 on
# average), and the reads were 62% of a packed batch's time; a corpus this size or smaller is
# then read once. Least recently used documents go first; outputs never depend on it.
DOC_CACHE_TOKENS = 1 << 22


class DocStream:
  """A stream over documents read on demand: `get(indices) -> list of token arrays` (e.g. an
  ArrayRecord source) and their lengths; a window reads only the documents it overlaps, keeping
  up to `cache_tokens` tokens of decoded documents (least recently used out first). With
  `masked`, `get` returns (ids, mask) pairs and the stream is a masked one."""

  def __init__(self, get: Callable[[list[int]], list], lengths_N: np.ndarray, eot_id: int,
               masked: bool = False, cache_tokens: int = DOC_CACHE_TOKENS):
    sizes_N = np.asarray(lengths_N, np.int64) + 1
    self.starts_N = np.concatenate([[0], np.cumsum(sizes_N)[:-1]])
    self.length = int(sizes_N.sum())
    self.get, self.eot_id, self.masked = get, eot_id, masked
    self.cache_tokens = cache_tokens
    self._cache: collections.OrderedDict = collections.OrderedDict()
    self._cached = 0

  def _size(self, doc) -> int:
    return len(doc[0] if self.masked else doc)

  def _docs(self, start: int, stop: int) -> tuple[int, list]:
    first = int(np.searchsorted(self.starts_N, start, side="right")) - 1
    last = int(np.searchsorted(self.starts_N, stop, side="left"))  # documents starting < stop
    wanted = range(first, last)
    missing = [i for i in wanted if i not in self._cache]
    fetched = dict(zip(missing, self.get(missing))) if missing else {}
    docs = []
    for i in wanted:
      doc = fetched.get(i)
      if doc is None:  # cached: taken out and put back as the most recently used
        doc = self._cache.pop(i, None)
        if doc is None:  # evicted since (another thread reading this stream): read it again
          doc = self.get([i])[0]
        else:
          self._cached -= self._size(doc)
      docs.append(doc)
      if self._size(doc) <= self.cache_tokens:
        self._cache[i] = doc
        self._cached += self._size(doc)
    while self._cached > self.cache_tokens and self._cache:
      self._cached -= self._size(self._cache.popitem(last=False)[1])
    return first, docs

  def read(self, start: int, stop: int) -> np.ndarray:
    if self.masked:
      return self.read_pair(start, stop)[0]
    first, docs = self._docs(start, stop)
    piece = join_documents(docs, self.eot_id)
    lo = start - int(self.starts_N[first])
    return piece[lo:lo + stop - start]

  def read_pair(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    first, docs = self._docs(start, stop)
    piece = join_documents([d for d, _ in docs], self.eot_id)
    mask = join_masks([m for _, m in docs], first)
    lo = start - int(self.starts_N[first])
    return piece[lo:lo + stop - start], mask[lo:lo + stop - start]


def segment_positions(x_BxT: np.ndarray, eot_id: int,
                      opens_BxT: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(segment_ids, positions), each int32 (B, T), as defined in the module docstring; a segment
  opens at each e, or with `opens_BxT` (`document_opens`) at each document's own e only."""
  is_eot_BxT = x_BxT == eot_id if opens_BxT is None else opens_BxT
  seg_BxT = np.cumsum(is_eot_BxT, axis=1)
  idx_BxT = np.broadcast_to(np.arange(x_BxT.shape[1]), x_BxT.shape)
  start_BxT = np.maximum.accumulate(np.where(is_eot_BxT, idx_BxT, 0), axis=1)
  return seg_BxT.astype(np.int32), (idx_BxT - start_BxT).astype(np.int32)


def document_opens(doc_starts_N: np.ndarray, window_starts_B: np.ndarray,
                   t: int) -> np.ndarray:
  """bool (B, T): True where window b's token i is the e that opens a document (stream offset
  window_starts_B[b] + i in `doc_starts_N`, a `DocStream`'s), whatever other e it holds."""
  opens_BxT = np.zeros((len(window_starts_B), t), bool)
  lo_B = np.searchsorted(doc_starts_N, window_starts_B, side="left")
  hi_B = np.searchsorted(doc_starts_N, window_starts_B + t, side="left")
  for b, (lo, hi) in enumerate(zip(lo_B, hi_B)):
    opens_BxT[b, doc_starts_N[lo:hi] - window_starts_B[b]] = True
  return opens_BxT


def window_split(stream: TokenStream, starts_N: np.ndarray, t: int, eot_id: int,
                 segment_ids: bool, bytes_V: np.ndarray | None = None,
                 split_rate: bool = False) -> Split:
  """Windows of T + 1 tokens at `starts_N`: {'x', 'y'} (+ 'segment_ids', 'positions'; with
  `bytes_V`, 'bytes_per_token': each window's, or with `split_rate` the split's; from a masked
  stream 'loss_mask' (+ 'scored_per_row' with `split_rate`), module docstring)."""
  masked = getattr(stream, "masked", False)

  def windows(idx_B):
    if masked:
      pairs = [stream.read_pair(int(s), int(s) + t + 1) for s in starts_N[idx_B]]
      return (np.stack([p[0] for p in pairs]).astype(np.int32),
              np.stack([p[1] for p in pairs]).astype(np.float32))
    win_BxT1 = np.stack([stream.read(int(s), int(s) + t + 1) for s in starts_N[idx_B]])
    return win_BxT1.astype(np.int32), None

  rate = scored = None
  if split_rate and (bytes_V is not None or masked):
    chunks = np.array_split(np.arange(len(starts_N)), max(1, len(starts_N) // 256))
    total_bytes, total_scored = 0, 0.0
    for c in chunks:
      win_BxT1, mask_BxT1 = windows(c)
      if masked:
        total_scored += float(mask_BxT1[:, 1:].sum())
        if bytes_V is not None:
          total_bytes += float((bytes_V[win_BxT1[:, 1:]] * mask_BxT1[:, 1:]).sum())
      else:
        total_bytes += int(bytes_V[win_BxT1[:, 1:]].sum())
    if masked:
      scored = total_scored / len(starts_N)
      rate = total_bytes / max(total_scored, 1.0)
    else:
      rate = total_bytes / (len(starts_N) * t)

  def gather(idx_B):
    win_BxT1, mask_BxT1 = windows(idx_B)
    batch = {"x": win_BxT1[:, :-1], "y": win_BxT1[:, 1:]}
    if segment_ids:  # a DocStream's documents open where they start: a chat record's own e
      # (a template's '</s>' ending each turn) is inside its segment, not a new one
      opens_BxT = (document_opens(stream.starts_N, starts_N[idx_B], t)
                   if hasattr(stream, "starts_N") else None)
      batch["segment_ids"], batch["positions"] = segment_positions(batch["x"], eot_id, opens_BxT)
    if masked:
      batch["loss_mask"] = mask_BxT1[:, 1:]
      if split_rate:
        batch["scored_per_row"] = np.full(len(idx_B), scored, np.float32)
    if bytes_V is not None:
      if split_rate:
        batch["bytes_per_token"] = np.full(len(idx_B), rate, np.float32)
      elif masked:
        m_BxT = batch["loss_mask"]
        batch["bytes_per_token"] = ((bytes_V[batch["y"]] * m_BxT).sum(-1) / np.maximum(
            m_BxT.sum(-1), 1.0)).astype(np.float32)
      else:
        batch["bytes_per_token"] = bytes_V[batch["y"]].mean(-1, dtype=np.float32)
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
