"""Hugging Face model directories <-> jaxdl GPT: Llama, Mistral, Qwen2 and GPT-2.

`load_hf(dir) -> (model, params)` and `save_hf(dir, model, params)`. A directory holds
config.json and the weights, one model.safetensors or the shards that
model.safetensors.index.json names ({"weight_map": {tensor: file}}); the tokenizer.json beside
them is `jaxdl.data.tokenize.load_hf_tokenizer`'s.

Llama family (model_type llama, mistral, qwen2) = GPT(pos='rope', norm='rms', mlp='swiglu',
ln='pre', use_bias=False; qkv_bias=True for Qwen2). A torch Linear holds W (out, in) and computes
x W^T, a flax Dense kernel is (in, out): every projection is transposed. Per layer i (h_i
unrolled; scanned, index i of h's leading axis), prefix model.layers.{i}.:
  input_layernorm.weight (D,)                -> h_i.ln_1.scale
  self_attn.{q,k,v}_proj.weight (HK|NK|NK, D) -> h_i.attn.c_attn.kernel = [q^T k^T v^T] (D, (H+2N)K)
  self_attn.{q,k,v}_proj.bias (Qwen2)        -> h_i.attn.c_attn.bias = [q k v]
  self_attn.o_proj.weight (D, HK)            -> h_i.attn.c_proj.kernel = o^T
  post_attention_layernorm.weight (D,)       -> h_i.ln_2.scale
  mlp.{gate,up}_proj.weight (F, D)           -> h_i.mlp.c_fc.kernel = [gate^T up^T] (D, 2F)
  mlp.down_proj.weight (D, F)                -> h_i.mlp.c_proj.kernel = down^T
and model.embed_tokens.weight (V, D) -> wte.embedding, model.norm.weight -> ln_f.scale,
lm_head.weight (V, D) -> lm_head.kernel = lm_head^T (untied only; tied, the head is wte^T).
The maths agree term by term: RMSNorm w * x / sqrt(mean(x^2) + eps); RoPE rotates feature pairs
(j, j + K/2) ("rotate_half") by pos * theta^(-2j/K); query head h reads key/value head
h // (H/N) (HF's repeat_kv); MLP down(silu(gate x) * (up x)).

config.json -> GPT: hidden_size d_model, intermediate_size mlp_hidden, num_attention_heads
n_head, num_key_value_heads n_kv_head, num_hidden_layers n_layer, vocab_size, rms_norm_eps
epsilon, rope_theta (or rope_parameters.rope_theta) rope_theta, tie_word_embeddings
tie_embeddings (absent: tied iff the weights have no lm_head.weight), max_position_embeddings
block_size. Refused, in one line naming the field:
hidden_act other than silu, any RoPE scaling, head_dim != hidden_size / heads, attention_bias or
mlp_bias (Llama's all-projection biases), quantization. A sliding window W (Mistral; Qwen2 with
use_sliding_window) lets position i see j only when i - j < W, which never binds on W tokens or
fewer: the import sets block_size = min(max_position_embeddings, W), so a longer input is refused
by the model instead of computed differently (an export writes no window: block_size bounds it).

GPT-2 (model_type gpt2) goes through the same entry points with `convert.py`'s mapping.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.models import convert
from jaxdl.models.gpt import GPT
from jaxdl.models.transformer import unstack_layers
from jaxdl.schema import ConfigError

LLAMA_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
               "qwen2": "Qwen2ForCausalLM"}
MODEL_TYPES = tuple(LLAMA_TYPES) + ("gpt2",)
INDEX = "model.safetensors.index.json"

# Per layer: (jaxdl path under h_i, HF names concatenated along the output axis, transposed?).
_LAYER = ((("ln_1", "scale"), ("input_layernorm.weight",), False),
          (("attn", "c_attn", "kernel"), ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                          "self_attn.v_proj.weight"), True),
          (("attn", "c_attn", "bias"), ("self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                        "self_attn.v_proj.bias"), False),
          (("attn", "c_proj", "kernel"), ("self_attn.o_proj.weight",), True),
          (("ln_2", "scale"), ("post_attention_layernorm.weight",), False),
          (("mlp", "c_fc", "kernel"), ("mlp.gate_proj.weight", "mlp.up_proj.weight"), True),
          (("mlp", "c_proj", "kernel"), ("mlp.down_proj.weight",), True))
# Tensors some checkpoints carry that hold nothing to import (old Llama's RoPE buffer).
_IGNORED = ("rotary_emb.inv_freq",)


def _refuse(where: str, field: str, value, expected: str):
  raise ConfigError(f"{where}: {field}={json.dumps(value)} cannot be imported; expected {expected}")


def read_config(directory: str) -> dict:
  """config.json of a Hugging Face model directory, refusing a missing or unreadable one."""
  path = os.path.join(directory, "config.json")
  if not os.path.isfile(path):
    raise ConfigError(f"{directory}: no config.json (expected a Hugging Face model directory)")
  try:
    with open(path, encoding="utf-8") as f:
      cfg = json.load(f)
  except (OSError, ValueError) as e:
    raise ConfigError(f"{path}: unreadable ({type(e).__name__}: {e})".splitlines()[0]) from None
  if cfg.get("model_type") not in MODEL_TYPES:
    _refuse(path, "model_type", cfg.get("model_type"), f"one of {', '.join(MODEL_TYPES)}")
  return cfg


def _rope_theta(cfg: dict, where: str) -> float:
  """The RoPE base of a v4 (rope_theta, rope_scaling) or v5 (rope_parameters) config."""
  if cfg.get("rope_scaling") not in (None, {}):
    _refuse(where, "rope_scaling", cfg["rope_scaling"], "null (RoPE scaling is not implemented)")
  rp = cfg.get("rope_parameters") or {}
  if not isinstance(rp, dict) or set(rp) - {"rope_type", "type", "rope_theta"}:
    _refuse(where, "rope_parameters", rp, "only rope_type 'default' and rope_theta")
  kind = rp.get("rope_type", rp.get("type", "default"))
  if kind != "default":
    _refuse(where, "rope_parameters.rope_type", kind, "'default' (RoPE scaling is not implemented)")
  theta = rp.get("rope_theta")
  if theta is None:
    theta = cfg.get("rope_theta")
  return float(10000.0 if theta is None else theta)  # transformers' base where none is stated


def model_from_config(cfg: dict, where: str = "config.json", **overrides) -> GPT:
  """The GPT a Hugging Face config describes (module docstring); `overrides` are GPT fields."""
  def need(key):
    if cfg.get(key) is None:
      raise ConfigError(f"{where}: {key} is missing")
    return cfg[key]

  if cfg["model_type"] == "gpt2":
    act = cfg.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
      _refuse(where, "activation_function", act, "gelu_new (the tanh GELU)")
    d = need("n_embd")
    if cfg.get("n_inner") not in (None, 4 * d):
      _refuse(where, "n_inner", cfg["n_inner"], f"null or {4 * d} (4 n_embd)")
    for key, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                    ("add_cross_attention", False)):
      if cfg.get(key, ok) != ok:
        _refuse(where, key, cfg[key], json.dumps(ok))
    fields = dict(vocab_size=need("vocab_size"), block_size=need("n_positions"),
                  n_layer=need("n_layer"), n_head=need("n_head"), d_model=d,
                  epsilon=cfg.get("layer_norm_epsilon", 1e-5))
    return GPT(**{**fields, **overrides})

  if cfg.get("hidden_act", "silu") != "silu":
    _refuse(where, "hidden_act", cfg["hidden_act"], "silu (the SwiGLU MLP)")
  for key in ("attention_bias", "mlp_bias"):
    if cfg.get(key):
      _refuse(where, key, cfg[key], "false (Llama's biased projections are not implemented)")
  if cfg.get("quantization_config"):
    _refuse(where, "quantization_config", sorted(cfg["quantization_config"]),
            "none (unquantized weights)")
  d, h = need("hidden_size"), need("num_attention_heads")
  if cfg.get("head_dim") not in (None, d // h) or d % h:
    _refuse(where, "head_dim", cfg.get("head_dim"), f"hidden_size / num_attention_heads = {d / h}")
  block = need("max_position_embeddings")
  window = cfg.get("sliding_window")
  if cfg["model_type"] == "qwen2" and not (cfg.get("use_sliding_window") or
                                           "sliding_attention" in (cfg.get("layer_types") or ())):
    window = None
  fields = dict(vocab_size=need("vocab_size"), block_size=min(block, window or block),
                n_layer=need("num_hidden_layers"), n_head=h,
                n_kv_head=cfg.get("num_key_value_heads") or h, d_model=d,
                mlp_hidden=need("intermediate_size"), epsilon=cfg.get("rms_norm_eps", 1e-6),
                rope_theta=_rope_theta(cfg, where), tie_embeddings=bool(
                    cfg.get("tie_word_embeddings", False)),
                pos="rope", norm="rms", mlp="swiglu", ln="pre", use_bias=False,
                qkv_bias=cfg["model_type"] == "qwen2")
  return GPT(**{**fields, **overrides})


def read_weights(directory: str) -> dict[str, np.ndarray]:
  """Every tensor of model.safetensors, or of the shards model.safetensors.index.json names."""
  index = os.path.join(directory, INDEX)
  if os.path.isfile(index):
    with open(index, encoding="utf-8") as f:
      weight_map = json.load(f).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
      raise ConfigError(f"{index}: no weight_map (expected {{tensor name: shard file}})")
    files = sorted(set(weight_map.values()))
  elif os.path.isfile(os.path.join(directory, "model.safetensors")):
    files = ["model.safetensors"]
  else:
    raise ConfigError(f"{directory}: no model.safetensors or {INDEX}")
  tensors = {}
  for name in files:
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
      raise ConfigError(f"{index}: shard {name} is missing from {directory}")
    try:
      tensors.update(convert.read_safetensors(path))
    except ValueError as e:
      raise ConfigError(str(e).splitlines()[0]) from None
  return tensors


def _dims(model: GPT) -> tuple[int, int, int, int]:
  """(head width K, query width HK, key/value width NK, MLP width F) of `model`."""
  k = model.d_model // model.n_head
  return k, model.n_head * k, model.kv_heads * k, model.mlp_hidden or 8 * model.d_model // 3


def _hf_shapes(model: GPT) -> dict[str, tuple]:
  """The HF name and torch shape of every tensor a Llama-family checkpoint of `model` holds."""
  _, q, kv, f = _dims(model)
  d, v = model.d_model, model.vocab_size
  per_layer = {"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,),
               "self_attn.q_proj.weight": (q, d), "self_attn.k_proj.weight": (kv, d),
               "self_attn.v_proj.weight": (kv, d), "self_attn.o_proj.weight": (d, q),
               "mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d),
               "mlp.down_proj.weight": (d, f)}
  if model.qkv_bias:
    per_layer.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
                      "self_attn.v_proj.bias": (kv,)})
  out = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
  if not model.tie_embeddings:
    out["lm_head.weight"] = (v, d)
  for i in range(model.n_layer):
    out.update({f"model.layers.{i}.{k}": s for k, s in per_layer.items()})
  return out


def _items(model: GPT):
  """(jaxdl path in the unrolled layout, HF names, transposed?) for every parameter."""
  yield ("wte", "embedding"), ("model.embed_tokens.weight",), False
  yield ("ln_f", "scale"), ("model.norm.weight",), False
  if not model.tie_embeddings:
    yield ("lm_head", "kernel"), ("lm_head.weight",), True
  for i in range(model.n_layer):
    for path, names, transposed in _LAYER:
      if path[-1] == "bias" and not model.qkv_bias:
        continue
      yield (f"h_{i}",) + path, tuple(f"model.layers.{i}.{n}" for n in names), transposed


def _names(names: list[str], most: int = 4) -> str:
  return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def llama_to_params(tensors: dict[str, np.ndarray], model: GPT, where: str = "weights") -> dict:
  """Llama-family state dict (HF names) -> params of `model` (its scan_layers layout).

  One-line ConfigError naming the missing, misshaped or unexpected tensors."""
  want = _hf_shapes(model)
  missing = [k for k in want if k not in tensors]
  misshaped = [f"{k} {tuple(tensors[k].shape)} (expected {want[k]})" for k in want
               if k in tensors and tuple(tensors[k].shape) != want[k]]
  skip = ("lm_head.weight",) if model.tie_embeddings else ()
  extra = sorted(k for k in tensors if k not in want and k not in skip
                 and not k.endswith(_IGNORED))
  for label, bad in (("missing", missing), ("misshaped", misshaped), ("unexpected", extra)):
    if bad:
      raise ConfigError(f"{where}: {label} tensors for {model.n_layer} layers: {_names(bad)}")
  params = {}
  for path, names, transposed in _items(model):
    parts = [np.asarray(tensors[n], np.float32) for n in names]
    value = np.concatenate([p.T if transposed else p for p in parts], axis=-1)
    node = params
    for p in path[:-1]:
      node = node.setdefault(p, {})
    node[path[-1]] = value
  if model.scan_layers:  # stacked in numpy: jnp.stack would compile a program per shape
    layers = [params.pop(f"h_{i}") for i in range(model.n_layer)]
    params["h"] = jax.tree.map(lambda *a: np.stack(a), *layers)
  return jax.tree.map(lambda a: jnp.asarray(a, model.param_dtype), params)


def params_to_llama(params: dict, model: GPT, dtype=np.float32) -> dict[str, np.ndarray]:
  """jaxdl params (scanned or unrolled) -> the Llama-family state dict with HF names."""
  params = jax.tree.map(np.asarray, params)  # indexed in numpy: no program per layer slice
  if "h" in params:
    params = unstack_layers(params, model.n_layer)
  shapes, out = _hf_shapes(model), {}
  for path, names, transposed in _items(model):
    value = params
    for p in path:
      value = value[p]
    value = np.asarray(value, np.float32)
    sizes = np.cumsum([shapes[n][0] for n in names])[:-1]  # each part's output rows
    for name, part in zip(names, np.split(value, sizes, axis=-1)):
      out[name] = np.ascontiguousarray(part.T if transposed else part).astype(dtype)
  return out


def hf_config(model: GPT, model_type: str) -> dict:
  """config.json for `model` as `model_type` (transformers 4 and 5 both read it)."""
  if model_type == "gpt2":
    return convert.hf_config(model)
  k, _, _, f = _dims(model)
  cfg = {"architectures": [LLAMA_TYPES[model_type]], "model_type": model_type,
         "vocab_size": model.vocab_size, "hidden_size": model.d_model, "intermediate_size": f,
         "num_hidden_layers": model.n_layer, "num_attention_heads": model.n_head,
         "num_key_value_heads": model.kv_heads, "hidden_act": "silu",
         "max_position_embeddings": model.block_size, "rms_norm_eps": model.epsilon,
         "rope_theta": model.rope_theta, "rope_scaling": None,
         "tie_word_embeddings": model.tie_embeddings, "torch_dtype": "float32"}
  if model_type == "qwen2":
    cfg.update(use_sliding_window=False, sliding_window=None)
  else:
    cfg.update(head_dim=k, attention_bias=False, mlp_bias=False)
    if model_type == "mistral":
      cfg["sliding_window"] = None
  return cfg


def _export_type(model: GPT, model_type: str | None) -> str:
  """The model_type `model` is saved as, refusing a model no supported layout holds."""
  if model_type is not None and model_type not in MODEL_TYPES:
    raise ConfigError(f"model_type: {model_type!r}; expected one of {', '.join(MODEL_TYPES)}")
  if model.lora_rank:
    raise ConfigError("model.lora_rank: the adapters must be merged first (lora.merge), got "
                      f"{model.lora_rank}")
  if model.pos == "learned" and model_type in (None, "gpt2"):
    return "gpt2"  # convert._check_gpt2_layout refuses what else differs from GPT-2
  want = dict(pos="rope", norm="rms", mlp="swiglu", ln="pre", use_bias=False, qk_norm=False,
              moe_experts=0, mixer="attention")
  for key, value in want.items():
    if getattr(model, key) != value:
      raise ConfigError(f"model.{key}: a Llama-family checkpoint needs {value!r}, got "
                        f"{getattr(model, key)!r}")
  model_type = model_type or ("qwen2" if model.qkv_bias else "llama")
  if model.qkv_bias != (model_type == "qwen2"):
    raise ConfigError(f"model.qkv_bias: {model_type} checkpoints have "
                      f"{'' if model_type == 'qwen2' else 'no '}query/key/value biases, got "
                      f"{model.qkv_bias}")
  return model_type


def write_weights(directory: str, tensors: dict[str, np.ndarray],
                  max_shard_bytes: int | None = None) -> list[str]:
  """model.safetensors, or with `max_shard_bytes` shards model-0000i-of-0000n.safetensors of at
  most that size (a larger tensor alone) and model.safetensors.index.json; returns the files."""
  names = sorted(tensors)
  shards, size = [[]], 0
  for name in names:
    n = tensors[name].nbytes
    if max_shard_bytes and shards[-1] and size + n > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append(name)
    size += n
  if not max_shard_bytes or len(shards) == 1:
    files = {"model.safetensors": names}
    if os.path.exists(os.path.join(directory, INDEX)):  # a stale index would be read first
      os.remove(os.path.join(directory, INDEX))
  else:
    files = {f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors": s
             for i, s in enumerate(shards)}
    index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))},
             "weight_map": {n: f for f, s in files.items() for n in s}}
    with open(os.path.join(directory, INDEX), "w", encoding="utf-8") as f:
      json.dump(index, f, indent=2)
  for name, members in files.items():
    convert.write_safetensors(os.path.join(directory, name), {n: tensors[n] for n in members},
                              {"format": "pt"})  # transformers reads only 'pt'-format files
  return list(files)


def load_hf(path: str, *, scan_layers: bool = True, dtype=jnp.float32, **overrides
            ) -> tuple[GPT, dict]:
  """A Hugging Face model directory (module docstring) -> (GPT, params in param_dtype).

  `dtype` is the compute dtype; `overrides` set other GPT fields (attn_impl, dropout, ...)."""
  cfg = read_config(path)
  model = model_from_config(cfg, os.path.join(path, "config.json"), scan_layers=scan_layers,
                            dtype=dtype, **overrides)
  tensors = read_weights(path)
  if "tie_word_embeddings" not in cfg and cfg["model_type"] != "gpt2":
    # Its default moved (transformers 4: tied, 5: untied): a head in the weights says untied.
    model = model.clone(tie_embeddings="lm_head.weight" not in tensors)
  if cfg["model_type"] == "gpt2":
    try:
      return model, convert.gpt2_to_params(tensors, model)
    except ValueError as e:
      raise ConfigError(f"{path}: {e}".splitlines()[0]) from None
  return model, llama_to_params(tensors, model, path)


def save_hf(out_dir: str, model: GPT, params: dict, *, model_type: str | None = None,
            max_shard_bytes: int | None = None, dtype=np.float32) -> list[str]:
  """Writes config.json and the weights (sharded past `max_shard_bytes`) for `transformers`.

  model_type: 'llama' / 'mistral' / 'qwen2' / 'gpt2'; default gpt2 for learned positions, else
  qwen2 with qkv_bias and llama without. Returns the weight files written."""
  model_type = _export_type(model, model_type)
  if model_type == "gpt2":
    try:
      tensors = convert.params_to_gpt2(params, model, dtype=dtype)
    except ValueError as e:
      raise ConfigError(str(e).splitlines()[0]) from None
  else:
    tensors = params_to_llama(params, model, dtype)
  os.makedirs(out_dir, exist_ok=True)
  files = write_weights(out_dir, tensors, max_shard_bytes)
  cfg = hf_config(model, model_type)
  cfg["torch_dtype"] = np.dtype(dtype).name
  with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
    json.dump(cfg, f, indent=2)
  return files
