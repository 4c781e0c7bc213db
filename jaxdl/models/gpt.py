"""Decoder-only transformer (GPT), its size presets and its `model` config section.

Shapes: B batch, T sequence, D model width, V vocab.

  x_0 = wte[tokens] + wpe[positions]  (or RoPE inside attention with pos='rope')
  x_L = L transformer blocks (`jaxdl.models.transformer`, causal)
  logits = LN_f(x_L) wte^T  (tied head; `lm_head` when tie_embeddings is off)
Parameter names follow GPT-2 (wte, wpe, h.ln_1, h.attn.c_attn, ...), so `convert.py` is a
renaming. Decoding (KV cache, sampling, generate) is in `jaxdl.models.decoding`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import chex
import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from jaxdl.models import layers, register_model, transformer

Dtype = Any


class GPT(nn.Module):
  """GPT: tokens int (B, T) -> logits fp32 (B, T, V). The fields are the `model` config keys.

  `model.apply(v, tokens, train=False)` is the full forward. With `cache` (from
  `decoding.init_cache`) and `pos` (position of tokens[:, 0]) it returns `(logits, new_cache)`
  for incremental decoding. The defaults are GPT-2's architecture choices.
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

  def __post_init__(self):
    layers.check_fields(self, sizes=("vocab_size", "block_size", "n_layer", "n_head", "d_model",
                                     "scan_unroll"),
                        dropouts=("dropout", "attn_dropout"))
    super().__post_init__()

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
    x_BxTxD, new_cache = transformer.apply_blocks(
        x_BxTxD, n_layer=self.n_layer, scan_layers=self.scan_layers, remat=self.remat,
        scan_unroll=self.scan_unroll, cache=cache, pos=pos,
        n_head=self.n_head, causal=True, train=train, norm=self.norm, ln=self.ln, mlp=self.mlp,
        mlp_hidden=self.mlp_hidden, dropout=self.dropout, attn_dropout=self.attn_dropout,
        rope=self.pos == "rope", qk_norm=self.qk_norm, use_bias=self.use_bias,
        attn_impl=self.attn_impl, init_name=self.init_name, n_residual=2 * self.n_layer,
        epsilon=self.epsilon, dtype=self.dtype, param_dtype=self.param_dtype)
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


# ---------------------------------------------------------------------------------------------
# Presets and the `model` section.

PRESETS = {
    "gpt2-small": dict(n_layer=12, d_model=768, n_head=12, vocab_size=50257, block_size=1024),
    "gpt2-medium": dict(n_layer=24, d_model=1024, n_head=16, vocab_size=50257, block_size=1024),
    "gpt2-large": dict(n_layer=36, d_model=1280, n_head=20, vocab_size=50257, block_size=1024),
    "gpt2-xl": dict(n_layer=48, d_model=1600, n_head=25, vocab_size=50257, block_size=1024),
    "tiny": dict(n_layer=2, d_model=32, n_head=4, vocab_size=64, block_size=32),
}


def _check_preset(preset: str, key: str) -> dict:
  if preset and preset not in PRESETS:
    raise ValueError(f"{key}: unknown {preset!r}; expected one of {sorted(PRESETS)}")
  return PRESETS.get(preset, {})


@register_model("gpt")
def build_gpt(preset: str = "", **fields) -> GPT:
  """`GPT(**fields)` over the preset's sizes: a key given in `fields` wins over the preset."""
  return GPT(**{**_check_preset(preset, "model.preset"), **fields})


build_gpt.model_class = GPT  # its fields are the keys `build_model` accepts besides 'preset'


def gpt_config(preset: str = "", **overrides) -> ml_collections.ConfigDict:
  """A complete `model` section (name='gpt'): every `GPT` field at its default, the preset's
  sizes, then `overrides`; dtypes by name so the section stays JSON-serialisable."""
  fields = {f.name: f.default for f in dataclasses.fields(GPT)
            if f.init and f.name not in ("parent", "name")}
  fields.update({k: jnp.dtype(fields[k]).name for k in ("dtype", "param_dtype")})
  fields.update(_check_preset(preset, "gpt preset"))
  unknown = sorted(set(overrides) - set(fields))
  if unknown:
    raise ValueError(f"model.{unknown[0]}: unknown key for model 'gpt'; expected one of "
                     f"{sorted(fields)}")
  fields.update(overrides)
  return ml_collections.ConfigDict(dict(name="gpt", preset=preset, **fields))

