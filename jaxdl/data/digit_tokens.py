"""8x8 digits as token sequences with a class token first: the autoregressive digits' data.

Shapes: N digits, P = 64 pixels.

  digit_tokens   the fixed digits split (1,437 train, 360 test). Pixel p in 0..16 becomes the
                 token q = floor(16 p / 17) in 0..15 (raster order); a digit of class c is the
                 sequence [16 + c, q_0, ..., q_63] (vocabulary 26), x its first 64 tokens and y
                 its last 64, so an lm's cross-entropy is exactly -log p(q | c) / 64 per pixel.
                 kind 'lm'

`dequantize` maps tokens back to pixels at the centre of their bins, for judging samples.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxdl.data.registry import DataSource, Source, register_source
from jaxdl.data.sources import arrays_source, digits_split

LEVELS, CLASSES, PIXELS = 16, 10, 64
VOCAB = LEVELS + CLASSES  # pixel tokens 0..15, then one token per class


def quantize(pixels16):
  """Raw pixels 0..16 -> tokens 0..15."""
  return np.minimum(np.asarray(pixels16) * LEVELS // 17, LEVELS - 1).astype(np.int32)


def dequantize(tokens):
  """Tokens 0..15 -> pixel values at the centre of their bin, in 0..17 (clipped to 16)."""
  return np.clip((np.asarray(tokens) + 0.5) * 17 / LEVELS, 0, 16).astype(np.float32)


def sequences(pixels_Nx8x8, labels_N):
  """(x_NxP, y_NxP): the class token then the first 63 pixel tokens; the 64 pixel tokens."""
  q_NxP = quantize(pixels_Nx8x8).reshape(-1, PIXELS)
  seq = np.concatenate([LEVELS + np.asarray(labels_N)[:, None], q_NxP], axis=1)
  return seq[:, :-1].astype(np.int32), seq[:, 1:].astype(np.int32)


def split_sequences():
  """((train_x, train_y), (test_x, test_y)): `sequences` of the fixed digits split."""
  x_tr, y_tr, x_te, y_te = digits_split()
  return sequences(x_tr, y_tr), sequences(x_te, y_te)


@register_source("digit_tokens")
@dataclasses.dataclass(frozen=True)
class DigitTokens(DataSource):
  batch_size: int = 64

  def build(self) -> Source:
    (x_tr, y_tr), (x_te, y_te) = split_sequences()
    return arrays_source("lm", {"x": x_tr, "y": y_tr}, {"x": x_te, "y": y_te},
                         vocab_size=VOCAB)
