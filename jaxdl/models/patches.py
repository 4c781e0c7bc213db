"""Image patches as tokens, ViT's and DiT's (the stack after them is
`jaxdl.models.transformer`'s).

Shapes: B batch, H, W, C height, width, channels, P patch size, T = H W / P^2 patches, Q = P P C
features of a patch, D model width.

Patch embedding (`patch_embed`): x_BxTxD = patchify(x_BxHxWxC) W + b with W (Q, D), the patches
row-major, each flattened as (P, P, C): a P x P convolution of stride P written as one matmul,
whose layout `unpatchify` inverts.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn


def patchify(x_BxHxWxC, p: int):
  """(B, H, W, C) -> (B, H W / P^2, P P C), patches row-major, each patch (P, P, C) flattened."""
  b, h, w, c = x_BxHxWxC.shape
  x = x_BxHxWxC.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(b, (h // p) * (w // p), p * p * c)


def unpatchify(x_BxTxQ, p: int, h: int, w: int):
  """The inverse of `patchify`: (B, T, P P C) -> (B, H, W, C)."""
  b, _, q = x_BxTxQ.shape
  c = q // (p * p)
  x = x_BxTxQ.reshape(b, h // p, w // p, p, p, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(b, h, w, c)


def patch_embed(model, x_BxHxWxC, p: int, kernel_init: Callable):
  """x_BxTxD = patchify(x) W + b, W (P P C, D) named 'patch_embed' (module docstring); call
  inside the compact method of `model` (a `transformer.TransformerModel`). H and W must be
  multiples of P (the caller says so first)."""
  return nn.Dense(model.d_model, kernel_init=kernel_init, dtype=model.dtype,
                  param_dtype=model.param_dtype, name="patch_embed")(
                      patchify(x_BxHxWxC.astype(model.dtype), p))
