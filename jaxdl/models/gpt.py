"""Decoder-only transformer (GPT), its size presets and its `model` config section.

Shapes: B batch, T sequence, D model width, V vocab.

  x_0 = wte[tokens] + wpe[positions]  (or RoPE inside attention with pos='rope')
  x_L = L transformer blocks (`jaxdl.models.transformer`, causal)
  Packed documents (`segment_ids`, `positions` from `jaxdl.data.packing`): token i attends to
  token j iff j <= i and segment_ids[j] = segment_ids[i], and positions restart at 0 in each
  document, so each document's logits are those it gets run alone.
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
import jax
import jax.numpy as jnp
import ml_collections

from jaxdl.models import layers, moe, register_model, ssm, transformer

Dtype = Any


class GPT(nn.Module):
  """GPT: tokens int (B, T) -> logits fp32 (B, T, V). The fields are the `model` config keys.

  `model.apply(v, tokens, train=False)` is the full forward. With `cache` (from
  `decoding.init_cache`) and `pos` (position of tokens[:, 0]) it returns `(logits, new_cache)`
  for incremental decoding. `segment_ids` and `positions` (int (B, T)) describe packed
  documents (module docstring). The defaults are GPT-2's architecture choices.
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
  # Stochastic depth: in training each block's residual branches are dropped whole per example
  # with this probability (kept ones scaled by 1 / (1 - p)); the identity at eval. Off: 0.
  drop_path: float = 0.0
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
  # Mixture of experts (`jaxdl.models.moe`): moe_experts = E > 0 replaces every block's MLP by E
  # GELU experts, each token routed to moe_top_k of them; capacity factor and aux-loss weights.
  moe_experts: int = 0
  moe_top_k: int = 2
  moe_capacity: float = 1.25
  moe_balance_coef: float = 0.01
  moe_z_coef: float = 1e-3
  # The token mixer of every block: 'attention', or 'ssm' (`jaxdl.models.ssm`: a selective
  # diagonal recurrence with ssm_state N per channel over ssm_expand * d_model channels, after a
  # causal depthwise convolution of width ssm_conv).
  mixer: str = "attention"
  ssm_state: int = 16
  ssm_expand: int = 2
  ssm_conv: int = 4
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def __post_init__(self):
    layers.check_fields(self, sizes=("vocab_size", "block_size", "n_layer", "n_head", "d_model",
                                     "scan_unroll"),
                        dropouts=("dropout", "attn_dropout", "drop_path"))
    moe.check_spec(self.moe_experts, self.moe_top_k, self.moe_capacity)
    if self.mixer not in ("attention", "ssm"):
      raise ValueError(f"model.mixer: unknown {self.mixer!r}; expected one of "
                       f"['attention', 'ssm']")
    if self.mixer == "ssm":
      ssm.check_state(self.ssm_state)
      layers.check_fields(self, sizes=("ssm_expand", "ssm_conv"))
    if self.moe_experts and self.mlp != "gelu":
      raise ValueError(f"model.mlp: the experts of moe_experts > 0 are GELU MLPs; got "
                       f"mlp={self.mlp!r}, expected 'gelu'")
    super().__post_init__()

  @property
  def moe_spec(self) -> moe.MoeSpec | None:
    if not self.moe_experts:
      return None
    return moe.MoeSpec(self.moe_experts, self.moe_top_k, self.moe_capacity,
                       self.moe_balance_coef, self.moe_z_coef)

  @nn.compact
  def __call__(self, x, *, train: bool, cache=None, pos=0, segment_ids=None, positions=None):
    chex.assert_rank(x, 2, custom_message=f"{self.name or 'GPT'}: tokens must be int (B, T)")
    if not jnp.issubdtype(x.dtype, jnp.integer):
      raise TypeError(f"GPT: tokens must be integers, got {x.dtype}")
    b, t = x.shape
    limit = self.block_size if cache is None or "k" not in cache else cache["k"].shape[2]
    if t > limit or (isinstance(pos, int) and pos + t > limit):
      raise ValueError(f"GPT: sequence of {t} tokens at position {pos} exceeds the context of "
                       f"{limit} (block_size={self.block_size})")
    if cache is not None and (segment_ids is not None or positions is not None):
      raise ValueError("GPT: cached decoding continues one document; segment_ids and "
                       "positions are for packed training batches")
    if self.pos not in ("learned", "rope"):
      raise ValueError(f"pos: unknown {self.pos!r}; expected one of ['learned', 'rope']")
    emb = functools.partial(nn.Embed, features=self.d_model, dtype=self.dtype,
                            param_dtype=self.param_dtype,
                            embedding_init=nn.initializers.normal(0.02))
    wte = emb(self.vocab_size, name="wte")
    x_BxTxD = wte(x)
    if self.pos == "learned":
      wpe = emb(self.block_size, name="wpe")
      x_BxTxD = x_BxTxD + (wpe(pos + jnp.arange(t))[None] if positions is None
                           else wpe(positions))
    mask_Bx1xTxT = None
    if segment_ids is not None:
      mask_Bx1xTxT = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
    x_BxTxD = nn.Dropout(self.dropout, deterministic=not train)(x_BxTxD)
    x_BxTxD, new_cache = transformer.apply_blocks(
        x_BxTxD, n_layer=self.n_layer, scan_layers=self.scan_layers, remat=self.remat,
        scan_unroll=self.scan_unroll, cache=cache, pos=pos, mask=mask_Bx1xTxT,
        positions=positions,
        n_head=self.n_head, causal=True, train=train, norm=self.norm, ln=self.ln, mlp=self.mlp,
        mlp_hidden=self.mlp_hidden, dropout=self.dropout, attn_dropout=self.attn_dropout,
        drop_path=self.drop_path, rope=self.pos == "rope", qk_norm=self.qk_norm,
        use_bias=self.use_bias,
        attn_impl=self.attn_impl, init_name=self.init_name, n_residual=2 * self.n_layer,
        epsilon=self.epsilon, moe_spec=self.moe_spec, mixer=self.mixer,
        ssm_state=self.ssm_state, ssm_expand=self.ssm_expand, ssm_conv=self.ssm_conv,
        dtype=self.dtype,
        param_dtype=self.param_dtype)
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
# Size and compute.


def gpt_costs(model: GPT, seq_len: int | None = None) -> dict:
  """Parameters and forward FLOPs per token of `model` (a multiply-add is 2 FLOPs):

    params           every scalar `init` creates (counted from shapes, nothing allocated)
    active_params    the scalars one token uses: an expert weight counts K / E of its size
    flops_per_token  2 M + 4 T D L: M = the matrix weights a token multiplies (kernels, the
                     router, K / E of the experts, the head), and per layer Q K^T and the weighted
                     sum of V over T = seq_len keys (default block_size)
  An MoE's params grow with E while its FLOPs grow with K (and the E-wide router).
  """
  t = seq_len or model.block_size
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32),
                                             train=False))["params"]
  spec = model.moe_spec
  params = active = matmul = 0.0
  for path, leaf in jax.tree_util.tree_leaves_with_path(shapes):
    name = jax.tree_util.keystr(path)
    used = leaf.size * moe.active_fraction(name, spec)
    params, active = params + leaf.size, active + used
    if name.endswith(("['kernel']", "['router']", "['expert_fc']", "['expert_proj']")):
      matmul += used
  if model.tie_embeddings:
    matmul += model.vocab_size * model.d_model  # the head reuses wte
  return {"params": int(params), "active_params": int(round(active)),
          "flops_per_token": int(round(2 * matmul + 4 * t * model.d_model * model.n_layer))}


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

