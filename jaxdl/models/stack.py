"""The stack of L transformer blocks, written once for every transformer of jaxdl (GPT, ViT, DiT),
and its two parameter layouts (`unstack_layers`, `stack_layers`). Shapes: B batch, T sequence,
D model width, L layers.

The stack (`stack_blocks`, written once for every block kind: GPT's and ViT's `Block`, DiT's adaLN
block): with `scan_layers` the L blocks are one `nn.scan` (params under 'h' with a leading L axis),
so compile time does not grow with depth; unrolled they are 'h_0' .. 'h_{L-1}'; with `remat` (a
policy, `transformer.REMAT_POLICIES`) each block's activations are recomputed in the backward pass
but those the policy saves: 'none' saves all (no recomputation), 'full' none of them (memory per
block ~ its input x_BxTxD, compute ~ one more forward), 'dots' the matmul outputs (recomputes the
elementwise ops, norms, softmax), 'dots_no_batch' the matmuls without batch dimensions (the
projections and MLP, not attention's batched QK^T / AV, so no B x H x T x T is kept), 'offload'
those same dots moved to host memory (an accelerator's pinned host; refused on the CPU backend,
whose device memory is the host's).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxdl.models import moe
from jaxdl.models.transformer import REMAT_POLICIES, Block, TransformerModel


def stack_blocks(model: TransformerModel, block: type[nn.Module], x_BxTxD, *args, train: bool,
                 layer_axes: tuple[int | None, ...]):
  """x <- block_i(x, *args) for i = 0 .. L-1, L = model.n_layer; returns (x, ys).

  Each `block(model.block_spec, train)` is called as `block(x, *args) -> (x, y)`; ys stacks the
  y_i along a leading L axis (None when they are None). `layer_axes[j]` is 0 when args[j] holds
  one slice per layer along its leading axis (a KV cache), None when every block gets it whole
  (positions, a mask, DiT's condition). Call inside `model`'s compact method: the params land
  in its scope, one `nn.scan` 'h' (leading L axis) with `scan_layers` or 'h_0' .. 'h_{L-1}';
  `remat` is the block's `jax.checkpoint` policy (`REMAT_POLICIES`), applied once here for every
  stack; `scan_unroll` layers run per scan iteration. The one stack every transformer of jaxdl
  runs (GPT, ViT, DiT).
  """
  cfg, n_layer = model.block_spec, model.n_layer
  # CSE across the unrolled blocks would undo the recomputation; inside a scan there is none.
  block_cls = block
  if model.remat != "none":
    block_cls = nn.remat(block, prevent_cse=not model.scan_layers,
                         policy=REMAT_POLICIES[model.remat])
  if model.scan_layers:
    stack = nn.scan(block_cls, variable_axes={"params": 0, moe.AUX: 0, "watch": 0},
                    split_rngs={"params": True, "dropout": True},
                    in_axes=tuple(nn.broadcast if a is None else a for a in layer_axes),
                    length=n_layer, unroll=max(1, min(model.scan_unroll, n_layer)))
    return stack(cfg, train, name="h")(x_BxTxD, *args)
  ys = []
  for i in range(n_layer):
    layer_args = [a if axis is None else jax.tree.map(lambda v, i=i: v[i], a)
                  for a, axis in zip(args, layer_axes)]
    x_BxTxD, y = block_cls(cfg, train, name=f"h_{i}")(x_BxTxD, *layer_args)
    ys.append(y)
  if all(y is None for y in ys):
    return x_BxTxD, None
  return x_BxTxD, jax.tree.map(lambda *a: jnp.stack(a), *ys)


def apply_blocks(model: TransformerModel, x_BxTxD, *, train: bool, cache=None, pos=0,
                 mask=None, positions=None, segment_ids=None):
  """GPT's and ViT's stack: L `Block`s (`stack_blocks`), then the final norm 'ln_f' under
  pre-LN and sandwich; returns (x, new_cache). `cache` (L, B, S, N, K) per key is split by
  layer, and so are the layer kinds (L,) of a stack that mixes them (module docstring); `mask`,
  `positions` and `segment_ids` go to every block unchanged."""
  local_L = jnp.asarray(model.local_layers) if model.block_spec.mixed_layers else None
  x_BxTxD, new_cache = stack_blocks(model, Block, x_BxTxD, cache, pos, mask, positions,
                                    segment_ids, local_L, train=train,
                                    layer_axes=(0, None, None, None, None,
                                                None if local_L is None else 0))
  if model.ln in ("pre", "sandwich"):
    x_BxTxD = model.block_spec.make_norm("ln_f", train)(x_BxTxD)
  return x_BxTxD, new_cache


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
