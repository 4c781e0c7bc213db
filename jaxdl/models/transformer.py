"""The transformer block GPT and ViT share, and the stack of L blocks (scanned or unrolled).

Shapes: B batch, T sequence, D model width, F MLP hidden width, L layers.

Block, pre-LN (GPT-2):  x <- x + Attn(LN(x));  x <- x + MLP(LN(x))   (the model adds a final LN)
Block, post-LN:         x <- LN(x + Attn(x));  x <- LN(x + MLP(x))
DropPath (stochastic depth, `drop_path` p): in training each residual branch of each example is
dropped whole with probability p and kept ones are scaled by 1 / (1 - p), so E[branch] holds.
MLP: c_proj(GELU(c_fc x)) with F = 4D, or SwiGLU c_proj(silu(x W_g) * (x W_u)) with F = 8D/3.
Variants: the MLP a mixture of experts (`moe_spec`, `jaxdl.models.moe`), the attention a
selective state-space mixer (`mixer='ssm'`, `jaxdl.models.ssm`), each in the same residual slot.
With `scan_layers` the L blocks are one `nn.scan` (params under 'h' with a leading L axis), so
compile time does not grow with depth; unrolled they are 'h_0' .. 'h_{L-1}'.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxdl.models import attention, layers, moe, ssm

Dtype = Any


class MlpBlock(nn.Module):
  """c_proj(GELU(c_fc x)), F = 4D; or SwiGLU: c_fc gives [gate, up], c_proj(silu(gate) * up).

  GELU is the tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as in GPT-2.
  """

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
      h_BxTxF = nn.gelu(dense(f, kernel_init=kinit, name="c_fc")(x_BxTxD), approximate=True)
    elif self.kind == "swiglu":
      f = self.hidden or 8 * d // 3
      gate, up = jnp.split(dense(2 * f, kernel_init=kinit, name="c_fc")(x_BxTxD), 2, axis=-1)
      h_BxTxF = nn.silu(gate) * up
    else:
      raise ValueError(f"mlp: unknown {self.kind!r}; expected one of ['gelu', 'swiglu']")
    oinit = layers.residual_out_init(self.init_name, self.n_residual)
    return dense(d, kernel_init=oinit, name="c_proj")(h_BxTxF)


class Block(nn.Module):
  """One transformer block; `__call__(x, cache, pos, mask, positions) -> (x, new_cache)`
  (scan-friendly). `mask` (B, 1, T, S) bool narrows attention beyond causality (packed documents
  see only their own segment); `positions` (B, T) are the RoPE positions when given.

  `n_residual` is the number of residual branches in the whole stack (2 L), which scales the
  init of the output projections ('gpt2': std 0.02 / sqrt(2 L)).
  """

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
  drop_path: float = 0.0
  moe_spec: moe.MoeSpec | None = None  # the MLP is a mixture of experts (`jaxdl.models.moe`)
  mixer: str = "attention"  # or 'ssm': a selective state-space mixer (`jaxdl.models.ssm`)
  ssm_state: int = 16
  ssm_expand: int = 2
  ssm_conv: int = 4
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def _norm(self, name):
    if self.norm not in ("layer", "rms"):
      raise ValueError(f"norm: unknown {self.norm!r}; expected one of ['layer', 'rms']")
    return layers.make_norm(self.norm, train=self.train, name=name, epsilon=self.epsilon,
                            dtype=self.dtype, param_dtype=self.param_dtype)

  @nn.compact
  def __call__(self, x_BxTxD, cache=None, pos=0, mask=None, positions=None):
    kinit = layers.get_initializer(self.init_name)
    oinit = layers.residual_out_init(self.init_name, self.n_residual)
    dropout = nn.Dropout(self.dropout, deterministic=not self.train)
    if self.drop_path > 0:  # one keep/drop draw per example, broadcast over (T, D)
      path = nn.Dropout(self.drop_path, broadcast_dims=(1, 2), deterministic=not self.train,
                        name="drop_path")
      drop = lambda h: path(dropout(h))  # noqa: E731
    else:
      drop = dropout
    attn = attention.MultiHeadAttention(
        num_heads=self.n_head, causal=self.causal, qk_norm=self.qk_norm, rope=self.rope,
        use_bias=self.use_bias, attn_dropout=self.attn_dropout, impl=self.attn_impl,
        kernel_init=kinit, out_init=oinit, dtype=self.dtype, param_dtype=self.param_dtype,
        name="attn")

    def attend(h_BxTxD):
      if self.mixer == "ssm":  # the same residual slot; its cache is the state (h, conv tail)
        mix = ssm.SelectiveSSM(h_BxTxD.shape[-1], state=self.ssm_state, expand=self.ssm_expand,
                               conv=self.ssm_conv, init_name=self.init_name, out_init=oinit,
                               dtype=self.dtype, param_dtype=self.param_dtype, name="ssm")
        if cache is None:
          return mix(h_BxTxD), None
        y_BxTxD, (h_BxExN, tail_BxKm1xE) = mix(h_BxTxD, (cache["h"], cache["conv"]))
        return y_BxTxD, {"h": h_BxExN, "conv": tail_BxKm1xE}
      if cache is None:
        return attn(h_BxTxD, train=self.train, pos=pos, mask=mask, positions=positions), None
      y_BxTxD, aux = attn(h_BxTxD, train=self.train, cache=cache, pos=pos)
      return y_BxTxD, aux["cache"]

    if self.moe_spec is None:
      mlp = MlpBlock(kind=self.mlp, hidden=self.mlp_hidden, use_bias=self.use_bias,
                     init_name=self.init_name, n_residual=self.n_residual, dtype=self.dtype,
                     param_dtype=self.param_dtype, name="mlp")
    else:
      mlp = moe.MoeMlp(self.moe_spec, hidden=self.mlp_hidden, init_name=self.init_name,
                       n_residual=self.n_residual, dtype=self.dtype,
                       param_dtype=self.param_dtype, name="mlp")
    if self.ln == "pre":
      a_BxTxD, new_cache = attend(self._norm("ln_1")(x_BxTxD))
      x_BxTxD = x_BxTxD + drop(a_BxTxD)
      x_BxTxD = x_BxTxD + drop(mlp(self._norm("ln_2")(x_BxTxD)))
    elif self.ln == "post":
      a_BxTxD, new_cache = attend(x_BxTxD)
      x_BxTxD = self._norm("ln_1")(x_BxTxD + drop(a_BxTxD))
      x_BxTxD = self._norm("ln_2")(x_BxTxD + drop(mlp(x_BxTxD)))
    else:
      raise ValueError(f"ln: unknown {self.ln!r}; expected one of ['pre', 'post']")
    return x_BxTxD, new_cache


def apply_blocks(x_BxTxD, *, n_layer: int, scan_layers: bool, remat: bool,
                 scan_unroll: int = 1, cache=None, pos=0, mask=None, positions=None,
                 **block_fields):
  """Runs L = n_layer `Block(**block_fields)` in order; returns (x, new_cache).

  Call inside a compact method: the blocks' params land in the caller's scope ('h' scanned,
  'h_i' unrolled). `cache` (L, B, S, H, K) per key is split by layer; `remat` recomputes each
  block's activations in the backward pass; `scan_unroll` layers run per scan iteration;
  `mask` and `positions` go to every block unchanged.
  """
  block_cls = nn.remat(Block, prevent_cse=not scan_layers) if remat else Block
  if scan_layers:
    stack = nn.scan(block_cls, variable_axes={"params": 0, moe.AUX: 0, "watch": 0},
                    split_rngs={"params": True, "dropout": True},
                    in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast), length=n_layer,
                    unroll=max(1, min(scan_unroll, n_layer)))
    return stack(**block_fields, name="h")(x_BxTxD, cache, pos, mask, positions)
  new = []
  for i in range(n_layer):
    layer_cache = None if cache is None else jax.tree.map(lambda a, i=i: a[i], cache)
    x_BxTxD, c = block_cls(**block_fields, name=f"h_{i}")(x_BxTxD, layer_cache, pos, mask,
                                                         positions)
    new.append(c)
  return x_BxTxD, (None if cache is None else jax.tree.map(lambda *a: jnp.stack(a), *new))


def unstack_layers(params: dict, n_layer: int) -> dict:
  """Scanned layout ('h', leading L axis) -> unrolled ('h_0' .. 'h_{L-1}')."""
  out = {k: v for k, v in params.items() if k != "h"}
  for i in range(n_layer):
    out[f"h_{i}"] = jax.tree.map(lambda a, i=i: a[i], params["h"])
  return out


def stack_layers(params: dict) -> dict:
  """Unrolled layout ('h_0' .. 'h_{L-1}') -> scanned ('h', leading L axis)."""
  n = sum(k.startswith("h_") for k in params)
  out = {k: v for k, v in params.items() if not k.startswith("h_")}
  out["h"] = jax.tree.map(lambda *a: jnp.stack(a), *[params[f"h_{i}"] for i in range(n)])
  return out
