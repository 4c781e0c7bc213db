"""Time- and class-conditioned denoisers for diffusion and flow matching.

Call convention: `model.apply(variables, x_t, t_B, y=y_B, train=bool)` returns an array of x_t's
shape (eps, x0, v or velocity, whatever the task trains). t_B is the model time in [0, 1]
(`path.model_time`), one per sample (B,) as in training, or one time shared by the whole batch,
shape () or (1,), as in sampling: then the time embedding and its MLP run on one row and
broadcast, which is most of a small denoiser's cost at batch 256. t = None means zeros (handy for
`init`). y = None, or the null class K = num_classes, means "no condition" (classifier-free
guidance drops labels to K in training). Layers compute in `dtype` (the precision policy's compute
dtype; the sinusoid features are fp32 before the first Dense), params are `param_dtype`, and the
output is fp32.

- `MLPDenoiser` ('denoiser_mlp'): residual MLP for low-dimensional data (2-D toys); the time
  embedding and the class embedding are added into every block.
- `UNetDenoiser` ('denoiser_unet'): a two-level conv U-Net for small images (8x8 digits), GroupNorm
  residual blocks with the embedding added after the first conv. Accepts (B, H, W, C) or flat
  (B, H*W*C) input and returns the same shape.

Shapes: B batch, D data features, H hidden width, E embedding width, h/w/c image
height/width/channels.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxdl.models import layers, register_model
from jaxdl.schema import NONNEG, POSITIVE, UNIT, each, fail, setting

Dtype = Any


def timestep_embedding(t_B, dim: int, max_period: float = 10000.0, scale: float = 1000.0):
  """Sinusoidal features [cos(s t f_k), sin(s t f_k)], f_k = max_period^(-k/(dim/2)), s = scale.

  t in [0, 1] is scaled by 1000 so that the fastest frequency resolves ~1e-3 changes in t.
  """
  half = dim // 2
  f_K = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
  arg_BxK = scale * t_B.astype(jnp.float32)[:, None] * f_K[None]
  return jnp.concatenate([jnp.cos(arg_BxK), jnp.sin(arg_BxK)], axis=-1)


class CondEmbedding(nn.Module):
  """e = MLP(sinusoid(t)) + Embed(y) with K + 1 rows (row K is the null class)."""

  emb_dim: int = 128
  num_classes: int = 0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, t_B, y_B):
    """t_B: (B,) or (1,); y_B: (B,) or None. Returns (B, E), or (1, E) when both are shared."""
    dense = functools.partial(nn.Dense, self.emb_dim, dtype=self.dtype,
                              param_dtype=self.param_dtype)
    e_BxE = dense()(timestep_embedding(t_B, self.emb_dim))
    e_BxE = dense()(nn.silu(e_BxE))
    if self.num_classes:
      if y_B is None:
        y_B = jnp.full((1,), self.num_classes, jnp.int32)
      e_BxE = e_BxE + nn.Embed(self.num_classes + 1, self.emb_dim, dtype=self.dtype,
                               param_dtype=self.param_dtype)(y_B)
    return e_BxE


def _prepare_t(x, t):
  """t as (B,) per-sample times or (1,) one shared time (broadcast after embedding)."""
  if t is None:
    return jnp.zeros((1,), jnp.float32)
  t = jnp.asarray(t, jnp.float32)
  if t.ndim == 0 or t.shape == (1,):
    return t.reshape(1)
  if t.shape != (x.shape[0],):
    raise ValueError(f"t has shape {t.shape}; expected (), (1,) or ({x.shape[0]},) for a batch of "
                     f"{x.shape[0]}")
  return t


class Denoiser(layers.Model):
  """The settings both denoisers share, and the condition e they add into every block."""

  emb_dim: int = setting(128, POSITIVE)
  num_classes: int = setting(0, NONNEG)  # K; 0: unconditional
  dropout: float = setting(0.0, UNIT)
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @property
  def kw(self) -> dict:
    return dict(dtype=self.dtype, param_dtype=self.param_dtype)

  def condition(self, x, t, y):
    """silu(e(t, y)), (B, E) or (1, E) when shared (`CondEmbedding`)."""
    return nn.silu(CondEmbedding(self.emb_dim, self.num_classes, **self.kw)(_prepare_t(x, t), y))


@register_model("denoiser_mlp")
class MLPDenoiser(Denoiser):
  """h = Dense(x); h += Dense(silu(Dense(silu(LN(h))) + Dense(e))) per block;
  out = Dense(silu(LN(h)))."""

  hidden: int = setting(256, POSITIVE)
  depth: int = setting(4, POSITIVE)

  @nn.compact
  def __call__(self, x, t=None, y=None, *, train: bool):
    kw = self.kw
    x_BxD = x.reshape(x.shape[0], -1).astype(self.dtype)
    e_BxE = self.condition(x, t, y)
    h_BxH = nn.Dense(self.hidden, **kw)(x_BxD)
    for _ in range(self.depth):
      r_BxH = nn.Dense(self.hidden, **kw)(nn.silu(nn.LayerNorm(**kw)(h_BxH)))
      r_BxH = nn.silu(r_BxH + nn.Dense(self.hidden, **kw)(e_BxE))
      if self.dropout > 0:
        r_BxH = nn.Dropout(self.dropout, deterministic=not train)(r_BxH)
      h_BxH = h_BxH + nn.Dense(self.hidden, **kw)(r_BxH)
    out_BxD = nn.Dense(x_BxD.shape[1], **kw)(nn.silu(nn.LayerNorm(**kw)(h_BxH)))
    return out_BxD.astype(jnp.float32).reshape(x.shape)


class ResBlock(nn.Module):
  """GN -> silu -> conv3 -> (+ Dense(e)) -> GN -> silu -> dropout -> conv3, plus a 1x1 skip."""

  channels: int
  dropout: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, h_Bxhxwxc, e_BxE, train: bool):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    groups = min(8, self.channels)
    r = nn.silu(nn.GroupNorm(min(8, h_Bxhxwxc.shape[-1]), **kw)(h_Bxhxwxc))
    r = nn.Conv(self.channels, (3, 3), **kw)(r)
    r = r + nn.Dense(self.channels, **kw)(e_BxE)[:, None, None, :]
    r = nn.silu(nn.GroupNorm(groups, **kw)(r))
    if self.dropout > 0:
      r = nn.Dropout(self.dropout, deterministic=not train)(r)
    r = nn.Conv(self.channels, (3, 3), **kw)(r)
    if h_Bxhxwxc.shape[-1] != self.channels:
      h_Bxhxwxc = nn.Conv(self.channels, (1, 1), **kw)(h_Bxhxwxc)
    return h_Bxhxwxc + r


@register_model("denoiser_unet")
class UNetDenoiser(Denoiser):
  """Two-level U-Net: [res x2 at h x w] -> down x2 -> [res x2] -> mid -> up -> [res x2 with
  skips]."""

  image_shape: tuple[int, ...] = setting((8, 8, 1), each(POSITIVE))
  channels: tuple[int, ...] = setting((32, 64), each(POSITIVE))  # (c0, c1) of the two levels

  def check(self):
    if len(self.channels) != 2:
      fail("model.", "channels", f"one width per level of the two-level U-Net, got "
           f"{self.channels}")

  @nn.compact
  def __call__(self, x, t=None, y=None, *, train: bool):
    kw = self.kw
    x_Bxhxwxc = x.reshape((x.shape[0],) + tuple(self.image_shape)).astype(self.dtype)
    e_BxE = self.condition(x, t, y)
    res = functools.partial(ResBlock, dropout=self.dropout, **kw)
    c0, c1 = self.channels
    h = nn.Conv(c0, (3, 3), **kw)(x_Bxhxwxc)
    skips = [h]
    for _ in range(2):
      h = res(c0)(h, e_BxE, train)
      skips.append(h)
    h = nn.Conv(c1, (3, 3), strides=(2, 2), **kw)(h)  # h x w -> h/2 x w/2
    for _ in range(2):
      h = res(c1)(h, e_BxE, train)
    h = res(c1)(h, e_BxE, train)  # middle
    h = jnp.repeat(jnp.repeat(h, 2, axis=1), 2, axis=2)  # nearest-neighbour upsampling
    h = nn.Conv(c0, (3, 3), **kw)(h)
    for _ in range(3):
      h = res(c0)(jnp.concatenate([h, skips.pop()], axis=-1), e_BxE, train)
    out = nn.Conv(self.image_shape[-1], (3, 3), **kw)(nn.silu(nn.GroupNorm(min(8, c0), **kw)(h)))
    return out.astype(jnp.float32).reshape(x.shape)
