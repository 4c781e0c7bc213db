"""Generated sequence-to-sequence tasks on digit strings (the seq2seq model's data).

Shapes: N examples, S = T string length, L = 2 S input tokens.

  digit_strings   uniform random strings of `length` digits 0..9; the target is the string
                  reversed (op 'reverse') or sorted (op 'sort'). Each row x (L,) is the source,
                  the start token 10, then the target without its last digit (the decoder's
                  teacher-forced input); y (T,) is the target. Vocabulary 11.   kind 'lm'
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxdl.schema import NONNEG, POSITIVE, one_of, setting
from jaxdl.data.registry import DataSource, Source, register_source
from jaxdl.data.sources import arrays_source

START = 10  # the decoder's first input token


def digit_strings(n: int, length: int, op: str, seed: int) -> dict[str, np.ndarray]:
  """x (n, 2 length) = [source, START, target[:-1]], y (n, length) = target, both int32."""
  src_NxS = np.random.default_rng(seed).integers(0, 10, (n, length))
  tgt_NxS = src_NxS[:, ::-1] if op == "reverse" else np.sort(src_NxS, axis=1)
  start_Nx1 = np.full((n, 1), START)
  x_NxL = np.concatenate([src_NxS, start_Nx1, tgt_NxS[:, :-1]], axis=1)
  return {"x": x_NxL.astype(np.int32), "y": tgt_NxS.astype(np.int32)}


@register_source("digit_strings")
@dataclasses.dataclass(frozen=True)
class DigitStrings(DataSource):
  batch_size: int = 64
  length: int = setting(8, POSITIVE)                  # S digits per string
  op: str = setting("reverse", one_of("reverse", "sort"))
  n: int = setting(10_000, POSITIVE)                  # training strings
  n_eval: int = setting(1_000, POSITIVE)
  data_seed: int = setting(0, NONNEG)                 # train draw; eval uses data_seed + 1

  def build(self) -> Source:
    train = digit_strings(self.n, self.length, self.op, self.data_seed)
    eval_ = digit_strings(self.n_eval, self.length, self.op, self.data_seed + 1)
    return arrays_source("lm", train, eval_, vocab_size=START + 1)
