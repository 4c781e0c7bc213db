"""Passkey retrieval: a key stated once, thousands of tokens of stdlib source text, then the
question; the answer is the key. The data of `experiments/long_context.py`, where the context
length decides whether the key can be seen at all.

Shapes: N documents, C context (`context_length`), D key digits, R = C + 1 row tokens.

  passkey   a document, read from its end (the question) backwards, is

              ... filler | "The pass key is " k_1 .. k_D ". " | filler | "\\nWhat is the pass
              key? " ASK | k_1 .. k_D

            with bytes 0..255 as tokens, key digit j (0-based) of value v as the token
            256 + 10 j + v (each digit its own ten ids: recall is then one attention hop from
            the token before, no induction over equal digit tokens), ASK = 256 + 10 D; vocabulary
            257 + 10 D. The filler is one contiguous stretch of the stdlib's .py bytes (the `text`
            source's files and train / val split, `sources.stdlib_corpus`) read cyclically from
            a random end, with the statement inserted at distance d from the question: d is the
            number of tokens from k_1 of the statement to ASK, uniform in
            [distance, distance + spread] (the key's depth is random). A row is the document's
            last R tokens: x = row[:C], y = row[1:], so the D answer digits are the targets at
            x's last D positions (ASK, k_1 .. k_{D-1}) and loss_mask is 1 there, 0 elsewhere
            (the filler and the statement are not scored). ASK sits at x[C - D], k_1 of the
            statement at x[C - D - d]: the row holds the whole key iff C >= d + D and none of
            it iff C <= d, so a context of at most `distance` never sees the key (chance:
            1/10 a digit) and one of at least distance + spread + D always does.
            The documents do not depend on C (each is drawn from the seed alone): contexts
            differ only in how much of the same documents they see.   kind 'lm'

Rows are built when a batch is gathered (a Split of N row descriptions: the filler's end, d, the
key), so N and C cost no memory up front.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxdl.data.registry import DataSource, Source, Split, register_source
from jaxdl.data.sources import stdlib_corpus
from jaxdl.schema import NONNEG, OPEN_UNIT, POSITIVE, ConfigError, setting

HEAD = b"The pass key is "
TAIL = b". "
QUESTION = b"\nWhat is the pass key? "
KEY_BASE = 256  # digit j of value v: KEY_BASE + 10 j + v


def ask_token(digits: int) -> int:
  return KEY_BASE + 10 * digits


def vocab_size(digits: int) -> int:
  return ask_token(digits) + 1


def min_distance(digits: int) -> int:
  """The least d: the key, the statement's tail and the question between k_1 and ASK."""
  return digits + len(TAIL) + len(QUESTION)


def document_length(distance_max: int, digits: int) -> int:
  """Tokens of a document whose key sits `distance_max` before ASK, the statement's head first."""
  return len(HEAD) + distance_max + 1 + digits


def _segments(d_B: np.ndarray, digits: int) -> np.ndarray:
  """(B, 7) lengths of the document's segments from its end: answer, ASK, question, filler,
  tail, key, head (the filler before the head is the rest)."""
  b = len(d_B)
  fixed = lambda v: np.full(b, v)  # noqa: E731
  filler = d_B - min_distance(digits)
  return np.stack([fixed(digits), fixed(1), fixed(len(QUESTION)), filler, fixed(len(TAIL)),
                   fixed(digits), fixed(len(HEAD))], axis=1)


def rows(corpus_L: np.ndarray, end_B: np.ndarray, d_B: np.ndarray, key_BxD: np.ndarray,
         length: int) -> np.ndarray:
  """int32 (B, length): the last `length` tokens of each document (module docstring)."""
  digits = key_BxD.shape[1]
  r_R = np.arange(length)[::-1]                  # tokens from the document's end
  bounds_Bx7 = np.cumsum(_segments(d_B, digits), axis=1)
  seg_BxR = (r_R[None, :, None] >= bounds_Bx7[:, None, :]).sum(-1)  # 0..7, 7: the first filler
  start_BxR = np.take_along_axis(np.pad(bounds_Bx7, ((0, 0), (1, 0))), seg_BxR, axis=1)
  off_BxR = r_R[None] - start_BxR                # from the segment's end, backwards
  # Filler tokens: the corpus read backwards from `end`, skipping the inserted segments.
  inserted_BxR = bounds_Bx7[:, 2:3] + np.where(seg_BxR == 7,
                                               bounds_Bx7[:, 6:7] - bounds_Bx7[:, 3:4], 0)
  filler_BxR = corpus_L[(end_B[:, None] - 1 - (r_R[None] - inserted_BxR)) % len(corpus_L)]

  def back(table, n):  # a segment's tokens read from its end; `table` is (n,) or (B, n)
    i_BxR = np.clip(n - 1 - off_BxR, 0, n - 1)
    return np.take_along_axis(table, i_BxR, 1) if table.ndim == 2 else table[i_BxR]

  key_tok_BxD = KEY_BASE + 10 * np.arange(digits) + key_BxD
  head, tail, question = (np.frombuffer(s, np.uint8) for s in (HEAD, TAIL, QUESTION))
  out_BxR = np.select(
      [seg_BxR == 0, seg_BxR == 1, seg_BxR == 2, seg_BxR == 4, seg_BxR == 5, seg_BxR == 6],
      [back(key_tok_BxD, digits), np.full_like(seg_BxR, ask_token(digits)),
       back(question, len(question)), back(tail, len(tail)), back(key_tok_BxD, digits),
       back(head, len(head))],
      filler_BxR)
  return out_BxR.astype(np.int32)


def _split(corpus_L, end_N, d_N, key_NxD, context: int) -> Split:
  digits = key_NxD.shape[1]
  mask_T = np.zeros(context, np.float32)
  mask_T[context - digits:] = 1.0

  def gather(idx_B):
    row_BxR = rows(corpus_L, end_N[idx_B], d_N[idx_B], key_NxD[idx_B], context + 1)
    return {"x": row_BxR[:, :-1], "y": row_BxR[:, 1:],
            "loss_mask": np.broadcast_to(mask_T, row_BxR[:, 1:].shape).copy()}

  return Split(len(end_N), gather)


@register_source("passkey")
@dataclasses.dataclass(frozen=True)
class Passkey(DataSource):
  batch_size: int = 8
  eval_batch_size: int | None = 8
  context_length: int = setting(4096, POSITIVE)  # C, tokens the model sees (block_size)
  distance: int = setting(2048, POSITIVE)       # least tokens from the key to the question
  spread: int = setting(0, NONNEG)              # d uniform in [distance, distance + spread]
  digits: int = setting(4, POSITIVE)            # D, key digits (the answer's tokens)
  n: int = setting(100_000, POSITIVE)           # training documents
  n_eval: int = setting(256, POSITIVE)
  max_bytes: int = setting(2_000_000, POSITIVE)  # stdlib bytes read (the `text` source's cap)
  val_frac: float = setting(0.1, OPEN_UNIT)      # files held out for the eval documents' filler
  data_seed: int = setting(0, NONNEG)            # train draw; eval uses data_seed + 1

  def __post_init__(self):
    super().__post_init__()
    least = min_distance(self.digits)
    if self.distance < least:
      raise ConfigError(f"data.distance: the key, '. ' and the question take {least} tokens "
                        f"before the answer with digits={self.digits}; expected >= {least}, got "
                        f"{self.distance}")

  def build(self) -> Source:
    doc = document_length(self.distance + self.spread, self.digits)
    splits = {}
    for name, corpus_L, seed in zip(("train", "eval"), stdlib_corpus(self.max_bytes, self.val_frac),
                                    (self.data_seed, self.data_seed + 1)):
      for key, what, need in (("distance", "a document", doc),
                              ("context_length", "a row", self.context_length + 1)):
        if need > len(corpus_L):
          raise ConfigError(f"data.{key}: {what} needs {need} tokens of filler text but the "
                            f"{name} split of the stdlib text has {len(corpus_L)} bytes (data."
                            f"max_bytes={self.max_bytes}); shorten it or raise data.max_bytes")
      n = self.n if name == "train" else self.n_eval
      rng = np.random.default_rng(seed)
      end_N = rng.integers(0, len(corpus_L), n)
      d_N = self.distance + rng.integers(0, self.spread + 1, n)
      key_NxD = rng.integers(0, 10, (n, self.digits))
      splits[name] = _split(corpus_L, end_N, d_N, key_NxD, self.context_length)
    tr, ev = splits["train"], splits["eval"]
    info = dict(kind="lm", num_classes=None, vocab_size=vocab_size(self.digits),
                input_shape=(self.context_length,), num_train=tr.num, num_eval=ev.num)
    return Source(tr, ev, info)
