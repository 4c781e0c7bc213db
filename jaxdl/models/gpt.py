"""Decoder-only transformer (GPT) with a KV cache, and the transformer block ViT shares.

Shapes: B batch, T sequence, S cache length, D model width, H heads, K head width, V vocab,
L layers, F MLP hidden width.

Block, pre-LN (GPT-2):  x <- x + Attn(LN(x));  x <- x + MLP(LN(x));  final LN before the head.
Block, post-LN:         x <- LN(x + Attn(x));  x <- LN(x + MLP(x));  no final LN.
MLP: c_proj(GELU(c_fc x)) with F = 4D, or SwiGLU c_proj(silu(x W_g) * (x W_u)) with F = 8D/3.
Parameter names follow GPT-2 (wte, wpe, h.ln_1, h.attn.c_attn, ...), so `convert.py` is a
renaming. With `scan_layers` the L blocks are one `nn.scan` (params under 'h' with a leading L
axis), so compile time does not grow with depth; unrolled they are 'h_0' .. 'h_{L-1}'.
"""

from __future__ import annotations

import functools
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from jaxdl.models import attention, layers, register_model

Dtype = Any


class Block(nn.Module):
  """One transformer block; `__call__(x, cache, pos) -> (x, new_cache)` (scan-friendly)."""

  n_head: int
  causal: bool = True
  train: bool = False
  norm: str = "layer"
  ln: str = "pre"
  mlp: str = "gelu"
  mlp_hidden: int = 0
  dropout: float = 0.0
  attn_dropout: float = 0.0
  rope: bool = False
  qk_norm: bool = False
  use_bias: bool = True
  attn_impl: str = "auto"
  init_name: str = "gpt2"
  n_residual: int = 2
  epsilon: float = 1e-5
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def _norm(self, name):
    if self.norm not in ("layer", "rms"):
      raise ValueError(f"norm: unknown {self.norm!r}; expected one of ['layer', 'rms']")
    return layers.make_norm(self.norm, train=self.train, name=name, epsilon=self.epsilon,
                            dtype=self.dtype, param_dtype=self.param_dtype)

  @nn.compact
  def __call__(self, x_BxTxD, cache=None, pos=0):
    kinit = layers.get_initializer(self.init_name)
    oinit = layers.residual_out_init(self.init_name, self.n_residual)
    drop = nn.Dropout(self.dropout, deterministic=not self.train)
    attn = attention.MultiHeadAttention(
        num_heads=self.n_head, causal=self.causal, qk_norm=self.qk_norm, rope=self.rope,
        use_bias=self.use_bias, attn_dropout=self.attn_dropout, impl=self.attn_impl,
        kernel_init=kinit, out_init=oinit, dtype=self.dtype, param_dtype=self.param_dtype,
        name="attn")

    def attend(h):
      if cache is None:
        return attn(h, train=self.train, pos=pos), None
      y, aux = attn(h, train=self.train, cache=cache, pos=pos)
      return y, aux["cache"]

    mlp = MlpBlock(kind=self.mlp, hidden=self.mlp_hidden, use_bias=self.use_bias,
                   init_name=self.init_name, n_residual=self.n_residual, dtype=self.dtype,
                   param_dtype=self.param_dtype, name="mlp")
    if self.ln == "pre":
      a, new_cache = attend(self._norm("ln_1")(x_BxTxD))
      x_BxTxD = x_BxTxD + drop(a)
      x_BxTxD = x_BxTxD + drop(mlp(self._norm("ln_2")(x_BxTxD)))
    elif self.ln == "post":
      a, new_cache = attend(x_BxTxD)
      x_BxTxD = self._norm("ln_1")(x_BxTxD + drop(a))
      x_BxTxD = self._norm("ln_2")(x_BxTxD + drop(mlp(x_BxTxD)))
    else:
      raise ValueError(f"ln: unknown {self.ln!r}; expected one of ['pre', 'post']")
    return x_BxTxD, new_cache


class MlpBlock(nn.Module):
  """c_proj(GELU(c_fc x)), F = 4D; or SwiGLU: c_fc gives [gate, up], c_proj(silu(gate) * up)."""

  kind: str = "gelu"
  hidden: int = 0
  use_bias: bool = True
  init_name: str = "gpt2"
  n_residual: int = 2
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxTxD):
    d = x_BxTxD.shape[-1]
    dense = functools.partial(nn.Dense, use_bias=self.use_bias, dtype=self.dtype,
                              param_dtype=self.param_dtype)
    kinit = layers.get_initializer(self.init_name)
    if self.kind == "gelu":
      f = self.hidden or 4 * d
      h_BxTxF = layers.gelu_tanh(dense(f, kernel_init=kinit, name="c_fc")(x_BxTxD))
    elif self.kind == "swiglu":
      f = self.hidden or 8 * d // 3
      gate, up = jnp.split(dense(2 * f, kernel_init=kinit, name="c_fc")(x_BxTxD), 2, axis=-1)
      h_BxTxF = nn.silu(gate) * up
    else:
      raise ValueError(f"mlp: unknown {self.kind!r}; expected one of ['gelu', 'swiglu']")
    oinit = layers.residual_out_init(self.init_name, self.n_residual)
    return dense(d, kernel_init=oinit, dot_general=layers.wide_in_dot_general,
                 name="c_proj")(h_BxTxF)


def _block_kwargs(m, *, causal: bool, train: bool) -> dict:
  return dict(n_head=m.n_head, causal=causal, train=train, norm=m.norm, ln=m.ln, mlp=m.mlp,
              mlp_hidden=m.mlp_hidden, dropout=m.dropout, attn_dropout=m.attn_dropout,
              rope=getattr(m, "pos", "learned") == "rope", qk_norm=m.qk_norm,
              use_bias=m.use_bias, attn_impl=m.attn_impl, init_name=m.init_name,
              n_residual=2 * m.n_layer, epsilon=m.epsilon, dtype=m.dtype,
              param_dtype=m.param_dtype)


def apply_blocks(m, x_BxTxD, *, causal: bool, train: bool, cache=None, pos=0):
  """Runs the L blocks of module `m` (GPT or ViT) scanned or unrolled; returns (x, cache)."""
  kw = _block_kwargs(m, causal=causal, train=train)
  block_cls = nn.remat(Block, prevent_cse=not m.scan_layers) if m.remat else Block
  if m.scan_layers:
    stack = nn.scan(block_cls, variable_axes={"params": 0},
                    split_rngs={"params": True, "dropout": True},
                    in_axes=(0, nn.broadcast), length=m.n_layer,
                    unroll=max(1, min(getattr(m, "scan_unroll", 1), m.n_layer)))
    return stack(**kw, name="h")(x_BxTxD, cache, pos)
  new = []
  for i in range(m.n_layer):
    layer_cache = None if cache is None else jax.tree.map(lambda a, i=i: a[i], cache)
    x_BxTxD, c = block_cls(**kw, name=f"h_{i}")(x_BxTxD, layer_cache, pos)
    new.append(c)
  return x_BxTxD, (None if cache is None else jax.tree.map(lambda *a: jnp.stack(a), *new))


class GPT(nn.Module):
  """GPT: tokens int (B, T) -> logits fp32 (B, T, V).

  `model.apply(v, tokens, train=False)` is the full forward. With `cache` (from `init_cache`)
  and `pos` (position of tokens[:, 0]) it returns `(logits, new_cache)` for incremental decoding.
  """

  vocab_size: int = 256
  block_size: int = 256
  n_layer: int = 4
  n_head: int = 4
  d_model: int = 128
  mlp: str = "gelu"
  mlp_hidden: int = 0
  norm: str = "layer"
  ln: str = "pre"
  pos: str = "learned"
  dropout: float = 0.0
  attn_dropout: float = 0.0
  tie_embeddings: bool = True
  use_bias: bool = True
  qk_norm: bool = False
  scan_layers: bool = True
  # Layers per scan iteration: > 1 trades a little compile time for fewer loop-carried copies
  # (the params stay stacked under 'h' either way, so checkpoints do not change).
  scan_unroll: int = 1
  remat: bool = False
  attn_impl: str = "auto"
  init_name: str = "gpt2"
  epsilon: float = 1e-5
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, *, train: bool, cache=None, pos=0):
    chex.assert_rank(x, 2, custom_message=f"{self.name or 'GPT'}: tokens must be int (B, T)")
    if not jnp.issubdtype(x.dtype, jnp.integer):
      raise TypeError(f"GPT: tokens must be integers, got {x.dtype}")
    b, t = x.shape
    limit = self.block_size if cache is None else cache["k"].shape[2]
    if t > limit or (isinstance(pos, int) and pos + t > limit):
      raise ValueError(f"GPT: sequence of {t} tokens at position {pos} exceeds the context of "
                       f"{limit} (block_size={self.block_size})")
    if self.pos not in ("learned", "rope"):
      raise ValueError(f"pos: unknown {self.pos!r}; expected one of ['learned', 'rope']")
    emb = functools.partial(nn.Embed, features=self.d_model, dtype=self.dtype,
                            param_dtype=self.param_dtype,
                            embedding_init=nn.initializers.normal(0.02))
    wte = emb(self.vocab_size, name="wte")
    x_BxTxD = wte(x)
    if self.pos == "learned":
      x_BxTxD = x_BxTxD + emb(self.block_size, name="wpe")(pos + jnp.arange(t))[None]
    x_BxTxD = nn.Dropout(self.dropout, deterministic=not train)(x_BxTxD)
    x_BxTxD, new_cache = apply_blocks(self, x_BxTxD, causal=True, train=train, cache=cache,
                                      pos=pos)
    if self.ln == "pre":
      x_BxTxD = layers.make_norm(self.norm, train=train, name="ln_f", epsilon=self.epsilon,
                                 dtype=self.dtype, param_dtype=self.param_dtype)(x_BxTxD)
    if self.tie_embeddings:
      logits_BxTxV = wte.attend(x_BxTxD)
    else:
      logits_BxTxV = nn.Dense(self.vocab_size, use_bias=False, dtype=self.dtype,
                              param_dtype=self.param_dtype,
                              kernel_init=layers.get_initializer(self.init_name), name="lm_head")(
                                  x_BxTxD)
    logits_BxTxV = logits_BxTxV.astype(jnp.float32)
    return logits_BxTxV if cache is None else (logits_BxTxV, new_cache)


def init_cache(model: GPT, batch_size: int, max_len: int | None = None, dtype=None) -> dict:
  """Zero KV cache {'k', 'v'} of shape (L, B, S, H, K), S = max_len (default block_size)."""
  s = max_len or model.block_size
  if model.pos == "learned" and s > model.block_size:
    raise ValueError(f"GPT: cache length {s} exceeds block_size {model.block_size}")
  shape = (model.n_layer, batch_size, s, model.n_head, model.d_model // model.n_head)
  z = jnp.zeros(shape, dtype or model.dtype)
  return {"k": z, "v": z}


# ---------------------------------------------------------------------------------------------
# Layer layout: scanned ('h', leading L axis) <-> unrolled ('h_0' .. 'h_{L-1}').

def unstack_layers(params: dict, n_layer: int) -> dict:
  out = {k: v for k, v in params.items() if k != "h"}
  for i in range(n_layer):
    out[f"h_{i}"] = jax.tree.map(lambda a, i=i: a[i], params["h"])
  return out


def stack_layers(params: dict) -> dict:
  n = sum(k.startswith("h_") for k in params)
  out = {k: v for k, v in params.items() if not k.startswith("h_")}
  out["h"] = jax.tree.map(lambda *a: jnp.stack(a), *[params[f"h_{i}"] for i in range(n)])
  return out


# ---------------------------------------------------------------------------------------------
# Generation: a jitted lax loop over the KV cache.

def sample_logits(rng, logits_BxV, *, temperature=1.0, top_k: int = 0, top_p: float = 1.0,
                  greedy: bool = False):
  """Next tokens (B,) from logits: argmax if greedy, else softmax(logits / temperature) sampled
  after keeping the top_k largest (top_k > 0) and the smallest set whose mass reaches top_p."""
  if greedy:
    return jnp.argmax(logits_BxV, axis=-1)
  neg = jnp.finfo(jnp.float32).min
  logits_BxV = logits_BxV.astype(jnp.float32) / temperature
  if top_k > 0:
    kth_Bx1 = jax.lax.top_k(logits_BxV, top_k)[0][:, -1:]
    logits_BxV = jnp.where(logits_BxV < kth_Bx1, neg, logits_BxV)
  if top_p < 1.0:
    sorted_BxV = jnp.sort(logits_BxV, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_BxV, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs  # keep a token while the mass before it < p
    kept = jnp.where(mass_before < top_p, sorted_BxV, jnp.inf)
    cutoff_Bx1 = jnp.min(kept, axis=-1, keepdims=True)
    logits_BxV = jnp.where(logits_BxV < cutoff_Bx1, neg, logits_BxV)
  return jax.random.categorical(rng, logits_BxV, axis=-1)


def make_sampler(model: GPT, max_new_tokens: int, *, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0, greedy: bool = False):
  """Returns jitted `sample(params, prompt_BxP, rng) -> tokens Bx(P+N)`.

  The prompt fills the cache in one forward pass; each of the N new tokens is then one cached
  decoding step inside `lax.fori_loop`. P + N must fit in block_size for learned positions.
  """
  model = model.clone(dropout=0.0, attn_dropout=0.0)

  @jax.jit
  def sample(params, prompt_BxP, rng):
    b, p = prompt_BxP.shape
    total = p + max_new_tokens
    if model.pos == "learned" and total > model.block_size:
      raise ValueError(f"generate: prompt {p} + {max_new_tokens} new tokens exceeds block_size "
                       f"{model.block_size}")
    cache = init_cache(model, b, total)
    logits, cache = model.apply({"params": params}, prompt_BxP, train=False, cache=cache, pos=0)
    out_BxN = jnp.zeros((b, total), prompt_BxP.dtype).at[:, :p].set(prompt_BxP)

    def step(i, carry):
      out_BxN, cache, last_BxV, rng = carry
      rng, sub = jax.random.split(rng)
      tok_B = sample_logits(sub, last_BxV, temperature=temperature, top_k=top_k, top_p=top_p,
                            greedy=greedy).astype(out_BxN.dtype)
      out_BxN = jax.lax.dynamic_update_slice(out_BxN, tok_B[:, None], (0, p + i))
      logits, cache = model.apply({"params": params}, tok_B[:, None], train=False, cache=cache,
                                  pos=p + i)
      return out_BxN, cache, logits[:, -1], rng

    out_BxN, *_ = jax.lax.fori_loop(0, max_new_tokens, step, (out_BxN, cache, logits[:, -1], rng))
    return out_BxN

  return sample


def generate(model: GPT, params, prompt_BxP, rng, max_new_tokens: int, **sampling):
  """One-off convenience around `make_sampler` (which callers should keep to reuse the jit)."""
  return make_sampler(model, max_new_tokens, **sampling)(params, prompt_BxP, rng)


# ---------------------------------------------------------------------------------------------
# Presets and the registry builder.

PRESETS = {
    "gpt2-small": dict(n_layer=12, d_model=768, n_head=12, vocab_size=50257, block_size=1024),
    "gpt2-medium": dict(n_layer=24, d_model=1024, n_head=16, vocab_size=50257, block_size=1024),
    "gpt2-large": dict(n_layer=36, d_model=1280, n_head=20, vocab_size=50257, block_size=1024),
    "gpt2-xl": dict(n_layer=48, d_model=1600, n_head=25, vocab_size=50257, block_size=1024),
    "tiny": dict(n_layer=2, d_model=32, n_head=4, vocab_size=64, block_size=32),
}
# Every key the builder reads, with its default (GPT-2's architecture choices).
GPT_DEFAULTS = dict(
    preset="", vocab_size=256, block_size=256, n_layer=4, n_head=4, d_model=128, mlp="gelu",
    mlp_hidden=0, norm="layer", ln="pre", pos="learned", dropout=0.0, attn_dropout=0.0,
    tie_embeddings=True, bias=True, qk_norm=False, scan_layers=True, scan_unroll=1, remat=False,
    attn_impl="auto", init="gpt2", epsilon=1e-5, dtype="float32", param_dtype="float32")


def gpt_config(preset: str = "", **overrides) -> ml_collections.ConfigDict:
  """A complete `model` ConfigDict (name='gpt') for a preset, with overrides applied."""
  if preset and preset not in PRESETS:
    raise ValueError(f"gpt preset: unknown {preset!r}; expected one of {sorted(PRESETS)}")
  cfg = dict(GPT_DEFAULTS, **(PRESETS.get(preset, {})), preset=preset)
  unknown = set(overrides) - set(cfg)
  if unknown:
    raise ValueError(f"gpt_config: unknown keys {sorted(unknown)}; expected some of {sorted(cfg)}")
  cfg.update(overrides)
  return ml_collections.ConfigDict(dict(name="gpt", **cfg))


@register_model("gpt")
def build_gpt(cfg) -> GPT:
  """GPT from a ConfigDict: a preset (if `preset` is set) under the keys present in cfg."""
  preset = cfg.get("preset", "") or ""
  if preset and preset not in PRESETS:
    raise ValueError(f"model.preset: unknown {preset!r}; expected one of {sorted(PRESETS)}")
  base = dict(GPT_DEFAULTS, **PRESETS.get(preset, {}))
  c = {k: cfg.get(k, v) for k, v in base.items()}
  return GPT(vocab_size=c["vocab_size"], block_size=c["block_size"], n_layer=c["n_layer"],
             n_head=c["n_head"], d_model=c["d_model"], mlp=c["mlp"], mlp_hidden=c["mlp_hidden"],
             norm=c["norm"], ln=c["ln"], pos=c["pos"], dropout=c["dropout"],
             attn_dropout=c["attn_dropout"], tie_embeddings=c["tie_embeddings"],
             use_bias=c["bias"], qk_norm=c["qk_norm"], scan_layers=c["scan_layers"],
             scan_unroll=c["scan_unroll"],
             remat=c["remat"], attn_impl=c["attn_impl"], init_name=c["init"],
             epsilon=c["epsilon"], dtype=layers.to_dtype(c["dtype"]),
             param_dtype=layers.to_dtype(c["param_dtype"]))
