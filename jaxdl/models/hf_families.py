"""What a Hugging Face checkpoint of each supported family means as a jaxdl GPT: its config.json
fields and its tensor table, both directions. The files themselves (safetensors, shards) and the
entry points `load_hf` / `save_hf` are `jaxdl.models.hf`'s.

A family's table lists, for every parameter of the GPT (unrolled layout: h_i is layer i; the
scanned layout is index i of h's leading axis), the HF tensors it is made of, concatenated along
the output axis, and whether they are transposed: a torch Linear holds W (out, in) and computes
x W^T, a flax Dense kernel is (in, out).

GPT-2 (model_type gpt2) = GPT's defaults (learned positions, LayerNorm, tanh-GELU MLP of 4 D,
biases, tied head). Names under GPT2LMHeadModel's 'transformer.' (read with or without it);
Conv1D stores (in, out), already a Dense kernel, so nothing is transposed:
  wte.weight (V, D) -> wte.embedding         wpe.weight (S, D) -> wpe.embedding
  h.{i}.ln_1.{weight,bias} -> h_i.ln_1.{scale,bias}      (likewise ln_2, ln_f)
  h.{i}.attn.c_attn.{weight (D, 3D), bias} -> h_i.attn.c_attn.{kernel, bias}
  h.{i}.attn.c_proj / mlp.c_fc / mlp.c_proj -> h_i.attn.c_proj / h_i.mlp.c_fc / h_i.mlp.c_proj
Buffers (attn.bias, attn.masked_bias) and the tied lm_head.weight hold nothing to import.

Llama family (model_type llama, mistral, qwen2, qwen3, phi3) = GPT(pos='rope', norm='rms',
mlp='swiglu', ln='pre', use_bias=False; qkv_bias=True for Qwen2, qk_norm=True for Qwen3,
attn_bias / mlp_bias for Llama's attention_bias / mlp_bias). K is head_dim (config.json's, else
hidden / heads), so H K need not be D. Phi-3 (Phi-4-mini) fuses q/k/v and gate/up into one
tensor each and adds LongRoPE and partial rotary: `jaxdl.models.hf_phi`. Per layer, prefix
model.layers.{i}.:
  input_layernorm.weight (D,)                -> h_i.ln_1.scale
  self_attn.{q,k,v}_proj.weight (HK|NK|NK, D) -> h_i.attn.c_attn.kernel = [q^T k^T v^T] (D, (H+2N)K)
  self_attn.{q,k,v}_proj.bias (Qwen2)        -> h_i.attn.c_attn.bias = [q k v]
  self_attn.{q,k}_norm.weight (K,) (Qwen3)   -> h_i.attn.{q,k}_norm.scale (RMSNorm of each head,
                                                before RoPE, epsilon rms_norm_eps)
  self_attn.o_proj.weight (D, HK)            -> h_i.attn.c_proj.kernel = o^T
  self_attn.o_proj.bias (attention_bias)     -> h_i.attn.c_proj.bias (and q/k/v's, as Qwen2's)
  mlp.{gate,up,down}_proj.bias (mlp_bias)    -> h_i.mlp.c_fc.bias = [gate up], c_proj.bias
  post_attention_layernorm.weight (D,)       -> h_i.ln_2.scale
  mlp.{gate,up}_proj.weight (F, D)           -> h_i.mlp.c_fc.kernel = [gate^T up^T] (D, 2F)
  mlp.down_proj.weight (D, F)                -> h_i.mlp.c_proj.kernel = down^T
and model.embed_tokens.weight (V, D) -> wte.embedding, model.norm.weight -> ln_f.scale,
lm_head.weight (V, D) -> lm_head.kernel = lm_head^T (untied only; tied, the head is wte^T).
The maths agree term by term: RMSNorm w * x / sqrt(mean(x^2) + eps); RoPE rotates feature pairs
(j, j + K/2) ("rotate_half") by pos * theta^(-2j/K); query head h reads key/value head
h // (H/N) (HF's repeat_kv); MLP down(silu(gate x) * (up x)).

config.json -> GPT, Llama family: hidden_size d_model, intermediate_size mlp_hidden,
num_attention_heads n_head, num_key_value_heads n_kv_head, num_hidden_layers n_layer,
vocab_size, rms_norm_eps epsilon, head_dim head_dim (0 when it is hidden / heads),
rope_theta (or rope_parameters.rope_theta) rope_theta, and the RoPE scaling of v4's rope_scaling
or v5's rope_parameters (`_rope`): rope_type linear / llama3 / yarn / dynamic (phi3: longrope)
-> rope_scaling, factor rope_factor, original_max_position_embeddings rope_original_max,
low_freq_factor, high_freq_factor, beta_fast, beta_slow, attention_factor ->
rope_low_freq_factor, ..., rope_attn_factor (frequencies: `rope.rope_frequencies`; dynamic's L
is max_position_embeddings, and the model's context L x factor), exported back as v4's
rope_theta + rope_scaling, which transformers 5 reads into rope_parameters;
tie_word_embeddings tie_embeddings (absent: tied iff the weights have no lm_head.weight),
max_position_embeddings block_size. GPT-2: n_embd, n_layer, n_head, n_positions, vocab_size,
layer_norm_epsilon. Refused, in one line naming the field: hidden_act other than silu, longrope
outside phi3 (and phi3's other types), a RoPE field the type does not read, YaRN's
truncate=false, partial_rotary_factor other than 1 outside phi3 (or rotating an odd number of
features), an odd head_dim, attention_bias or mlp_bias outside llama, quantization; for GPT-2
an activation other than the tanh GELU or n_inner other than 4 n_embd.
A sliding window W (Mistral's and Phi-3's sliding_window; Qwen2's with use_sliding_window) lets
position i see j only when i - j < W: it is the GPT's sliding_window, applied in the full forward
and in cached decoding, so a sequence runs past W as transformers computes it. Qwen2 windows the
layers i >= max_window_layers (or those layer_types calls 'sliding_attention'), Qwen3 the same
way: a mix of windowed and full layers is the GPT's attn_pattern (`layer_pattern`, the shortest
period of layer_types: 'l' windowed, 'g' full). An export writes the window back (Mistral:
sliding_window, every layer; Qwen2, Qwen3: use_sliding_window, layer_types and
max_window_layers). Gemma's configs are `jaxdl.models.hf_gemma`'s; `jaxdl.models.hf` dispatches
on model_type.
Special-token ids (bos_token_id, eos_token_id, pad_token_id) are not the model's: `special_ids`
reads them from generation_config.json / config.json, and an export writes them to both.
"""

from __future__ import annotations

import json
import math


from jaxdl.models import hf_phi, rope
from jaxdl.models.hf_errors import refuse
from jaxdl.models.gpt import GPT
from jaxdl.schema import ConfigError

LLAMA_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
               "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
               "phi3": hf_phi.ARCHITECTURE}
MODEL_TYPES = tuple(LLAMA_TYPES) + ("gpt2",)
GPT2_PREFIX = "transformer."  # GPT2LMHeadModel's names; the bare GPT2Model's lack it
# transformers' config-class defaults, where they are not the Llama family's (rms_norm_eps 1e-6,
# num_key_value_heads the heads'), for the fields a config.json may leave out.
_DEFAULTS = {"phi3": dict(rms_norm_eps=1e-5), "mistral": dict(num_key_value_heads=8),
             "qwen2": dict(num_key_value_heads=32, max_window_layers=28),
             "qwen3": dict(num_key_value_heads=32, max_window_layers=28)}



# ---------------------------------------------------------------------------------------------
# config.json <-> GPT.


# The fields each RoPE type reads (transformers' ROPE_INIT_FUNCTIONS), beside rope_type / type
# and rope_theta; any other is refused, naming it.
_ROPE_KEYS = {"default": (), "linear": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings"),
              "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                       "attention_factor", "mscale", "mscale_all_dim", "truncate"),
              "dynamic": ("factor",),
              "longrope": ("factor", "attention_factor", "short_factor", "long_factor",
                           "original_max_position_embeddings")}
_ROPE_FIELDS = {"factor": "rope_factor", "low_freq_factor": "rope_low_freq_factor",
                "high_freq_factor": "rope_high_freq_factor", "beta_fast": "rope_beta_fast",
                "beta_slow": "rope_beta_slow", "attention_factor": "rope_attn_factor",
                "original_max_position_embeddings": "rope_original_max"}


def _rope(cfg: dict, where: str) -> dict:
  """The GPT's RoPE fields (rope_theta, rope_scaling, rope_factor, ...) of a v4 (rope_theta,
  rope_scaling) or v5 (rope_parameters) config, as transformers reads them: the scaling's
  original_max_position_embeddings defaults to max_position_embeddings (phi3: `hf_phi`), YaRN's
  factor to max_position_embeddings / original_max_position_embeddings, and its attention_factor,
  when absent, is mscale(factor, mscale) / mscale(factor, mscale_all_dim) where both are given
  (mscale(s, m) = 0.1 m ln(s) + 1), else left to 0.1 ln(factor) + 1 (`rope.RopeSpec`). Dynamic
  NTK's L is max_position_embeddings, past which it scales, so the context (block_size) is
  L x factor, the length the scaling was set for (a larger one may be asked for)."""
  scaling, rp = cfg.get("rope_scaling") or {}, cfg.get("rope_parameters") or {}
  for key, value in (("rope_scaling", scaling), ("rope_parameters", rp)):
    if not isinstance(value, dict):
      refuse(where, key, value, "an object of RoPE settings or null")
  src = "rope_scaling" if scaling else "rope_parameters"  # the field errors name
  rp = {**rp, **scaling}  # v4's rope_scaling, where a file has both
  kind = rp.get("rope_type", rp.get("type", "default"))
  phi3 = cfg["model_type"] == "phi3"
  kind = hf_phi.rope_type(kind) if phi3 else kind
  allowed = hf_phi.ROPE_TYPES if phi3 else tuple(k for k in _ROPE_KEYS if k != "longrope")
  if kind not in allowed:
    refuse(where, f"{src}.rope_type", kind, ", ".join(map(repr, allowed)) +
           ("" if phi3 else " (longrope is Phi-3's, model_type phi3)"))
  extra = sorted(set(rp) - {"rope_type", "type", "rope_theta", "partial_rotary_factor"} -
                 set(_ROPE_KEYS[kind]))
  if extra:
    refuse(where, f"{src}.{extra[0]}", rp[extra[0]],
           f"only {', '.join(('rope_theta',) + _ROPE_KEYS[kind])} for rope_type {kind!r}")
  partial = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
  head = cfg.get("head_dim") or (cfg.get("hidden_size") or 0) // (cfg.get("num_attention_heads")
                                                                  or 1)
  number = isinstance(partial, (int, float)) and not isinstance(partial, bool)
  rotated = rope.rotary_width(rope.RopeSpec(partial=partial), head) if number else 0
  if partial != 1.0 and (not phi3 or not number or not 0 < partial <= 1 or rotated % 2 or
                         not rotated):
    refuse(where, "partial_rotary_factor", partial, f"a fraction f in (0, 1] rotating an even "
           f"int({head} f) features (model_type phi3), or 1.0 (every feature rotates)")
  theta = rp.get("rope_theta")
  theta = cfg.get("rope_theta") if theta is None else theta
  out = {"rope_theta": float(10000.0 if theta is None else theta),  # transformers' default
         "rope_scaling": "none" if kind == "default" else kind}
  if phi3:
    out["rope_partial"] = float(partial)
  orig = "original_max_position_embeddings"
  if kind in ("llama3", "yarn", "longrope"):
    # transformers' standardize_rope_params: a top-level original_max_position_embeddings wins.
    top = hf_phi.original_max(cfg) if phi3 else cfg.get(orig)
    rp[orig] = top or rp.get(orig) or cfg.get("max_position_embeddings")
  if kind == "dynamic":
    rp[orig] = cfg.get("max_position_embeddings")
    if isinstance(rp.get("factor"), (int, float)) and isinstance(rp[orig], int):
      out["block_size"] = int(rp[orig] * max(rp["factor"], 1.0))
  if kind == "longrope":
    out.update(hf_phi.longrope_fields(rp, cfg, where, src, rotated))
  if kind == "yarn":
    if rp.get("truncate", True) is not True:
      refuse(where, f"{src}.truncate", rp["truncate"], "true (YaRN's integer band)")
    if rp.get("factor") is None:
      rp["factor"] = cfg["max_position_embeddings"] / rp[orig]
    mscale, mscale_all = rp.get("mscale"), rp.get("mscale_all_dim")
    if rp.get("attention_factor") is None and mscale and mscale_all:
      m = lambda x: 0.1 * x * math.log(rp["factor"]) + 1.0 if rp["factor"] > 1 else 1.0  # noqa: E731
      rp["attention_factor"] = m(mscale) / m(mscale_all)
  for key, field in _ROPE_FIELDS.items():
    if kind != "default" and rp.get(key) is not None:
      value = rp[key]
      if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        refuse(where, f"{src}.{key}", value, "a positive number")
      out[field] = int(value) if field == "rope_original_max" else float(value)
  if kind != "default" and "rope_factor" not in out:
    refuse(where, f"{src}.factor", None, f"a positive number for rope_type {kind!r}")
  return out


def _rope_config(model: GPT) -> dict:
  """config.json's RoPE entries for `model`: rope_theta, and rope_scaling (null, or the type's
  fields) that transformers 4 reads as is and 5 folds into rope_parameters."""
  if model.rope_scaling == "none":
    return {"rope_theta": model.rope_theta, "rope_scaling": None}
  scaling = {"rope_type": model.rope_scaling, "factor": model.rope_factor}
  if model.rope_scaling in ("llama3", "yarn", "longrope"):
    scaling["original_max_position_embeddings"] = model.rope_spec.original_max
  if model.rope_scaling == "llama3":
    scaling.update(low_freq_factor=model.rope_low_freq_factor,
                   high_freq_factor=model.rope_high_freq_factor)
  if model.rope_scaling == "yarn":
    scaling.update(beta_fast=model.rope_beta_fast, beta_slow=model.rope_beta_slow)
  if model.rope_scaling == "longrope":
    scaling.update(short_factor=list(model.rope_short_factor),
                   long_factor=list(model.rope_long_factor))
  if model.rope_scaling in ("yarn", "longrope"):
    if model.rope_attn_factor:
      scaling["attention_factor"] = model.rope_attn_factor
  return {"rope_theta": model.rope_theta, "rope_scaling": scaling}


def layer_pattern(kinds, n_layer: int, where: str) -> str:
  """GPT's attn_pattern of config.json's layer_types ('sliding_attention' 'l', 'full_attention'
  'g'): its shortest period p (kinds[i] = kinds[i mod p]), so Gemma 2's is 'lg' and Gemma 3's
  'lllllg' however deep; another kind, or not one per layer, is refused."""
  names = {"sliding_attention": "l", "full_attention": "g"}
  if not isinstance(kinds, list) or len(kinds) != n_layer or any(k not in names for k in kinds):
    refuse(where, "layer_types", kinds, f"{n_layer} (num_hidden_layers) of 'sliding_attention' "
           "/ 'full_attention'")
  letters = "".join(names[k] for k in kinds)
  return next(letters[:p] for p in range(1, len(letters) + 1)
              if all(c == letters[i % p] for i, c in enumerate(letters)))


def layer_types(model: GPT) -> list[str]:
  """config.json's layer_types of `model` (`GPT.local_layers`): the inverse of `layer_pattern`."""
  return ["sliding_attention" if local else "full_attention" for local in model.local_layers]


def _window(cfg: dict, where: str) -> dict:
  """The GPT's sliding_window and attn_pattern of a Mistral, Qwen2 or Phi-3 config (docstring)."""
  if cfg["model_type"] not in ("mistral", "qwen2", "qwen3", "phi3"):
    return {}
  qwen = cfg["model_type"] in ("qwen2", "qwen3")
  window = cfg.get("sliding_window")
  if qwen and not cfg.get("use_sliding_window"):
    window = None  # transformers' Qwen2Config drops the window unless use_sliding_window
  if not window:
    return {}
  if not isinstance(window, int) or window < 0:
    refuse(where, "sliding_window", window, "a positive number of tokens or null")
  # MistralForCausalLM windows every layer whatever layer_types says (transformers warns).
  kinds = cfg.get("layer_types") if qwen else None
  n = cfg.get("num_hidden_layers") or 0
  if qwen and not kinds:
    first = cfg.get("max_window_layers", 0) or 0
    kinds = ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
  pattern = layer_pattern(kinds, n, where) if kinds else "l"
  if "l" not in pattern:
    return {}
  return {"sliding_window": window, "attn_pattern": "" if pattern == "l" else pattern}


def model_from_config(cfg: dict, where: str = "config.json", **overrides) -> GPT:
  """The GPT a Hugging Face config describes (module docstring); `overrides` are GPT fields."""
  def need(key):
    if cfg.get(key) is None:
      raise ConfigError(f"{where}: {key} is missing")
    return cfg[key]

  if cfg["model_type"] == "gpt2":
    act = cfg.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
      refuse(where, "activation_function", act, "gelu_new (the tanh GELU)")
    d = need("n_embd")
    if cfg.get("n_inner") not in (None, 4 * d):
      refuse(where, "n_inner", cfg["n_inner"], f"null or {4 * d} (4 n_embd)")
    for key, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                    ("add_cross_attention", False)):
      if cfg.get(key, ok) != ok:
        refuse(where, key, cfg[key], json.dumps(ok))
    fields = dict(vocab_size=need("vocab_size"), block_size=need("n_positions"),
                  n_layer=need("n_layer"), n_head=need("n_head"), d_model=d,
                  epsilon=cfg.get("layer_norm_epsilon", 1e-5))
    return GPT(**{**fields, **overrides})

  cfg = {**_DEFAULTS.get(cfg["model_type"], {}), **cfg}
  if cfg.get("hidden_act", "silu") != "silu":
    refuse(where, "hidden_act", cfg["hidden_act"], "silu (the SwiGLU MLP)")
  llama = cfg["model_type"] == "llama"
  for key in ("attention_bias", "mlp_bias"):
    if cfg.get(key) not in (None, False, True) or (cfg.get(key) and not llama):
      refuse(where, key, cfg[key], "true or false (model_type llama)" if llama else
             f"false ({cfg['model_type']} has no such biases; Llama's are model_type llama)")
  if cfg.get("quantization_config"):
    refuse(where, "quantization_config", sorted(cfg["quantization_config"]),
           "none (unquantized weights)")
  d, h = need("hidden_size"), need("num_attention_heads")
  head_dim = cfg.get("head_dim")
  if head_dim is None and d % h:
    refuse(where, "head_dim", None, f"a head width (hidden_size {d} is not a multiple of "
           f"num_attention_heads {h})")
  if head_dim is not None and (not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2):
    refuse(where, "head_dim", head_dim, "an even positive number of features (RoPE pairs them)")
  fields = dict(vocab_size=need("vocab_size"), block_size=need("max_position_embeddings"),
                **_window(cfg, where),
                n_layer=need("num_hidden_layers"), n_head=h,
                head_dim=0 if head_dim in (None, d // h) and not d % h else head_dim,
                n_kv_head=cfg.get("num_key_value_heads") or h, d_model=d,
                mlp_hidden=need("intermediate_size"), epsilon=cfg.get("rms_norm_eps", 1e-6),
                tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                pos="rope", norm="rms", mlp="swiglu", ln="pre", use_bias=False,
                qkv_bias=cfg["model_type"] == "qwen2", qk_norm=cfg["model_type"] == "qwen3",
                attn_bias=bool(cfg.get("attention_bias")), mlp_bias=bool(cfg.get("mlp_bias")))
  return GPT(**{**fields, **_rope(cfg, where), **overrides})


def export_type(model: GPT, model_type: str | None) -> str:
  """The model_type `model` is saved as (default: gpt2 for learned positions, else qwen3 with
  qk_norm, qwen2 with qkv_bias, mistral with a sliding window and llama otherwise), refusing in
  one line naming the setting a model that layout cannot hold."""
  if model_type is not None and model_type not in MODEL_TYPES:
    raise ConfigError(f"model_type: {model_type!r}; expected one of {', '.join(MODEL_TYPES)}")
  if model.lora_rank:
    raise ConfigError("model.lora_rank: the adapters must be merged first (lora.merge), got "
                      f"{model.lora_rank}")
  common = dict(ln="pre", moe_experts=0, mixer="attention", embed_scale=False,
                attn_softcap=0.0, logit_softcap=0.0, attn_scale_dim=0.0, rope_local_theta=0.0)
  gpt2 = model_type == "gpt2" or (model_type is None and model.pos == "learned")
  if gpt2:
    want = dict(common, pos="learned", norm="layer", mlp="gelu", use_bias=True,
                tie_embeddings=True, mlp_width=4 * model.d_model, kv_heads=model.n_head,
                qk_norm=False, head_dim=0, rope_scaling="none")
  else:
    want = dict(common, pos="rope", norm="rms", mlp="swiglu", use_bias=False)
  for key, value in want.items():
    if getattr(model, key) != value:
      setting = {"mlp_width": "mlp_hidden", "kv_heads": "n_kv_head"}.get(key, key)
      raise ConfigError(f"model.{setting}: a {'GPT-2' if gpt2 else 'Llama-family'} checkpoint "
                        f"needs {value!r}, got {getattr(model, key)!r}")
  if gpt2:
    if model.sliding_window:
      raise ConfigError(f"model.sliding_window: a GPT-2 checkpoint has no window, got "
                        f"{model.sliding_window}")
    return "gpt2"
  phi3_rope = "rope_scaling" if model.rope_scaling == "longrope" else (
      "rope_partial" if model.rope_partial != 1.0 else None)  # what only phi3 holds
  model_type = model_type or ("qwen3" if model.qk_norm else "qwen2" if model.qkv_bias else
                              "phi3" if phi3_rope else "mistral" if model.sliding_window else
                              "llama")
  if phi3_rope and model_type != "phi3":
    raise ConfigError(f"model.{phi3_rope}: {model_type} checkpoints have no LongRoPE or partial "
                      f"rotary (export as phi3), got {getattr(model, phi3_rope)!r}")
  if model_type == "phi3" and model.rope_scaling not in hf_phi.ROPE_TYPES + ("none",):
    raise ConfigError(f"model.rope_scaling: phi3 checkpoints have 'longrope' or 'none', got "
                      f"{model.rope_scaling!r}")
  for key in ("attn_bias", "mlp_bias"):
    if getattr(model, key) and model_type != "llama":
      raise ConfigError(f"model.{key}: {model_type} checkpoints have no such biases (export as "
                        f"llama), got True")
  if model.sliding_window and model_type == "llama":
    raise ConfigError(f"model.sliding_window: a llama checkpoint has no window (export as "
                      f"mistral or qwen2), got {model.sliding_window}")
  if len(set(model.local_layers)) > 1 and model_type == "mistral":
    raise ConfigError(f"model.attn_pattern: a mistral checkpoint windows every layer (export as "
                      f"qwen2), got {model.attn_pattern!r}")
  if model.qk_norm != (model_type == "qwen3"):
    raise ConfigError(f"model.qk_norm: {model_type} checkpoints have "
                      f"{'' if model_type == 'qwen3' else 'no '}per-head query/key RMSNorms, got "
                      f"{model.qk_norm}")
  if model.qkv_bias != (model_type == "qwen2"):
    raise ConfigError(f"model.qkv_bias: {model_type} checkpoints have "
                      f"{'' if model_type == 'qwen2' else 'no '}query/key/value biases, got "
                      f"{model.qkv_bias}")
  return model_type


def hf_config(model: GPT, model_type: str) -> dict:
  """config.json for `model` as `model_type` (transformers 4 and 5 both read it)."""
  if model_type == "gpt2":
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "vocab_size": model.vocab_size, "n_positions": model.block_size,
            "n_ctx": model.block_size, "n_embd": model.d_model, "n_layer": model.n_layer,
            "n_head": model.n_head, "layer_norm_epsilon": model.epsilon,
            "activation_function": "gelu_new", "tie_word_embeddings": True,
            "torch_dtype": "float32"}
  cfg = {"architectures": [LLAMA_TYPES[model_type]], "model_type": model_type,
         "vocab_size": model.vocab_size, "hidden_size": model.d_model,
         "intermediate_size": model.mlp_width, "num_hidden_layers": model.n_layer,
         "num_attention_heads": model.n_head, "num_key_value_heads": model.kv_heads,
         "hidden_act": "silu", "max_position_embeddings": (
             model.rope_spec.original_max if model.rope_scaling == "dynamic" else
             model.block_size),
         "rms_norm_eps": model.epsilon, **_rope_config(model),
         "head_dim": model.head_width, "tie_word_embeddings": model.tie_embeddings,
         "torch_dtype": "float32"}
  window = model.sliding_window if any(model.local_layers) else None
  if model_type in ("qwen2", "qwen3"):
    # max_window_layers for readers without layer_types: the full layers before the first local.
    cfg.update(use_sliding_window=bool(window), sliding_window=window,
               max_window_layers=(model.local_layers + (True,)).index(True),
               layer_types=layer_types(model))
  if model_type not in ("qwen2", "phi3"):
    cfg["attention_bias"] = model.attn_bias
  if model_type in ("llama", "mistral"):
    cfg["mlp_bias"] = model.mlp_bias
  if model_type == "phi3":
    cfg.update(hf_phi.config(model))
  if model_type == "mistral":
    cfg["sliding_window"] = window
  return cfg
