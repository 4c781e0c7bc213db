"""LoRA: low-rank adapters beside a transformer's dense layers (Hu et al., 2021).

Shapes: D_in, D_out a dense layer's widths, r the rank, L layers.

An adapted dense layer computes, in the row-vector convention of `nn.Dense`,

  y = x W + b + (alpha / r) (x A) B,  A (D_in, r) ~ U(-1/sqrt(D_in), 1/sqrt(D_in)), B (r, D_out) = 0

so at initialization the adapted model is the base model exactly, and merging folds the product
into the base, W' = W + (alpha / r) A B (`merge`). Only A and B train; the base parameters
(`is_adapter` tells them apart by path) are frozen twice over: the GPT reads them through
`jax.lax.stop_gradient` (`freeze_base`: their gradients are symbolic zeros, so no weight
gradient of the base is computed), and the training chain leaves them out of the optimizer
state with a zero update (`trainable_predicate`, `jaxdl.optim.masks.freeze`).

The adaptable layers of a GPT block ("sites") are named by path:

  attn/q, attn/k, attn/v   the query, key and value columns of the fused `c_attn` (each its own
                           A, B; k and v have N K columns under grouped-query attention)
  attn/o                   the attention's output projection `c_proj`
  mlp/c_fc, mlp/c_proj     the MLP's two dense layers (not an MoE's experts)

`model.lora_targets` are patterns: one matches a site when it is one of the site's names ('q',
'attn', 'mlp', 'c_fc') or a regular expression matching the whole path ('attn/[qv]', 'mlp/.*').
A pattern that matches no site of the model is refused (`resolve_sites`).

The adapter of site 'attn/q' lives beside the layer it adapts, `.../attn/lora_q/{a, b}` (of
'mlp/c_fc', `.../mlp/lora_c_fc/{a, b}`); scanned layers stack them with a leading L axis as they
do every block parameter. The base parameters keep their names and shapes, so a base checkpoint
and the GPT-2 import apply unchanged.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxdl.schema import ConfigError

Dtype = Any
PREFIX = "lora_"
ATTENTION_SITES = ("attn/q", "attn/k", "attn/v", "attn/o")
MLP_SITES = ("mlp/c_fc", "mlp/c_proj")


@dataclasses.dataclass(frozen=True)
class LoraSpec:
  """The adapters of a model: rank r, alpha and the adapted sites (hashable, for `BlockSpec`)."""

  rank: int
  alpha: float
  sites: tuple[str, ...]

  @property
  def scale(self) -> float:
    return self.alpha / self.rank

  def adapts(self, site: str) -> bool:
    return site in self.sites


def resolve_sites(patterns, sites) -> tuple[str, ...]:
  """The sites (in `sites` order) that any of `patterns` matches (module docstring); a pattern
  matching none, a bad regular expression or no pattern at all is a one-line ConfigError."""
  names = sorted({part for site in sites for part in site.split("/")})
  where = (f"expected a name ({', '.join(names)}) or a regex over the paths "
           f"{', '.join(sites)}")
  if not patterns:
    raise ConfigError(f"model.lora_targets: no pattern given with lora_rank > 0; {where}")
  chosen = set()
  for p in patterns:
    try:
      rx = re.compile(p)
    except (re.error, TypeError) as e:
      raise ConfigError(f"model.lora_targets: bad pattern {p!r} ({e}); {where}") from None
    hits = {s for s in sites if p in s.split("/") or rx.fullmatch(s)}
    if not hits:
      raise ConfigError(f"model.lora_targets: {p!r} matches no adaptable layer of this model; "
                        f"{where}")
    chosen |= hits
  return tuple(s for s in sites if s in chosen)


def site_widths(model) -> dict[str, tuple[int, int]]:
  """(D_in, D_out) of each adaptable site of a transformer `model` (D width, H K query features
  (= D unless head_dim is set), N K key/value features, F = `mlp_width`; a gated MLP's c_fc
  (SwiGLU, GeGLU) is [gate, up], 2 F wide)."""
  d, k = model.d_model, model.head_width
  f = model.mlp_width
  f_in = 2 * f if model.mlp in ("swiglu", "geglu") else f
  q = model.n_head * k
  return {"attn/q": (d, q), "attn/k": (d, model.kv_heads * k), "attn/v": (d, model.kv_heads * k),
          "attn/o": (q, d), "mlp/c_fc": (d, f_in), "mlp/c_proj": (f, d)}


def check_rank(model) -> None:
  """Refuses lora_rank r above min(D_in, D_out) of an adapted layer, from the settings alone (no
  array is made): A B then has rank at most that, so a larger r adds parameters and nothing
  else, and an absurd r would only be found out of memory. One-line ConfigError."""
  spec = model.lora_spec
  if spec is None:
    return
  widths = site_widths(model)
  site = min(spec.sites, key=lambda s: min(widths[s]))
  most = min(widths[site])
  if spec.rank > most:
    d_in, d_out = widths[site]
    raise ConfigError(f"model.lora_rank: must be at most {most}, the narrower side of the adapted "
                      f"layer {site} ({d_in} -> {d_out}); got {spec.rank}")


class Lora(nn.Module):
  """delta(x) = scale (x A) B: the low-rank update beside a dense layer of `features` outputs."""

  features: int
  rank: int
  scale: float
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxTxDin):
    # variance_scaling(1/3, fan_in, uniform) is U(-1/sqrt(D_in), 1/sqrt(D_in)) (PEFT's A init).
    a = self.param("a", nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform"),
                   (x_BxTxDin.shape[-1], self.rank), self.param_dtype)
    b = self.param("b", nn.initializers.zeros, (self.rank, self.features), self.param_dtype)
    h_BxTxR = jnp.dot(x_BxTxDin.astype(self.dtype), a.astype(self.dtype))
    return self.scale * jnp.dot(h_BxTxR, b.astype(self.dtype))


def adapter(spec: LoraSpec | None, site: str, features: int, dtype, param_dtype) -> Callable:
  """`x -> delta` of `site` (call inside the compact method of the module owning the site), or
  None when `spec` does not adapt it."""
  if spec is None or not spec.adapts(site):
    return None
  # Float32 (or wider) adapters even beside a bf16 frozen base (model.param_dtype=bfloat16):
  # their small updates would round away in bf16, and they are few.
  return Lora(features, spec.rank, spec.scale, dtype, jnp.promote_types(param_dtype, jnp.float32),
              name=PREFIX + site.rsplit("/", 1)[-1])


# ---------------------------------------------------------------------------------------------
# Parameters: which train, and merging.


def is_adapter(path: str) -> bool:
  """Whether the parameter at `path` ('h/attn/lora_q/a') is an adapter's."""
  return any(part.startswith(PREFIX) for part in path.split("/"))


def freeze_base(params):
  """`params` with every non-adapter leaf behind `jax.lax.stop_gradient` (same values)."""
  return jax.tree_util.tree_map_with_path(
      lambda p, x: x if is_adapter(path_str(p)) else jax.lax.stop_gradient(x), params)


def path_str(path) -> str:
  """'h/attn/lora_q/a' from a jax key path of dict keys."""
  return "/".join(str(getattr(k, "key", k)) for k in path)


def trainable_predicate(model) -> Callable[[str], bool] | None:
  """`path -> trains?` for a model with adapters (only adapter leaves train), else None (every
  parameter trains)."""
  return is_adapter if getattr(model, "lora_spec", None) is not None else None


def merge(model, params) -> tuple[Any, dict]:
  """(base model, params with W' = W + (alpha / r) A B folded into every adapted kernel).

  The base model is `model` with lora_rank=0; its params tree is the base tree (adapters
  removed), so the merged model computes the adapted one up to rounding."""
  spec = model.lora_spec
  if spec is None:
    return model, params
  h, n = model.n_head, model.kv_heads
  k = model.head_width
  self_attn = {"q": ("c_attn", 0, h * k), "k": ("c_attn", h * k, n * k),
               "v": ("c_attn", (h + n) * k, n * k)}
  cross_attn = {"q": ("q_proj", 0, h * k), "k": ("kv_proj", 0, n * k),
                "v": ("kv_proj", n * k, n * k)}
  whole = {"o": "c_proj", "c_fc": "c_fc", "c_proj": "c_proj"}

  def fold(node):
    if not isinstance(node, Mapping):
      return node
    out = {key: fold(v) for key, v in node.items() if not key.startswith(PREFIX)}
    for key, ad in node.items():
      if not key.startswith(PREFIX):
        continue
      part = key[len(PREFIX):]
      if part in whole:
        dense, lo, width = whole[part], 0, None
      else:
        dense, lo, width = (self_attn if "c_attn" in out else cross_attn)[part]
      kernel = out[dense]["kernel"]
      delta = spec.scale * jnp.einsum("...dr,...rf->...df", ad["a"].astype(jnp.float32),
                                      ad["b"].astype(jnp.float32))
      hi = kernel.shape[-1] if width is None else lo + width
      kernel = kernel.at[..., lo:hi].add(delta.astype(kernel.dtype))
      out[dense] = {**out[dense], "kernel": kernel}
    return out

  return model.clone(lora_rank=0), fold(params)


def split(params) -> tuple[dict, dict]:
  """(adapter leaves, base leaves) of `params`, each a flat {path: array}."""
  flat = {path_str(p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}
  return ({p: x for p, x in flat.items() if is_adapter(p)},
          {p: x for p, x in flat.items() if not is_adapter(p)})
