"""Diffusion transformer (DiT, Peebles & Xie 2023): a denoiser on image patches with adaLN-Zero.

Call convention: the denoisers' (`jaxdl.models.denoiser`): `model.apply(variables, x_t, t_B,
y=y_B, train=bool)` returns x_t's shape, (B, H, W, C) or flat (B, H W C) with `image_shape`;
t_B per sample (B,) or shared (), (1,); y = None or the null class K means "no condition".

  c = silu(e(t, y))            e: `CondEmbedding` (time MLP + class table with K + 1 rows)
  x = PatchEmbed(x_t) + pos    P x P patches -> T = H W / P^2 tokens of width D
  per block (L of them), shifts a, scales b, gates g: (a_1, b_1, g_1, a_2, b_2, g_2) = Dense_6D(c),
    x <- x + g_1 * Attn(LN(x) (1 + b_1) + a_1)
    x <- x + g_2 * MLP(LN(x) (1 + b_2) + a_2)
  out = Unpatchify(Dense_{P^2 C}(LN(x) (1 + b) + a)),  (a, b) = Dense_2D(c)

LN has no affine parameters (the modulation is its affine map). adaLN-Zero: every Dense that
makes a modulation (Dense_6D, Dense_2D) and the output Dense_{P^2 C} start at zero, so at
initialization every gate g is 0, every block is exactly the identity on the token stream, and
the output is exactly 0 whatever x, t and y. Attention and MLP are the shared
`attention.MultiHeadAttention` (non-causal) and `transformer.MlpBlock`, configured by the
`TransformerModel` settings through a `BlockSpec`, the patch embedding and the stack of L blocks
(scanned or unrolled, remat) the shared `patches.patch_embed` and `stack.stack_blocks`;
the position embedding is the paper's fixed 2-D sin-cos.

Shapes: B batch, H/W/C image height/width/channels, P patch size, T tokens, Q = P P C features
of a patch, D model width, E condition width (`emb_dim`), L layers, N = T grid cells.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jaxdl.models import attention, register_model
from jaxdl.models.denoiser import Denoiser
from jaxdl.models.patches import patch_embed, unpatchify
from jaxdl.models.stack import stack_blocks
from jaxdl.models.transformer import BlockSpec, MlpBlock, TransformerModel
from jaxdl.schema import POSITIVE, each, fail, setting

_ZEROS = nn.initializers.zeros


def sincos_2d(gh: int, gw: int, d: int) -> np.ndarray:
  """(gh gw, d): row-major grid cell (i, j) -> [s(i), s(j)], s(p) = [sin(p w_k), cos(p w_k)],
  w_k = 10000^(-k / (d/4)), k < d/4 (the fixed position embedding of MAE and DiT)."""
  w_K = 1.0 / 10000.0 ** (np.arange(d // 4, dtype=np.float64) / (d // 4))
  i_N, j_N = (a.reshape(-1) for a in np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij"))

  def s(p_N):
    return np.concatenate([np.sin(np.outer(p_N, w_K)), np.cos(np.outer(p_N, w_K))], axis=1)

  return np.concatenate([s(i_N), s(j_N)], axis=1).astype(np.float32)


def modulate(x_BxTxD, shift_BxD, scale_BxD):
  """x (1 + scale) + shift, the condition broadcast over the T tokens."""
  return x_BxTxD * (1 + scale_BxD[:, None]) + shift_BxD[:, None]


def plain_norm(cfg: BlockSpec, name: str):
  """The block's norm ('layer' or 'rms') without its own scale and bias."""
  cls = nn.LayerNorm if cfg.norm == "layer" else nn.RMSNorm
  extra = dict(use_bias=False) if cfg.norm == "layer" else {}
  return cls(epsilon=cfg.epsilon, use_scale=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
             name=name, **extra)


class DiTBlock(nn.Module):
  """x <- x + g_1 Attn(mod(LN x)); x <- x + g_2 MLP(mod(LN x)); `__call__(x, c) -> (x, None)`
  (`stack.stack_blocks`' block). Dropout (`cfg.dropout`) and stochastic depth
  (`cfg.drop_path`) act on each gated branch as in `transformer.Block`."""

  cfg: BlockSpec
  train: bool = False

  @nn.compact
  def __call__(self, x_BxTxD, c_BxE):
    cfg, train, d = self.cfg, self.train, x_BxTxD.shape[-1]
    mod_Bx6D = nn.Dense(6 * d, kernel_init=_ZEROS, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                        name="adaLN")(c_BxE)
    a1, b1, g1, a2, b2, g2 = jnp.split(mod_Bx6D, 6, axis=-1)
    drop = nn.Dropout(cfg.dropout, deterministic=not train)
    if cfg.drop_path > 0:  # one keep/drop draw per example, broadcast over (T, D)
      path = nn.Dropout(cfg.drop_path, broadcast_dims=(1, 2), deterministic=not train,
                        name="drop_path")
      drop = lambda h, drop=drop: path(drop(h))  # noqa: E731
    attn = attention.MultiHeadAttention(
        n_head=cfg.n_head, n_kv_head=cfg.n_kv_head, head_dim=cfg.head_dim, causal=False,
        qk_norm=cfg.qk_norm,
        use_bias=cfg.use_bias, attn_dropout=cfg.attn_dropout, impl=cfg.attn_impl,
        kernel_init=cfg.kernel_init, out_init=cfg.out_init, dtype=cfg.dtype,
        param_dtype=cfg.param_dtype, name="attn")
    h_BxTxD = modulate(plain_norm(cfg, "ln_1")(x_BxTxD), a1, b1)
    x_BxTxD = x_BxTxD + g1[:, None] * drop(attn(h_BxTxD, train=train))
    h_BxTxD = modulate(plain_norm(cfg, "ln_2")(x_BxTxD), a2, b2)
    x_BxTxD = x_BxTxD + g2[:, None] * drop(MlpBlock(cfg, name="mlp")(h_BxTxD))
    return x_BxTxD, None


@register_model("denoiser_dit")
class DiTDenoiser(TransformerModel, Denoiser):
  """DiT with adaLN-Zero (module docstring). The block settings are `TransformerModel`'s (width,
  heads, MLP, norm, attention path, scan / remat), the condition's `Denoiser`'s (emb_dim,
  num_classes); DiT's defaults for some of them below."""

  causal: ClassVar[bool] = False
  patch_size: int = setting(2, POSITIVE)
  image_shape: tuple[int, ...] = setting((8, 8, 1), each(POSITIVE))
  n_layer: int = 4
  d_model: int = 64
  emb_dim: int = 64
  init_name: str = "xavier_uniform"
  epsilon: float = 1e-6

  def check(self):
    super().check()
    if self.ln != "pre":
      fail("model.", "ln", f"DiT's blocks are pre-norm (adaLN modulates the normalized input), "
           f"got {self.ln!r}")
    if self.d_model % 4:
      fail("model.", "d_model", f"must be divisible by 4 (the 2-D sin-cos position embedding), "
           f"got {self.d_model}")
    if len(self.image_shape) != 3 or any(s % self.patch_size for s in self.image_shape[:2]):
      fail("model.", "patch_size", f"must divide the height and width of image_shape (H, W, C)="
           f"{tuple(self.image_shape)}, got {self.patch_size}")

  @nn.compact
  def __call__(self, x, t=None, y=None, *, train: bool):
    cfg, kw, p, d = self.block_spec, self.kw, self.patch_size, self.d_model
    h, w, ch = self.image_shape
    if x.size != x.shape[0] * h * w * ch:
      raise ValueError(f"DiT: input {x.shape} is not a batch of image_shape {(h, w, ch)} images "
                       "(as (B, H, W, C) or flat (B, H W C))")
    x_BxHxWxC = x.reshape(x.shape[0], h, w, ch)
    c_BxE = self.condition(x, t, y)
    x_BxTxD = patch_embed(self, x_BxHxWxC, p, cfg.kernel_init)
    x_BxTxD = x_BxTxD + jnp.asarray(sincos_2d(h // p, w // p, d), self.dtype)
    x_BxTxD = nn.Dropout(self.dropout, deterministic=not train)(x_BxTxD)
    x_BxTxD, _ = stack_blocks(self, DiTBlock, x_BxTxD, c_BxE, train=train, layer_axes=(None,))
    a_BxD, b_BxD = jnp.split(nn.Dense(2 * d, kernel_init=_ZEROS, name="final_adaLN", **kw)(c_BxE),
                             2, axis=-1)
    x_BxTxD = modulate(plain_norm(cfg, "ln_f")(x_BxTxD), a_BxD, b_BxD)
    out_BxTxQ = nn.Dense(p * p * ch, kernel_init=_ZEROS, name="final", **kw)(x_BxTxD)
    return unpatchify(out_BxTxQ, p, h, w).astype(jnp.float32).reshape(x.shape)
