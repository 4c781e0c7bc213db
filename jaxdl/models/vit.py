"""Vision transformer: P x P patches, a class token or mean pooling, the GPT block, non-causal.

The patch embedding is `jaxdl.models.patches`' (`patch_embed`, shared with DiT: its kernel is
(P P C, D), one matmul over the flattened patches), the stack `jaxdl.models.transformer`'s
(`apply_blocks`).

Shapes: B batch, H height, W width, C channels, P patch size, T = H W / P^2 tokens (+1 with the
class token), D model width, K classes.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp

from jaxdl.models import layers, register_model
from jaxdl.models.cnn import as_image
from jaxdl.models.patches import patch_embed
from jaxdl.models.stack import apply_blocks
from jaxdl.models.transformer import TransformerModel
from jaxdl.schema import POSITIVE, each, one_of, setting


@register_model("vit")
class ViT(TransformerModel):
  """Patch embedding (a P x P conv with stride P, as one matmul) + position embedding + L
  encoder blocks (the block settings are `TransformerModel`'s; ViT's own defaults for some of
  them below)."""

  causal: ClassVar[bool] = False
  patch_size: int = setting(2, POSITIVE)
  out: int = setting(10, POSITIVE)
  pool: str = setting("cls", one_of("cls", "mean"))
  image_shape: tuple[int, ...] | None = setting(None, each(POSITIVE))
  d_model: int = 64
  init_name: str = "xavier_uniform"
  epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x, *, train: bool):
    x_BxHxWxC = as_image(x, self.image_shape, "ViT").astype(self.dtype)
    b, h, w, c = x_BxHxWxC.shape
    p = self.patch_size
    if h % p or w % p:
      raise ValueError(f"ViT: image {h}x{w} is not divisible into {p}x{p} patches")
    conv_init, kernel_shape = layers.get_initializer(self.init_name), (p, p, c, self.d_model)
    # Drawn as the P x P convolution's (P, P, C, D) kernel, whose fans (P P C in, P P D out) the
    # ViT's results were measured with, then flattened to the matmul's (P P C, D): same values.
    x_BxTxD = patch_embed(self, x_BxHxWxC, p, lambda key, shape, dtype: conv_init(
        key, kernel_shape, dtype).reshape(shape))
    if self.pool == "cls":
      cls = self.param("cls", nn.initializers.zeros, (1, 1, self.d_model), self.param_dtype)
      x_BxTxD = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, self.d_model)).astype(self.dtype),
                                 x_BxTxD], axis=1)
    pos = self.param("pos_embed", nn.initializers.normal(0.02), (1,) + x_BxTxD.shape[1:],
                     self.param_dtype)
    x_BxTxD = nn.Dropout(self.dropout, deterministic=not train)(x_BxTxD + pos.astype(self.dtype))
    x_BxTxD, _ = apply_blocks(self, x_BxTxD, train=train)
    h_BxD = x_BxTxD[:, 0] if self.pool == "cls" else jnp.mean(x_BxTxD, axis=1)
    return nn.Dense(self.out, dtype=self.dtype, param_dtype=self.param_dtype, name="head")(
        h_BxD).astype(jnp.float32)
