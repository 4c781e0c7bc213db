"""Grouped-query attention (model.n_kv_head): N = H is today's multi-head attention bit for bit,
N < H equals attention over the key/value heads repeated G = H / N times, cached decoding equals
the full forward, and a head count that does not divide is one line (jaxdl.models.attention)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdl import models
from jaxdl.models import attention, decoding
from jaxdl.schema import ConfigError

TINY = dict(vocab_size=32, block_size=16, n_layer=1, d_model=32, n_head=4)
TOK = jax.random.randint(jax.random.key(1), (2, 12), 0, 32)


def _model(**kw):
  return models.build_model(models.gpt_config("", **{**TINY, **kw}))


def _init(m):
  return jax.jit(lambda: m.init(jax.random.key(0), TOK, train=False))()["params"]


def test_equal_heads_is_multi_head_attention_bit_for_bit():
  """N = H: the module computes today's attention exactly: one fused projection c_attn read as
  (B, T, 3, H, K), attention, c_proj (written out below), on each path; the GPT's params keep
  GPT-2's names and shapes, so checkpoints and the GPT-2 import apply."""
  x = jax.random.normal(jax.random.key(2), (2, 8, 32))

  def both(impl):
    mha = attention.MultiHeadAttention(n_head=4, n_kv_head=4, causal=True, impl=impl)
    p = mha.init(jax.random.key(0), x, train=False)["params"]
    qkv = (x @ p["c_attn"]["kernel"] + p["c_attn"]["bias"]).reshape(2, 8, 3, 4, 8)
    out = attention.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2],
                                          causal=True, impl=impl)
    return (mha.apply({"params": p}, x, train=False),
            out.reshape(2, 8, 32) @ p["c_proj"]["kernel"] + p["c_proj"]["bias"])

  paths = jax.jit(lambda: {impl: both(impl) for impl in ("reference", "chunked", "xla")})()
  for impl, (y, y_today) in paths.items():
    np.testing.assert_array_equal(y, y_today, err_msg=impl)
  shapes = jax.eval_shape(lambda: _model(n_kv_head=4).init(jax.random.key(0), TOK, train=False))
  assert jax.tree.map(jnp.shape, shapes) == jax.tree.map(jnp.shape, jax.eval_shape(
      lambda: _model().init(jax.random.key(0), TOK, train=False)))
  assert shapes["params"]["h"]["attn"]["c_attn"]["kernel"].shape == (1, 32, 96)


def test_grouped_equals_repeated_key_value_heads():
  """Every attention path against the multi-head reference on K, V repeated per group (query
  head h reads key/value head h // G), N = 1 and 2 of H = 4, with a padding mask and the
  returned weights."""
  kq, kk, kv = jax.random.split(jax.random.key(3), 3)
  q = jax.random.normal(kq, (2, 8, 4, 8))

  def paths(n_kv):
    k, v = jax.random.normal(kk, (2, 8, n_kv, 8)), jax.random.normal(kv, (2, 8, n_kv, 8))
    rep = lambda a: jnp.repeat(a, 4 // n_kv, axis=2)  # noqa: E731
    pad = jnp.arange(8)[None, None, None, :] < 6  # keys 6, 7 are padding
    out = {impl: attention.dot_product_attention(q, k, v, causal=True, impl=impl)
           for impl in ("reference", "chunked", "xla")}
    out["weights"] = attention.dot_product_attention(q, k, v, causal=True,
                                                     return_weights=True)[1]
    out["masked"] = attention.dot_product_attention(q, k, v, pad, impl="xla")
    ref, w_ref = attention.attention_reference(q, rep(k), rep(v), causal=True)
    return out, dict(reference=ref, chunked=ref, xla=ref, weights=w_ref,
                     masked=attention.attention_reference(q, rep(k), rep(v), pad)[0])

  for n_kv, (out, ref) in jax.jit(lambda: {n: paths(n) for n in (1, 2)})().items():
    for key in out:
      np.testing.assert_allclose(out[key], ref[key], atol=1e-6, err_msg=f"{key}, N={n_kv}")


def _cached_logits(m, p):
  """Logits of TOK by cached decoding: a 6-token prefill, then one token at a time."""
  cache = decoding.init_cache(m, 2, 16)
  assert cache["k"].shape == (1, 2, 16, m.kv_heads, 8)  # (L, B, S, N, K)
  step = jax.jit(lambda p, x, c, pos: m.apply({"params": p}, x, train=False, cache=c, pos=pos))
  logits, cache = step(p, TOK[:, :6], cache, 0)
  parts = [logits]
  for i in range(6, 12):
    logits, cache = step(p, TOK[:, i:i + 1], cache, i)
    parts.append(logits)
  return jnp.concatenate(parts, 1)


def _widen(a_x):
  """(..., (H + 2N) K) -> (..., 3 H K) for H = 4, N = 2, K = 8: each K, V head repeated twice."""
  q, k, v = jnp.split(a_x, [32, 48], axis=-1)
  rep = lambda x: jnp.repeat(x.reshape(*x.shape[:-1], 2, 8), 2, axis=-2).reshape(  # noqa: E731
      *x.shape[:-1], 32)
  return jnp.concatenate([q, rep(k), rep(v)], axis=-1)


def test_gqa_gpt_equals_mha_gpt_with_repeated_kv_weights_and_cached_decoding():
  """A GPT with N = 2 key/value heads equals the N = H GPT whose key and value columns of c_attn
  are the N heads' repeated (1e-6); cached decoding (a cache of N heads) equals the full
  forward."""
  m = _model(n_kv_head=2)
  p = _init(m)
  wide = jax.tree.map(lambda a: a, p)
  wide["h"]["attn"]["c_attn"] = jax.tree.map(_widen, p["h"]["attn"]["c_attn"])
  full = jax.jit(lambda p: m.apply({"params": p}, TOK, train=False))(p)
  np.testing.assert_allclose(full, jax.jit(lambda p: _model().apply(
      {"params": p}, TOK, train=False))(wide), atol=1e-6)
  np.testing.assert_allclose(_cached_logits(m, p), full, atol=1e-5)


def test_bad_n_kv_head_is_one_line_before_compiling():
  with pytest.raises(ConfigError, match=r"^model.n_kv_head: must divide n_head=4 .*got 3$"):
    _model(n_kv_head=3)
  with pytest.raises(ConfigError, match=r"^model.n_kv_head: must be >= 0, got -1$"):
    _model(n_kv_head=-1)
  with pytest.raises(ValueError, match="4 query heads are not a multiple of 3 key/value heads"):
    attention.dot_product_attention(jnp.zeros((1, 2, 4, 8)), jnp.zeros((1, 2, 3, 8)),
                                    jnp.zeros((1, 2, 3, 8)))
