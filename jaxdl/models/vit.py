"""Vision transformer: P x P patches, a class token or mean pooling, the GPT block, non-causal.

Shapes: B batch, H height, W width, C channels, P patch size, T = H W / P^2 tokens (+1 with the
class token), D model width, K classes.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp

from jaxdl.models import layers, register_model
from jaxdl.models.cnn import as_image
from jaxdl.models.transformer import apply_blocks

Dtype = Any


@register_model("vit")
class ViT(nn.Module):
  """Patch embedding (a P x P conv with stride P) + position embedding + L encoder blocks."""

  patch_size: int = 2
  d_model: int = 64
  n_layer: int = 4
  n_head: int = 4
  out: int = 10
  pool: str = "cls"
  mlp: str = "gelu"
  mlp_hidden: int = 0
  norm: str = "layer"
  ln: str = "pre"
  dropout: float = 0.0
  attn_dropout: float = 0.0
  drop_path: float = 0.0   # stochastic depth: each block's residual branch dropped per example
  qk_norm: bool = False
  use_bias: bool = True
  scan_layers: bool = True
  remat: bool = False
  attn_impl: str = "auto"
  init_name: str = "xavier_uniform"
  epsilon: float = 1e-6
  image_shape: Sequence[int] | None = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def __post_init__(self):
    layers.check_fields(self, sizes=("patch_size", "d_model", "n_layer", "n_head", "out"),
                        dropouts=("dropout", "attn_dropout", "drop_path"))
    super().__post_init__()

  @nn.compact
  def __call__(self, x, *, train: bool):
    x_BxHxWxC = as_image(x, self.image_shape, "ViT").astype(self.dtype)
    b, h, w, _ = x_BxHxWxC.shape
    p = self.patch_size
    if h % p or w % p:
      raise ValueError(f"ViT: image {h}x{w} is not divisible into {p}x{p} patches")
    if self.pool not in ("cls", "mean"):
      raise ValueError(f"pool: unknown {self.pool!r}; expected one of ['cls', 'mean']")
    x_BxTxD = nn.Conv(self.d_model, (p, p), strides=(p, p), padding="VALID",
                      kernel_init=layers.get_initializer(self.init_name), dtype=self.dtype,
                      param_dtype=self.param_dtype, name="patch_embed")(x_BxHxWxC)
    x_BxTxD = x_BxTxD.reshape(b, (h // p) * (w // p), self.d_model)
    if self.pool == "cls":
      cls = self.param("cls", nn.initializers.zeros, (1, 1, self.d_model), self.param_dtype)
      x_BxTxD = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, self.d_model)).astype(self.dtype),
                                 x_BxTxD], axis=1)
    pos = self.param("pos_embed", nn.initializers.normal(0.02), (1,) + x_BxTxD.shape[1:],
                     self.param_dtype)
    x_BxTxD = nn.Dropout(self.dropout, deterministic=not train)(x_BxTxD + pos.astype(self.dtype))
    x_BxTxD, _ = apply_blocks(
        x_BxTxD, n_layer=self.n_layer, scan_layers=self.scan_layers, remat=self.remat,
        n_head=self.n_head, causal=False, train=train, norm=self.norm, ln=self.ln, mlp=self.mlp,
        mlp_hidden=self.mlp_hidden, dropout=self.dropout, attn_dropout=self.attn_dropout,
        drop_path=self.drop_path,
        qk_norm=self.qk_norm, use_bias=self.use_bias, attn_impl=self.attn_impl,
        init_name=self.init_name, n_residual=2 * self.n_layer, epsilon=self.epsilon,
        dtype=self.dtype, param_dtype=self.param_dtype)
    if self.ln == "pre":
      x_BxTxD = layers.make_norm(self.norm, train=train, name="ln_f", epsilon=self.epsilon,
                                 dtype=self.dtype, param_dtype=self.param_dtype)(x_BxTxD)
    h_BxD = x_BxTxD[:, 0] if self.pool == "cls" else jnp.mean(x_BxTxD, axis=1)
    return nn.Dense(self.out, dtype=self.dtype, param_dtype=self.param_dtype, name="head")(
        h_BxD).astype(jnp.float32)
