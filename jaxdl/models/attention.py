"""Attention: scaled dot-product (reference, chunked causal, XLA / cuDNN), RoPE, multi-head.

softmax(Q K^T / sqrt(K) + mask) V. `attention_reference` is the readable path that can return the
weights; the fast path calls `jax.nn.dot_product_attention` (cuDNN flash attention on GPU for
bf16/fp16 with causal-or-no mask, XLA elsewhere); on CPU causal self-attention skips the masked
blocks (`attention_causal_chunked`). A mask is boolean, True = attend.

Shapes: B batch, T query length, S key length, C a chunk of queries, D model width, H heads,
K head width (D = H K).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxdl.models.layers import RMSNorm

Dtype = Any

# ---------------------------------------------------------------------------------------------
# Attention.

ATTN_IMPLS = ("reference", "chunked", "xla", "cudnn", "auto")


def causal_mask(t: int, s: int | None = None, offset=0) -> jax.Array:
  """Bool (T, S): query i (at absolute position offset + i) may see key j iff j <= offset + i."""
  s = t if s is None else s
  return jnp.arange(s)[None, :] <= (offset + jnp.arange(t))[:, None]


def max_attention_logit(q_BxTxHxK, k_BxSxHxK, mask=None, *, causal=False) -> jax.Array:
  """max over b, h and the allowed (t, s) of q_t . k_s / sqrt(K), in float32: the largest
  attention logit, a training-health signal (`jaxdl.train.watch`)."""
  t, s, k = q_BxTxHxK.shape[1], k_BxSxHxK.shape[1], q_BxTxHxK.shape[-1]
  logits_BxHxTxS = jnp.einsum("bthk,bshk->bhts", q_BxTxHxK.astype(jnp.float32),
                              k_BxSxHxK.astype(jnp.float32)) / jnp.sqrt(jnp.float32(k))
  allowed = jnp.ones((1, 1, t, s), bool)
  if causal:
    allowed = causal_mask(t, s)[None, None]
  if mask is not None:
    allowed = jnp.logical_and(allowed, mask)
  return jnp.max(jnp.where(allowed, logits_BxHxTxS, -jnp.inf))


def attention_reference(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask=None, *, causal=False,
                        dropout_rate=0.0, dropout_rng=None):
  """Readable path: returns (out BxTxHxK, weights BxHxTxS); softmax in fp32."""
  scale = 1.0 / math.sqrt(q_BxTxHxK.shape[-1])
  logits_BxHxTxS = jnp.einsum("bthk,bshk->bhts", q_BxTxHxK, k_BxSxHxK,
                              preferred_element_type=jnp.float32) * scale
  t, s = logits_BxHxTxS.shape[-2:]
  if causal:
    mask = causal_mask(t, s) if mask is None else jnp.logical_and(mask, causal_mask(t, s))
  if mask is not None:
    logits_BxHxTxS = jnp.where(mask, logits_BxHxTxS, jnp.finfo(jnp.float32).min)
  w_BxHxTxS = jax.nn.softmax(logits_BxHxTxS, axis=-1)
  w_drop = w_BxHxTxS
  if dropout_rate > 0.0 and dropout_rng is not None:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, w_BxHxTxS.shape)
    w_drop = jnp.where(keep, w_BxHxTxS / (1.0 - dropout_rate), 0.0)
  out = jnp.einsum("bhts,bshk->bthk", w_drop.astype(v_BxSxHxK.dtype), v_BxSxHxK)
  return out, w_BxHxTxS


def attention_causal_chunked(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, num_chunks: int = 4):
  """Causal self-attention that skips the all-masked blocks: query chunk [lo, hi) only reads
  keys [0, hi), so about (n + 1) / 2n of the T x T scores are computed. Per chunk, with S the
  masked scores Q K^T / sqrt(K) and m their row max (held constant: the output does not depend
  on it),
    P = exp(S - m),  O = (P V) / rowsum(P)  (= softmax(S) V; the divide is on C x K, not C x S).
  Exact up to rounding; computed head-major (B x H x T x K) so the chunks' matmuls need no
  copies."""
  q, k, v = (jnp.transpose(a, (0, 2, 1, 3)) for a in (q_BxTxHxK, k_BxTxHxK, v_BxTxHxK))
  t = q.shape[2]
  scale = 1.0 / math.sqrt(q.shape[-1])
  bounds = [round(i * t / num_chunks) for i in range(num_chunks + 1)]
  outs = []
  for lo, hi in zip(bounds[:-1], bounds[1:]):
    if hi == lo:
      continue
    s_BxHxCxS = jnp.einsum("bhtk,bhsk->bhts", q[:, :, lo:hi], k[:, :, :hi],
                           preferred_element_type=jnp.float32) * scale
    s_BxHxCxS = jnp.where(causal_mask(hi - lo, hi, offset=lo), s_BxHxCxS,
                          jnp.finfo(jnp.float32).min)
    p_BxHxCxS = jnp.exp(s_BxHxCxS - jax.lax.stop_gradient(
        jnp.max(s_BxHxCxS, axis=-1, keepdims=True)))
    o_BxHxCxK = jnp.einsum("bhts,bhsk->bhtk", p_BxHxCxS.astype(v.dtype), v[:, :, :hi],
                           preferred_element_type=jnp.float32)
    outs.append((o_BxHxCxK / jnp.sum(p_BxHxCxS, axis=-1, keepdims=True)).astype(v.dtype))
  return jnp.transpose(jnp.concatenate(outs, axis=2), (0, 2, 1, 3))


def resolve_impl(impl: str, *, dtype, causal: bool, has_mask: bool, t: int, s: int) -> str:
  """The attention path 'auto' stands for (see `dot_product_attention`); others pass through."""
  if impl not in ATTN_IMPLS:
    raise ValueError(f"attn_impl: unknown {impl!r}; expected one of {list(ATTN_IMPLS)}")
  if impl != "auto":
    return impl
  backend = jax.default_backend()
  if backend == "gpu" and dtype in (jnp.bfloat16, jnp.float16) and not has_mask:
    return "cudnn"
  if backend == "cpu" and causal and not has_mask and t == s and t >= 128:
    return "chunked"
  return "xla"


def dot_product_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask=None, *, causal=False,
                          impl: str = "auto", return_weights=False, dropout_rate=0.0,
                          dropout_rng=None):
  """softmax(Q K^T / sqrt(K)) V. Returns out BxTxHxK, or (out, weights BxHxTxS).

  impl: 'reference' (einsum + softmax); 'chunked' (causal self-attention skipping masked
  blocks; XLA when there is a mask); 'xla' / 'cudnn' (`jax.nn.dot_product_attention`); or
  'auto': cuDNN on GPU for bf16/fp16 inputs with no explicit mask, 'chunked' on CPU for causal
  self-attention of T >= 128 with no explicit mask (XLA's CPU attention computes every masked
  score), XLA otherwise.
  Returned weights and attention dropout need the reference path.
  """
  chex.assert_rank([q_BxTxHxK, k_BxSxHxK, v_BxSxHxK], 4)
  chex.assert_equal_shape_prefix([k_BxSxHxK, v_BxSxHxK], 3)
  impl = resolve_impl(impl, dtype=q_BxTxHxK.dtype, causal=causal, has_mask=mask is not None,
                      t=q_BxTxHxK.shape[1], s=k_BxSxHxK.shape[1])
  if return_weights or impl == "reference" or (dropout_rate > 0.0 and dropout_rng is not None):
    out, w = attention_reference(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask, causal=causal,
                                 dropout_rate=dropout_rate, dropout_rng=dropout_rng)
    return (out, w) if return_weights else out
  self_causal = causal and mask is None and q_BxTxHxK.shape[1] == k_BxSxHxK.shape[1]
  if impl == "chunked":
    if self_causal:
      return attention_causal_chunked(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK)
    impl = "xla"  # e.g. cached decoding: an explicit mask, nothing to skip
  return jax.nn.dot_product_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mask=mask,
                                      is_causal=causal, implementation=impl)


def apply_rope(x_BxTxHxK, positions_T, base: float = 10000.0):
  """Rotary position embedding: rotates feature pairs (i, i + K/2) by angle pos * base^(-2i/K).

  `positions_T` is (T,) shared by the batch, or (B, T) per row (packed documents)."""
  k = x_BxTxHxK.shape[-1]
  if k % 2:
    raise ValueError(f"rope needs an even head width, got {k}")
  inv_freq = base ** (-jnp.arange(0, k // 2, dtype=jnp.float32) * 2.0 / k)
  ang_TxK2 = positions_T.astype(jnp.float32)[..., None] * inv_freq
  # (..., T, 1, K/2): broadcasts over the heads, and over the batch when positions are (T,).
  cos, sin = jnp.cos(ang_TxK2)[..., None, :], jnp.sin(ang_TxK2)[..., None, :]
  x1, x2 = jnp.split(x_BxTxHxK.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxHxK.dtype)


class MultiHeadAttention(nn.Module):
  """Multi-head self- or cross-attention with output projection W_O.

  Self-attention uses one fused projection `c_attn` (D -> 3D, the GPT-2 layout); cross-attention
  projects queries with `q_proj` and keys/values from `context` with `kv_proj`. `c_proj` is W_O.

  Call: `y = mha(x, context=None, *, train, mask=None)`; `positions` (B, T) replaces
  pos .. pos + T - 1 as the RoPE positions (packed documents restart theirs). With
  `return_weights=True` or a `cache` it returns `(y, aux)` with
  aux = {'weights': BxHxTxS | None, 'cache': {'k','v'} | None}.
  A cache holds keys/values BxSmaxxHxK; the T new tokens sit at positions pos .. pos + T - 1.
  """

  num_heads: int
  causal: bool = False
  qk_norm: bool = False
  rope: bool = False
  use_bias: bool = True
  attn_dropout: float = 0.0
  impl: str = "auto"
  kernel_init: Callable = nn.initializers.lecun_normal()
  out_init: Callable = nn.initializers.lecun_normal()
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxTxD, context=None, *, train: bool, mask=None, cache=None, pos=0,
               positions=None, return_weights=False):
    b, t, d = x_BxTxD.shape
    if d % self.num_heads:
      raise ValueError(f"{self.name}: width {d} is not divisible by num_heads {self.num_heads}")
    h, k = self.num_heads, d // self.num_heads
    def dense(n, name, init):
      return nn.Dense(n, use_bias=self.use_bias, kernel_init=init, dtype=self.dtype,
                      param_dtype=self.param_dtype, name=name)
    if context is None:
      qkv = dense(3 * d, "c_attn", self.kernel_init)(x_BxTxD).reshape(b, t, 3, h, k)
      q, k_, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    else:
      chex.assert_rank(context, 3)
      q = dense(d, "q_proj", self.kernel_init)(x_BxTxD).reshape(b, t, h, k)
      kv = dense(2 * d, "kv_proj", self.kernel_init)(context)
      k_, v = kv.reshape(b, context.shape[1], 2, h, k)[:, :, 0], kv.reshape(
          b, context.shape[1], 2, h, k)[:, :, 1]
    if self.qk_norm:
      q = RMSNorm(dtype=self.dtype, param_dtype=self.param_dtype, name="q_norm")(q)
      k_ = RMSNorm(dtype=self.dtype, param_dtype=self.param_dtype, name="k_norm")(k_)
    if self.rope:
      positions = pos + jnp.arange(t) if positions is None else positions
      q, k_ = apply_rope(q, positions), apply_rope(k_, positions)

    if cache is None and self.is_mutable_collection("watch") and not self.is_initializing():
      # Only the watch probe makes 'watch' mutable, so training never computes the T x S logits
      # (and init, where every collection is mutable, must not make it part of the state).
      self.sow("watch", "attn_max_logit", max_attention_logit(q, k_, mask, causal=self.causal))
    causal = self.causal
    new_cache = None
    if cache is not None:
      # Write the T new keys/values at pos; attend to every cached position <= the query's.
      ck = jax.lax.dynamic_update_slice(cache["k"], k_.astype(cache["k"].dtype), (0, pos, 0, 0))
      cv = jax.lax.dynamic_update_slice(cache["v"], v.astype(cache["v"].dtype), (0, pos, 0, 0))
      new_cache = {"k": ck, "v": cv}
      k_, v = ck.astype(self.dtype), cv.astype(self.dtype)
      m = causal_mask(t, ck.shape[1], offset=pos)[None, None]
      mask = m if mask is None else jnp.logical_and(mask, m)
      causal = False

    rng = self.make_rng("dropout") if (train and self.attn_dropout > 0.0) else None
    res = dot_product_attention(q, k_, v, mask, causal=causal, impl=self.impl,
                                return_weights=return_weights, dropout_rate=self.attn_dropout,
                                dropout_rng=rng)
    out, w = res if return_weights else (res, None)
    y_BxTxD = dense(d, "c_proj", self.out_init)(out.reshape(b, t, d))
    if return_weights or cache is not None:
      return y_BxTxD, {"weights": w, "cache": new_cache}
    return y_BxTxD
