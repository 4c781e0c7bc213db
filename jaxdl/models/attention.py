"""Attention: scaled dot-product (reference, chunked causal, XLA / cuDNN), multi-head.

RoPE lives in `jaxdl.models.rope`.

softmax(Q K^T / sqrt(K) + mask) V; a model may scale by 1 / sqrt(scale_dim) instead (Gemma's
query_pre_attn_scalar) and soft-cap the scaled logits, z <- c tanh(z / c) before the mask (Gemma
2), which only the reference path computes. `attention_reference` is the readable path that
can return the weights; the fast path calls `jax.nn.dot_product_attention` (cuDNN flash
attention on GPU for bf16/fp16 with causal-or-no mask, XLA elsewhere); on CPU causal
self-attention skips the masked blocks (`attention_causal_chunked`). A mask is boolean, True =
attend.

Grouped-query attention (Ainslie et al., 2023): the keys and values have N heads, N dividing
the H query heads, and query head h reads key/value head floor(h / G), G = H / N (N = H:
multi-head, N = 1: multi-query). Every path computes it grouped, Q as B x T x N x G x K, so the
N key/value heads are never repeated; `jax.nn.dot_product_attention` takes N < H as is.

Shapes: B batch, T query length, S key length, C a chunk of queries, D model width, H query
heads, N key/value heads, G = H / N queries per key/value head, K head width (D = H K unless
a model sets head_dim: then the queries are H K wide and W_O maps H K back to D).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxdl.models import lora as lora_lib
from jaxdl.models import ring_attention
from jaxdl.models.layers import RMSNorm
from jaxdl.models.rope import RopeSpec, apply_rope, frequencies_at, rotate

Dtype = Any

# ---------------------------------------------------------------------------------------------
# Attention.

ATTN_IMPLS = ("reference", "chunked", "xla", "cudnn", "auto")


def causal_mask(t: int, s: int | None = None, offset=0, window: int = 0,
                local=None) -> jax.Array:
  """Bool (T, S): query i (at absolute position offset + i) may see key j iff j <= offset + i,
  and with a sliding window W > 0 also offset + i - j < W (the W latest keys, itself included:
  Mistral's window, as transformers masks it). `local`, a traced bool, applies the window only
  where it is true (a layer of a stack whose layers differ: `MultiHeadAttention`)."""
  s = t if s is None else s
  q_Tx1, k_1xS = (offset + jnp.arange(t))[:, None], jnp.arange(s)[None, :]
  if window:
    band = q_Tx1 - k_1xS < window
    if local is not None:
      band = band | ~jnp.asarray(local, bool)
    return (k_1xS <= q_Tx1) & band
  return k_1xS <= q_Tx1


def check_heads(h: int, n: int) -> None:
  if n <= 0 or h % n:
    raise ValueError(f"attention: {h} query heads are not a multiple of {n} key/value heads")


def attention_scores(q_BxTxHxK, k_BxSxNxK) -> jax.Array:
  """Q K^T per query head, BxHxTxS in float32 (unscaled); query head h reads key head h // G."""
  b, t, h, k = q_BxTxHxK.shape
  s, n = k_BxSxNxK.shape[1:3]
  if n == h:
    return jnp.einsum("bthk,bshk->bhts", q_BxTxHxK, k_BxSxNxK, preferred_element_type=jnp.float32)
  check_heads(h, n)
  q_BxTxNxGxK = q_BxTxHxK.reshape(b, t, n, h // n, k)
  s_BxNxGxTxS = jnp.einsum("btngk,bsnk->bngts", q_BxTxNxGxK, k_BxSxNxK,
                           preferred_element_type=jnp.float32)
  return s_BxNxGxTxS.reshape(b, h, t, s)


def weighted_values(w_BxHxTxS, v_BxSxNxK) -> jax.Array:
  """sum_s w[h, t, s] v[s, h // G]: BxTxHxK."""
  b, h, t, s = w_BxHxTxS.shape
  n, k = v_BxSxNxK.shape[2:]
  if n == h:
    return jnp.einsum("bhts,bshk->bthk", w_BxHxTxS, v_BxSxNxK)
  out_BxTxNxGxK = jnp.einsum("bngts,bsnk->btngk", w_BxHxTxS.reshape(b, n, h // n, t, s),
                             v_BxSxNxK)
  return out_BxTxNxGxK.reshape(b, t, h, k)


def max_attention_logit(q_BxTxHxK, k_BxSxNxK, mask=None, *, causal=False,
                        scale=None) -> jax.Array:
  """max over b, h and the allowed (t, s) of q_t . k_s / sqrt(K) (or times `scale`), in
  float32: the largest attention logit, a training-health signal (`jaxdl.train.watch`)."""
  t, s, k = q_BxTxHxK.shape[1], k_BxSxNxK.shape[1], q_BxTxHxK.shape[-1]
  scale = 1.0 / math.sqrt(k) if scale is None else scale
  logits_BxHxTxS = attention_scores(q_BxTxHxK.astype(jnp.float32),
                                    k_BxSxNxK.astype(jnp.float32)) * scale
  allowed = jnp.ones((1, 1, t, s), bool)
  if causal:
    allowed = causal_mask(t, s)[None, None]
  if mask is not None:
    allowed = jnp.logical_and(allowed, mask)
  return jnp.max(jnp.where(allowed, logits_BxHxTxS, -jnp.inf))


def attention_reference(q_BxTxHxK, k_BxSxNxK, v_BxSxNxK, mask=None, *, causal=False,
                        dropout_rate=0.0, dropout_rng=None, scale=None, softcap=0.0):
  """Readable path: returns (out BxTxHxK, weights BxHxTxS); softmax in fp32. `scale` (None:
  1 / sqrt(K)) multiplies Q K^T; softcap c > 0 then maps each logit z to c tanh(z / c)."""
  scale = 1.0 / math.sqrt(q_BxTxHxK.shape[-1]) if scale is None else scale
  logits_BxHxTxS = attention_scores(q_BxTxHxK, k_BxSxNxK) * scale
  if softcap:
    logits_BxHxTxS = softcap * jnp.tanh(logits_BxHxTxS / softcap)
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
  out = weighted_values(w_drop.astype(v_BxSxNxK.dtype), v_BxSxNxK)
  return out, w_BxHxTxS


def attention_causal_chunked(q_BxTxHxK, k_BxTxNxK, v_BxTxNxK, num_chunks: int = 4, scale=None):
  """Causal self-attention that skips the all-masked blocks: query chunk [lo, hi) only reads
  keys [0, hi), so about (n + 1) / 2n of the T x T scores are computed. Per chunk, with S the
  masked scores Q K^T / sqrt(K) and m their row max (held constant: the output does not depend
  on it),
    P = exp(S - m),  O = (P V) / rowsum(P)  (= softmax(S) V; the divide is on C x K, not C x S).
  Exact up to rounding; computed head-major (B x H x T x K, or B x N x G x T x K grouped) so the
  chunks' matmuls need no copies."""
  q, k, v = (jnp.transpose(a, (0, 2, 1, 3)) for a in (q_BxTxHxK, k_BxTxNxK, v_BxTxNxK))
  b, h, t, kk = q.shape
  n = k.shape[1]
  if n == h:
    qk, pv = "bhtk,bhsk->bhts", "bhts,bhsk->bhtk"
  else:  # grouped: query head h = i G + g reads key/value head i
    check_heads(h, n)
    q = q.reshape(b, n, h // n, t, kk)
    qk, pv = "bngtk,bnsk->bngts", "bngts,bnsk->bngtk"
  scale = 1.0 / math.sqrt(kk) if scale is None else scale
  bounds = [round(i * t / num_chunks) for i in range(num_chunks + 1)]
  outs = []
  for lo, hi in zip(bounds[:-1], bounds[1:]):
    if hi == lo:
      continue
    s_xCxS = jnp.einsum(qk, q[..., lo:hi, :], k[:, :, :hi],
                        preferred_element_type=jnp.float32) * scale
    s_xCxS = jnp.where(causal_mask(hi - lo, hi, offset=lo), s_xCxS, jnp.finfo(jnp.float32).min)
    p_xCxS = jnp.exp(s_xCxS - jax.lax.stop_gradient(jnp.max(s_xCxS, axis=-1, keepdims=True)))
    o_xCxK = jnp.einsum(pv, p_xCxS.astype(v.dtype), v[:, :, :hi],
                        preferred_element_type=jnp.float32)
    outs.append((o_xCxK / jnp.sum(p_xCxS, axis=-1, keepdims=True)).astype(v.dtype))
  out_BxHxTxK = jnp.concatenate(outs, axis=-2).reshape(b, h, t, kk)
  return jnp.transpose(out_BxHxTxK, (0, 2, 1, 3))


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


def dot_product_attention(q_BxTxHxK, k_BxSxNxK, v_BxSxNxK, mask=None, *, causal=False,
                          impl: str = "auto", return_weights=False, dropout_rate=0.0,
                          dropout_rng=None, scale=None, softcap=0.0):
  """softmax(Q K^T / sqrt(K)) V. Returns out BxTxHxK, or (out, weights BxHxTxS). The keys and
  values may have fewer heads N than the queries (grouped-query attention, module docstring).
  `scale` replaces 1 / sqrt(K); a softcap c > 0 (c tanh(z / c) on the scaled logits) takes the
  reference path, the only one that computes it.

  impl: 'reference' (einsum + softmax); 'chunked' (causal self-attention skipping masked
  blocks; XLA when there is a mask); 'xla' / 'cudnn' (`jax.nn.dot_product_attention`); or
  'auto': cuDNN on GPU for bf16/fp16 inputs with no explicit mask, 'chunked' on CPU for causal
  self-attention of T >= 128 with no explicit mask (XLA's CPU attention computes every masked
  score), XLA otherwise.
  Returned weights and attention dropout need the reference path.
  """
  chex.assert_rank([q_BxTxHxK, k_BxSxNxK, v_BxSxNxK], 4)
  chex.assert_equal_shape_prefix([k_BxSxNxK, v_BxSxNxK], 3)
  check_heads(q_BxTxHxK.shape[2], k_BxSxNxK.shape[2])
  impl = resolve_impl(impl, dtype=q_BxTxHxK.dtype, causal=causal, has_mask=mask is not None,
                      t=q_BxTxHxK.shape[1], s=k_BxSxNxK.shape[1])
  if (return_weights or impl == "reference" or softcap or
      (dropout_rate > 0.0 and dropout_rng is not None)):
    out, w = attention_reference(q_BxTxHxK, k_BxSxNxK, v_BxSxNxK, mask, causal=causal,
                                 dropout_rate=dropout_rate, dropout_rng=dropout_rng, scale=scale,
                                 softcap=softcap)
    return (out, w) if return_weights else out
  self_causal = causal and mask is None and q_BxTxHxK.shape[1] == k_BxSxNxK.shape[1]
  if impl == "chunked":
    if self_causal:
      return attention_causal_chunked(q_BxTxHxK, k_BxSxNxK, v_BxSxNxK, scale=scale)
    impl = "xla"  # e.g. cached decoding: an explicit mask, nothing to skip
  return jax.nn.dot_product_attention(q_BxTxHxK, k_BxSxNxK, v_BxSxNxK, mask=mask, scale=scale,
                                      is_causal=causal, implementation=impl)


class MultiHeadAttention(nn.Module):
  """Multi-head self- or cross-attention with output projection W_O: `n_head` H query heads and
  `n_kv_head` N key/value heads (N = H: multi-head; N < H: grouped-query attention, module
  docstring; a model's setting of 0 is resolved to H before it gets here, by
  `TransformerModel.kv_heads`).

  Self-attention uses one fused projection `c_attn` (D -> (H + 2 N) K: queries, keys, values;
  3D and the GPT-2 layout when N = H); cross-attention projects queries with `q_proj` and
  keys/values from `context` with `kv_proj`. `c_proj` is W_O. `lora` adds low-rank adapters
  to the sites 'attn/q', 'attn/k', 'attn/v', 'attn/o' it names (`jaxdl.models.lora`).

  `head_dim` K (0: D / H) is the query/key/value head width; `rope_spec` the RoPE frequencies
  (`rope.rope_frequencies`) when `rope`; `qk_norm` RMS-normalizes each query and key head (epsilon
  `qk_epsilon`, a scale of K; `qk_norm_kind` 'rms' or Gemma's 'rms1p') before RoPE. `scale_dim`
  > 0 scales the logits by 1 / sqrt(scale_dim) instead of 1 / sqrt(K); `softcap` c > 0 caps
  them, c tanh(z / c) (`dot_product_attention`).

  `window` W > 0 (causal self-attention only) is a sliding window: query i sees keys
  i - W < j <= i, in the full forward and over a KV cache alike (`causal_mask`). The call's
  `local` (None: the window applies) is a traced bool for a layer of a stack whose layers
  differ (`jaxdl.models.transformer`): the window applies only where it is true, and such a
  layer's RoPE is `local_rope` (None: `rope_spec`) where true and `rope_spec` elsewhere.

  `sequence` (a `ring_attention.SequenceSpec`, set under parallel.sequence > 1): the input is
  in its layout, split over the devices of its axis, and self-attention without a cache runs
  as `ring_attention.sequence_attention` (a ring or all-gathered keys and values), the causal
  mask, the window and the packed documents' `segment_ids` (B, T) applied by original position.

  Call: `y = mha(x, context=None, *, train, mask=None)`; `positions` (B, T) replaces
  pos .. pos + T - 1 as the RoPE positions (packed documents restart theirs). With
  `return_weights=True` or a `cache` it returns `(y, aux)` with
  aux = {'weights': BxHxTxS | None, 'cache': {'k','v'} | None}.
  A cache holds keys/values BxSmaxxNxK; the T new tokens sit at positions pos .. pos + T - 1.
  """

  n_head: int
  n_kv_head: int
  causal: bool = False
  window: int = 0
  qk_norm: bool = False
  qk_norm_kind: str = "rms"
  rope: bool = False
  rope_spec: RopeSpec = RopeSpec()
  local_rope: RopeSpec | None = None
  scale_dim: float = 0.0  # 0: K
  softcap: float = 0.0
  head_dim: int = 0  # K; 0: D / H
  qk_epsilon: float = 1e-6  # the q/k RMSNorms' epsilon
  use_bias: bool = True
  qkv_bias: bool = False
  attn_bias: bool = False  # Q/K/V and W_O biases even with use_bias off (Llama's attention_bias)
  attn_dropout: float = 0.0
  impl: str = "auto"
  kernel_init: Callable = nn.initializers.lecun_normal()
  out_init: Callable = nn.initializers.lecun_normal()
  lora: lora_lib.LoraSpec | None = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  sequence: ring_attention.SequenceSpec | None = None

  @nn.compact
  def __call__(self, x_BxTxD, context=None, *, train: bool, mask=None, cache=None, pos=0,
               positions=None, return_weights=False, local=None, segment_ids=None):
    b, t, d = x_BxTxD.shape
    if d % self.n_head and not self.head_dim:
      raise ValueError(f"{self.name}: width {d} is not divisible by n_head {self.n_head}")
    h, n, k = self.n_head, self.n_kv_head, self.head_dim or d // self.n_head
    check_heads(h, n)
    def dense(features, name, init, bias=self.use_bias or self.attn_bias):
      return nn.Dense(features, use_bias=bias, kernel_init=init, dtype=self.dtype,
                      param_dtype=self.param_dtype, name=name)
    qkv_bias = self.use_bias or self.qkv_bias or self.attn_bias
    def adapter(site, features):
      return lora_lib.adapter(self.lora, site, features, self.dtype, self.param_dtype)
    if context is None:
      qkv = dense((h + 2 * n) * k, "c_attn", self.kernel_init, qkv_bias)(x_BxTxD)
      q, k_, v = jnp.split(qkv, [h * k, (h + n) * k], axis=-1)
      kv_in = x_BxTxD
    else:
      chex.assert_rank(context, 3)
      q = dense(h * k, "q_proj", self.kernel_init, qkv_bias)(x_BxTxD)
      k_, v = jnp.split(dense(2 * n * k, "kv_proj", self.kernel_init, qkv_bias)(context), 2,
                        axis=-1)
      kv_in = context
    def project(out_BxTxHxK):  # W_O (and its adapter) on the heads' outputs
      out_BxTxD = out_BxTxHxK.reshape(b, t, h * k)
      y_BxTxD = dense(d, "c_proj", self.out_init)(out_BxTxD)
      delta = adapter("attn/o", d)
      return y_BxTxD if delta is None else y_BxTxD + delta(out_BxTxD)

    s, src = kv_in.shape[1], {"q": x_BxTxD, "k": kv_in, "v": kv_in}
    qkv = {"q": q, "k": k_, "v": v}
    for part, a in qkv.items():
      delta = adapter("attn/" + part, a.shape[-1])
      if delta is not None:
        qkv[part] = a + delta(src[part])
    q, k_, v = (qkv["q"].reshape(b, t, h, k), qkv["k"].reshape(b, s, n, k),
                qkv["v"].reshape(b, s, n, k))
    if self.qk_norm:
      # Per head, over its K features, before RoPE (Qwen3's q_norm / k_norm).
      plus_one = self.qk_norm_kind == "rms1p"
      q = RMSNorm(self.qk_epsilon, self.dtype, self.param_dtype, plus_one, name="q_norm")(q)
      k_ = RMSNorm(self.qk_epsilon, self.dtype, self.param_dtype, plus_one, name="k_norm")(k_)
    if self.rope:
      positions = pos + jnp.arange(t) if positions is None else positions
      if local is None or self.local_rope in (None, self.rope_spec):
        # Static: every layer alike (local_rope is set only when some layer is windowed).
        spec = self.rope_spec if local is not None else (self.local_rope or self.rope_spec)
        q, k_ = apply_rope(q, positions, spec), apply_rope(k_, positions, spec)
      else:  # this layer's frequencies and scaling, chosen by the traced `local`
        (inv_g, s_g), (inv_l, s_l) = (frequencies_at(r, k, positions)
                                      for r in (self.rope_spec, self.local_rope))
        inv_K2 = jnp.where(local, jnp.asarray(inv_l), jnp.asarray(inv_g))
        cs = jnp.where(local, s_l, s_g)  # the cos/sin scaling
        q, k_ = rotate(q, positions, inv_K2, cs), rotate(k_, positions, inv_K2, cs)

    scale = self.scale_dim ** -0.5 if self.scale_dim else None
    seq = self.sequence
    if seq is not None and cache is None and not self.is_initializing():
      if mask is not None or return_weights or context is not None:
        raise ValueError(f"{self.name}: the sequence split over devices runs causal "
                         "self-attention without an explicit mask or returned weights")
      if self.is_mutable_collection("watch"):  # the probe's T x T logits, in position order
        q_n, k_n = (ring_attention.from_layout(a, seq.size) for a in (q, k_))
        m = causal_mask(t, window=self.window, local=local)[None, None] if self.window else None
        if segment_ids is not None:
          seg = ring_attention.from_layout(segment_ids, seq.size)
          m = jnp.logical_and(True if m is None else m, (seg[:, :, None] == seg[:, None])[:, None])
        self.sow("watch", "attn_max_logit", max_attention_logit(
            q_n, k_n, m, causal=self.causal and not self.window, scale=scale))
      out = ring_attention.sequence_attention(
          q, k_, v, seq, segment_ids=segment_ids, causal=self.causal, window=self.window,
          local=local, scale=scale, softcap=self.softcap)
      return ring_attention.constrain(project(out), seq)
    causal = self.causal
    if self.window and cache is None:
      # The band is an explicit mask (the chunked and cuDNN causal paths know no window).
      band = causal_mask(t, s, window=self.window, local=local)[None, None]
      mask = band if mask is None else jnp.logical_and(mask, band)
      causal = False
    if cache is None and self.is_mutable_collection("watch") and not self.is_initializing():
      # Only the watch probe makes 'watch' mutable, so training never computes the T x S logits
      # (and init, where every collection is mutable, must not make it part of the state).
      self.sow("watch", "attn_max_logit", max_attention_logit(q, k_, mask, causal=causal,
                                                              scale=scale))
    new_cache = None
    if cache is not None:
      # Write the T new keys/values at pos; attend to every cached position <= the query's.
      ck = jax.lax.dynamic_update_slice(cache["k"], k_.astype(cache["k"].dtype), (0, pos, 0, 0))
      cv = jax.lax.dynamic_update_slice(cache["v"], v.astype(cache["v"].dtype), (0, pos, 0, 0))
      new_cache = {"k": ck, "v": cv}
      k_, v = ck.astype(self.dtype), cv.astype(self.dtype)
      m = causal_mask(t, ck.shape[1], offset=pos, window=self.window, local=local)[None, None]
      mask = m if mask is None else jnp.logical_and(mask, m)
      causal = False

    rng = self.make_rng("dropout") if (train and self.attn_dropout > 0.0) else None
    res = dot_product_attention(q, k_, v, mask, causal=causal, impl=self.impl,
                                return_weights=return_weights, dropout_rate=self.attn_dropout,
                                dropout_rng=rng, scale=scale, softcap=self.softcap)
    out, w = res if return_weights else (res, None)
    y_BxTxD = project(out)
    if return_weights or cache is not None:
      return y_BxTxD, {"weights": w, "cache": new_cache}
    return y_BxTxD
