"""A Hugging Face checkpoint's tensors <-> a jaxdl GPT's parameters, both directions, one tensor
at a time (the tables and the maths each row follows: `jaxdl.models.hf_families`' docstring; the
files and the entry points `load_hf` / `save_hf`: `jaxdl.models.hf`)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.models import hf_phi
from jaxdl.models.gpt import GPT
from jaxdl.models.hf_families import GPT2_PREFIX
from jaxdl.models.stack import unstack_layers
from jaxdl.schema import ConfigError

# Per layer: (jaxdl path under h_i, HF names concatenated along the output axis, transposed?).
_LLAMA_LAYER = (
    (("ln_1", "scale"), ("input_layernorm.weight",), False),
    (("attn", "c_attn", "kernel"), ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                    "self_attn.v_proj.weight"), True),
    (("attn", "c_attn", "bias"), ("self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                  "self_attn.v_proj.bias"), False),
    (("attn", "c_proj", "kernel"), ("self_attn.o_proj.weight",), True),
    (("attn", "c_proj", "bias"), ("self_attn.o_proj.bias",), False),
    (("attn", "q_norm", "scale"), ("self_attn.q_norm.weight",), False),
    (("attn", "k_norm", "scale"), ("self_attn.k_norm.weight",), False),
    (("ln_2", "scale"), ("post_attention_layernorm.weight",), False),
    (("mlp", "c_fc", "kernel"), ("mlp.gate_proj.weight", "mlp.up_proj.weight"), True),
    (("mlp", "c_fc", "bias"), ("mlp.gate_proj.bias", "mlp.up_proj.bias"), False),
    (("mlp", "c_proj", "kernel"), ("mlp.down_proj.weight",), True),
    (("mlp", "c_proj", "bias"), ("mlp.down_proj.bias",), False))
# Gemma 2, 3 (ln='sandwich'): post_attention_layernorm closes the attention branch, and the MLP
# has its input and output norms; these replace _LLAMA_LAYER's ln_2 row.
_SANDWICH_NORMS = (
    (("ln_1_post", "scale"), ("post_attention_layernorm.weight",), False),
    (("ln_2", "scale"), ("pre_feedforward_layernorm.weight",), False),
    (("ln_2_post", "scale"), ("post_feedforward_layernorm.weight",), False))
_GPT2_LAYER = (
    (("ln_1", "scale"), ("ln_1.weight",), False), (("ln_1", "bias"), ("ln_1.bias",), False),
    (("attn", "c_attn", "kernel"), ("attn.c_attn.weight",), False),
    (("attn", "c_attn", "bias"), ("attn.c_attn.bias",), False),
    (("attn", "c_proj", "kernel"), ("attn.c_proj.weight",), False),
    (("attn", "c_proj", "bias"), ("attn.c_proj.bias",), False),
    (("ln_2", "scale"), ("ln_2.weight",), False), (("ln_2", "bias"), ("ln_2.bias",), False),
    (("mlp", "c_fc", "kernel"), ("mlp.c_fc.weight",), False),
    (("mlp", "c_fc", "bias"), ("mlp.c_fc.bias",), False),
    (("mlp", "c_proj", "kernel"), ("mlp.c_proj.weight",), False),
    (("mlp", "c_proj", "bias"), ("mlp.c_proj.bias",), False))
# Tensors checkpoints carry that hold nothing to import: old Llama's RoPE buffer, GPT-2's causal
# mask buffers and its tied head.
_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$|^h\.\d+\.attn\.(bias|masked_bias)$")



def _table(model: GPT, model_type: str):
  """({HF name: torch shape}, [(jaxdl path unrolled, HF names, transposed?)]) of every tensor a
  `model_type` checkpoint of `model` holds (module docstring)."""
  d, v, f = model.d_model, model.vocab_size, model.mlp_width
  if model_type == "gpt2":
    top = {"wte.weight": (("wte", "embedding"), (v, d)),
           "wpe.weight": (("wpe", "embedding"), (model.block_size, d)),
           "ln_f.weight": (("ln_f", "scale"), (d,)), "ln_f.bias": (("ln_f", "bias"), (d,))}
    per_layer = dict(zip((m[1][0] for m in _GPT2_LAYER),
                         ((d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, f),
                          (f,), (f, d), (d,))))
    layer, prefix = _GPT2_LAYER, "h.{i}."
  else:
    k = model.head_width
    q, kv = model.n_head * k, model.kv_heads * k
    top = {"model.embed_tokens.weight": (("wte", "embedding"), (v, d)),
           "model.norm.weight": (("ln_f", "scale"), (d,))}
    if not model.tie_embeddings:
      top["lm_head.weight"] = (("lm_head", "kernel"), (v, d))
    per_layer = {"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,),
                 "self_attn.q_proj.weight": (q, d), "self_attn.k_proj.weight": (kv, d),
                 "self_attn.v_proj.weight": (kv, d), "self_attn.o_proj.weight": (d, q),
                 "mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d),
                 "mlp.down_proj.weight": (d, f)}
    if model.qkv_bias or model.attn_bias:
      per_layer.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
                        "self_attn.v_proj.bias": (kv,)})
    if model.attn_bias:
      per_layer["self_attn.o_proj.bias"] = (d,)
    if model.mlp_bias:
      per_layer.update({"mlp.gate_proj.bias": (f,), "mlp.up_proj.bias": (f,),
                        "mlp.down_proj.bias": (d,)})
    if model.qk_norm:
      per_layer.update({"self_attn.q_norm.weight": (k,), "self_attn.k_norm.weight": (k,)})
    rows = _LLAMA_LAYER
    if model.ln == "sandwich":
      per_layer.update({"pre_feedforward_layernorm.weight": (d,),
                        "post_feedforward_layernorm.weight": (d,)})
      rows = tuple(r for r in rows if r[0] != ("ln_2", "scale")) + _SANDWICH_NORMS
    layer = [row for row in rows if row[1][0] in per_layer]
    if model_type == "phi3":
      per_layer, layer = hf_phi.fuse(per_layer, layer)
    prefix = "model.layers.{i}."
  shapes = {name: shape for name, (_, shape) in top.items()}
  items = [(path, (name,), name == "lm_head.weight") for name, (path, _) in top.items()]
  for i in range(model.n_layer):
    shapes.update({prefix.format(i=i) + k: s for k, s in per_layer.items()})
    items += [((f"h_{i}",) + path, tuple(prefix.format(i=i) + n for n in names), transposed)
              for path, names, transposed in layer]
  return shapes, items


def _names(names: list[str], most: int = 4) -> str:
  return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def to_params(tensors, model: GPT, model_type: str, where: str = "weights",
              shardings=None) -> dict:
  """A `model_type` state dict (HF names) -> params of `model` (its scan_layers layout), as jax
  arrays in `model.param_dtype`.

  `tensors` maps names to arrays or to lazily read tensors (`jaxdl.models.hf.index_weights`:
  anything with .shape that np.asarray reads), so only the shapes are looked at before the
  checks pass. Memory: each parameter is assembled alone, largest first, and placed on the
  device before the next is read; a scanned stack is filled layer by layer in place (a donated
  update), so the host holds the finished parameters plus one layer's tensors at a time.
  `shardings` (a tree like the params, or `fn(path tuple) -> Sharding or None`) places each
  parameter straight into its sharding (fsdp, tensor) instead of the default device.
  One-line ConfigError naming the missing, misshaped or unexpected tensors."""
  if model_type == "gpt2":
    tensors = {k.removeprefix(GPT2_PREFIX): a for k, a in tensors.items()}
  want, items = _table(model, model_type)
  missing = [k for k in want if k not in tensors]
  misshaped = [f"{k} {tuple(tensors[k].shape)} (expected {want[k]})" for k in want
               if k in tensors and tuple(tensors[k].shape) != want[k]]
  tied_head = "lm_head.weight" if model.tie_embeddings else None
  extra = sorted(k for k in tensors if k not in want and k != tied_head and not _IGNORED.search(k))
  for label, bad in (("missing", missing), ("misshaped", misshaped), ("unexpected", extra)):
    if bad:
      raise ConfigError(f"{where}: {label} tensors for {model.n_layer} layers: {_names(bad)}")
  dtype = jnp.dtype(model.param_dtype)
  leaves = {}  # final path -> [(layer index or None, HF names, transposed)]
  for path, names, transposed in items:
    layer = re.fullmatch(r"h_(\d+)", path[0]) if model.scan_layers else None
    key = ("h",) + path[1:] if layer else path
    leaves.setdefault(key, []).append((int(layer.group(1)) if layer else None, names,
                                       transposed))
  size = lambda parts: sum(int(np.prod(want[n])) for _, names, _ in parts for n in names)  # noqa: E731
  params = {}
  for key, parts in sorted(leaves.items(), key=lambda kv: -size(kv[1])):
    sharding = _sharding_of(shardings, key)
    if parts[0][0] is None:
      value = jax.device_put(_part(tensors, parts[0][1], parts[0][2], dtype), sharding)
    else:  # one slice per layer into a stack allocated once (filled in order)
      first = _part(tensors, parts[0][1], parts[0][2], dtype)
      zeros, set_layer = _stack_ops(sharding)
      value = zeros((len(parts),) + first.shape, dtype)
      for i, names, transposed in parts:
        layer_part = first if i == 0 else _part(tensors, names, transposed, dtype)
        value = set_layer(value, layer_part, i)
        value.block_until_ready()  # bounds the host copies in flight to one layer's
      del first
    value.block_until_ready()
    node = params
    for p in key[:-1]:
      node = node.setdefault(p, {})
    node[key[-1]] = value
  return params


def _part(tensors, names, transposed: bool, dtype) -> np.ndarray:
  """One parameter (or one layer's slice) from its HF tensors, cast to `dtype`: the tensors
  read one by one, transposed, concatenated along the output axis (module docstring)."""
  arrays = [np.asarray(tensors[n]) for n in names]
  arrays = [a.T if transposed else a for a in arrays]
  if len(arrays) == 1:
    return np.ascontiguousarray(arrays[0], dtype=dtype)
  return np.concatenate(arrays, axis=-1, dtype=dtype)


def _sharding_of(shardings, key: tuple):
  if shardings is None or callable(shardings):
    return shardings(key) if shardings else None
  node = shardings
  for k in key:
    node = node[k]
  return node


def _zeros(shape, dtype):
  return jnp.zeros(shape, dtype)


def _set_layer(stack, part, i):
  """stack[i] = part, in place when the stack is donated."""
  return jax.lax.dynamic_update_index_in_dim(stack, part.astype(stack.dtype), i, 0)


_DEFAULT_STACK_OPS = (jax.jit(_zeros, static_argnums=(0, 1)),
                      jax.jit(_set_layer, donate_argnums=0))


def _stack_ops(sharding):
  """(zeros(shape, dtype), set_layer(stack, part, i), donating the stack) whose results have
  `sharding` (None: the default device, one compiled program per shape for every load)."""
  if sharding is None:
    return _DEFAULT_STACK_OPS
  return (jax.jit(_zeros, static_argnums=(0, 1), out_shardings=sharding),
          jax.jit(_set_layer, donate_argnums=0, out_shardings=sharding))


def to_tensors(params: dict, model: GPT, model_type: str, dtype=np.float32
               ) -> dict[str, np.ndarray]:
  """jaxdl params (scanned or unrolled) -> the `model_type` state dict with HF names (GPT-2's
  under 'transformer.', its tied head omitted as transformers saves it)."""
  params = jax.tree.map(np.asarray, params)  # indexed in numpy: no program per layer slice
  if "h" in params:
    params = unstack_layers(params, model.n_layer)
  shapes, items = _table(model, model_type)
  prefix = GPT2_PREFIX if model_type == "gpt2" else ""
  out = {}
  for path, names, transposed in items:
    value = params
    for p in path:
      value = value[p]
    value = np.asarray(value, np.float32)
    sizes = np.cumsum([shapes[n][0] for n in names])[:-1]  # each part's output rows
    for name, part in zip(names, np.split(value, sizes, axis=-1)):
      out[prefix + name] = np.ascontiguousarray(part.T if transposed else part).astype(dtype)
  return out
