"""Multi-query associative recall (Zoology's MQAR, simplified): a generated test of exact recall
from a context, the task on which attention and a state-space mixer differ.

Shapes: N sequences, P key-value pairs, Q queries, T = 2 P + Q tokens.

  assoc_recall   keys are tokens 0..K-1 (K = `keys`), values K..K+V-1 (V = `values`). A row is
                 P pairs k_1 v_1 ... k_P v_P with P distinct keys and uniform values, then Q
                 queries q_1 .. q_Q, each a key drawn from the row's P keys. The answer to
                 query q_j is the value that followed it among the pairs; it is the next-token
                 target at that query's position: y[t] = v(x[t]) and loss_mask[t] = 1 at the
                 last Q positions, 0 elsewhere (the pairs themselves are unpredictable).
                 Vocabulary K + V.   kind 'lm'
                 With `fused`, each pair is the one token K + V + k V + (v - K), T = P + Q and
                 the vocabulary K + V + K V: recall then takes one attention hop (no binding
                 of a value to the key before it).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxdl.schema import NONNEG, POSITIVE, setting
from jaxdl.data.registry import DataSource, Source, register_source
from jaxdl.data.sources import arrays_source


def assoc_recall(n: int, pairs: int, queries: int, keys: int, values: int,
                 seed: int, fused: bool = False) -> dict[str, np.ndarray]:
  """x, y int32 (n, T) and loss_mask float32 (n, T); T = 2 pairs + queries, or pairs + queries
  when `fused` writes each pair as the one token K + V + k V + (v - K)."""
  rng = np.random.default_rng(seed)
  key_NxP = np.argsort(rng.random((n, keys)), axis=1)[:, :pairs]  # P distinct keys per row
  value_NxP = keys + rng.integers(0, values, (n, pairs))
  pick_NxQ = rng.integers(0, pairs, (n, queries))
  query_NxQ = np.take_along_axis(key_NxP, pick_NxQ, axis=1)
  answer_NxQ = np.take_along_axis(value_NxP, pick_NxQ, axis=1)
  if fused:  # C = P context tokens, one per pair
    context_NxC = keys + values + key_NxP * values + (value_NxP - keys)
  else:      # C = 2 P: key, value, key, value, ...
    context_NxC = np.stack([key_NxP, value_NxP], axis=2).reshape(n, 2 * pairs)
  x_NxT = np.concatenate([context_NxC, query_NxQ], axis=1)
  y_NxT = np.concatenate([np.zeros_like(context_NxC), answer_NxQ], axis=1)
  mask_NxT = np.concatenate([np.zeros(context_NxC.shape), np.ones((n, queries))], axis=1)
  return {"x": x_NxT.astype(np.int32), "y": y_NxT.astype(np.int32),
          "loss_mask": mask_NxT.astype(np.float32)}


@register_source("assoc_recall")
@dataclasses.dataclass(frozen=True)
class AssocRecall(DataSource):
  batch_size: int = 64
  pairs: int = setting(16, POSITIVE)      # P key-value pairs per row
  queries: int = setting(8, POSITIVE)     # Q queries after them
  keys: int = setting(64, POSITIVE)       # K key tokens (>= P)
  values: int = setting(64, POSITIVE)     # V value tokens
  n: int = setting(20_000, POSITIVE)      # training rows
  n_eval: int = setting(1_000, POSITIVE)
  data_seed: int = setting(0, NONNEG)     # train draw; eval uses data_seed + 1
  fused: bool = False                     # each pair one token (k, v): recall in one attention hop

  def __post_init__(self):
    super().__post_init__()
    if self.pairs > self.keys:
      raise ValueError(f"data.pairs: {self.pairs} distinct keys per row need data.keys >= "
                       f"{self.pairs}, got keys={self.keys}")

  def build(self) -> Source:
    draw = lambda n, seed: assoc_recall(n, self.pairs, self.queries, self.keys,  # noqa: E731
                                        self.values, seed, self.fused)
    vocab = self.keys + self.values + (self.keys * self.values if self.fused else 0)
    return arrays_source("lm", draw(self.n, self.data_seed), draw(self.n_eval, self.data_seed + 1),
                         vocab_size=vocab)
