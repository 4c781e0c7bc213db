"""Gemma 1, 2 and 3 (text) checkpoints as settings of the one GPT: what their config.json fields
mean, both ways. The tensors are the Llama family's table (`jaxdl.models.hf_tensors`; Gemma 2 and
3 add the sandwich norms), the files and the dispatch on model_type `jaxdl.models.hf`'s.

As transformers 5.25 computes them (models/gemma*/modeling_gemma*.py), with the GPT setting each
line becomes:
  x_0 = embed_tokens[ids] * sqrt(D), the normalizer cast to the embeddings' dtype   embed_scale
  RMSNorm x / sqrt(mean(x^2) + eps) * (1 + w), in float32, w stored as is           norm='rms1p'
  MLP down(gelu_tanh(gate x) * up x) (gelu_pytorch_tanh)                            mlp='geglu'
  head_dim K read from config.json, whatever D / H is; the head tied to the embedding (or
  lm_head.weight with tie_word_embeddings false)
Gemma 1 (model_type gemma, GemmaForCausalLM): Llama's pre-norm block, scores Q K^T / sqrt(K).
Gemma 2 (gemma2, Gemma2ForCausalLM): the sandwich block x + post_attention_norm(attn(
  input_norm(x))), x + post_feedforward_norm(mlp(pre_feedforward_norm(x))) (ln='sandwich');
  scores Q K^T / sqrt(query_pre_attn_scalar) (attn_scale_dim; 0 when it is K), then
  c tanh(z / c) with c = attn_logit_softcapping before the mask (attn_softcap); the logits
  c' tanh(z / c') with c' = final_logit_softcapping (logit_softcap); layer_types (default
  sliding, full, sliding, ...) with sliding_window W -> sliding_window and attn_pattern
  (`hf_families.layer_pattern`): W lets token i see j for i - W < j <= i, transformers' window.
Gemma 3 text (gemma3_text, Gemma3ForCausalLM): Gemma 2's block and scaling, plus per-head q/k
  RMSNorms with (1 + w) before RoPE (qk_norm; they follow norm='rms1p'); layer_types default
  every 6th layer full (sliding_window_pattern); RoPE per layer type, from rope_parameters
  {'full_attention': ..., 'sliding_attention': ...} (v5) or rope_theta, rope_scaling and
  rope_local_base_freq (v4): the full layers' RoPE (its scaling too) is the model's, the sliding
  layers' plain RoPE of base rope_local_base_freq is rope_local_theta. transformers' Gemma 3
  attention never applies attn_logit_softcapping, so a non-null one is refused, not dropped.
Refused, in one line naming the field: an activation other than the tanh GELU (Gemma 1's legacy
'gelu' means it, as transformers reads it), attention_bias, use_bidirectional_attention, a null
sliding_window with sliding layers, a scaled RoPE on Gemma 3's sliding layers, quantization, and
the RoPE fields `hf_families` refuses. An export writes v4's field names (rope_theta, rope_scaling,
rope_local_base_freq) with layer_types, which transformers 4 and 5 both read.
"""

from __future__ import annotations

from jaxdl.models.gpt import GPT
from jaxdl.models.hf_families import _rope, _rope_config, layer_pattern, layer_types, refuse
from jaxdl.schema import ConfigError

GEMMA_TYPES = {"gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
               "gemma3_text": "Gemma3ForCausalLM"}
# transformers' config-class defaults for the fields a config.json may leave out.
_DEFAULTS = {
    "gemma": dict(head_dim=256, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  num_key_value_heads=16),
    "gemma2": dict(head_dim=256, rms_norm_eps=1e-6, tie_word_embeddings=True,
                   num_key_value_heads=4,
                   query_pre_attn_scalar=256, sliding_window=4096,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
    "gemma3_text": dict(head_dim=256, rms_norm_eps=1e-6, tie_word_embeddings=True,
                        num_key_value_heads=4,
                        query_pre_attn_scalar=256, sliding_window=4096,
                        attn_logit_softcapping=None, final_logit_softcapping=None)}
_TANH_GELU = ("gelu_pytorch_tanh", "gelu_new")


def _cap(cfg: dict, key: str, where: str) -> float:
  value = cfg.get(key)
  if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                            or value <= 0):
    refuse(where, key, value, "a positive number or null")
  return float(value or 0.0)


def _number(x: float):
  return int(x) if float(x).is_integer() else x


def _gemma3_rope(cfg: dict, where: str, any_local: bool) -> dict:
  """The GPT's RoPE fields of a Gemma 3 config (module docstring): the full layers' RoPE as
  `hf_families._rope` reads a Llama's, and rope_local_theta for the sliding ones."""
  rp = cfg.get("rope_parameters")
  if isinstance(rp, dict) and ({"full_attention", "sliding_attention"} & set(rp)):
    full = dict(rp.get("full_attention") or {})
    local = dict(rp.get("sliding_attention") or {})
    full.setdefault("rope_theta", 1e6)  # Gemma3TextConfig.default_theta
    local.setdefault("rope_theta", 1e4)
  else:  # v4: rope_theta and rope_scaling for the full layers, rope_local_base_freq
    full = {**(cfg.get("rope_scaling") or {}), "rope_theta": cfg.get("rope_theta") or 1e6}
    local = {"rope_theta": cfg.get("rope_local_base_freq") or 1e4}
  plain = {**cfg, "rope_scaling": None, "rope_theta": None}
  out = _rope({**plain, "rope_parameters": full}, where)
  local_fields = _rope({**plain, "rope_parameters": local}, where)
  if local_fields["rope_scaling"] != "none":
    refuse(where, "rope_parameters.sliding_attention.rope_type", local_fields["rope_scaling"],
           "'default' (the sliding layers' RoPE is plain RoPE of its rope_theta)")
  if any_local:
    out["rope_local_theta"] = local_fields["rope_theta"]
  return out


def model_from_config(cfg: dict, where: str = "config.json", **overrides) -> GPT:
  """The GPT a Gemma config.json describes (module docstring); `overrides` are GPT fields."""
  kind = cfg["model_type"]
  cfg = {**_DEFAULTS[kind], **cfg}

  def need(key):
    if cfg.get(key) is None:
      raise ConfigError(f"{where}: {key} is missing")
    return cfg[key]

  act_key = "hidden_act" if kind == "gemma" else "hidden_activation"
  act = cfg.get(act_key) or "gelu_pytorch_tanh"
  if act not in _TANH_GELU + (("gelu",) if kind == "gemma" else ()):
    refuse(where, act_key, act, "gelu_pytorch_tanh (GeGLU's tanh GELU)")
  for key, expected in (("attention_bias", "false"), ("use_bidirectional_attention", "false"),
                        ("quantization_config", "null (unquantized weights)")):
    if cfg.get(key):
      refuse(where, key, cfg[key], expected)
  head_dim = need("head_dim")
  if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
    refuse(where, "head_dim", head_dim, "an even positive number of features (RoPE pairs them)")
  n = need("num_hidden_layers")
  fields = {}
  if kind != "gemma":
    kinds = cfg.get("layer_types")
    if kinds is None:
      period = 2 if kind == "gemma2" else cfg.get("sliding_window_pattern", 6)
      kinds = ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(n)]
    pattern = layer_pattern(kinds, n, where)
    if "l" in pattern:
      window = cfg.get("sliding_window")
      if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        refuse(where, "sliding_window", window, "a positive number of tokens (layer_types has "
               "sliding layers)")
      fields.update(sliding_window=window, attn_pattern="" if pattern == "l" else pattern)
    scalar = cfg.get("query_pre_attn_scalar")
    if not isinstance(scalar, (int, float)) or isinstance(scalar, bool) or scalar <= 0:
      refuse(where, "query_pre_attn_scalar", scalar, "a positive number")
    if kind == "gemma3_text" and cfg.get("attn_logit_softcapping") is not None:
      refuse(where, "attn_logit_softcapping", cfg["attn_logit_softcapping"], "null "
             "(transformers' Gemma 3 attention does not apply it)")
    fields.update(ln="sandwich", attn_scale_dim=0.0 if scalar == head_dim else float(scalar),
                  attn_softcap=_cap(cfg, "attn_logit_softcapping", where),
                  logit_softcap=_cap(cfg, "final_logit_softcapping", where))
  rope = (_gemma3_rope(cfg, where, "sliding_window" in fields) if kind == "gemma3_text"
          else _rope(cfg, where))
  h = need("num_attention_heads")
  fields = dict(vocab_size=need("vocab_size"), block_size=need("max_position_embeddings"),
                n_layer=n, n_head=h, n_kv_head=cfg.get("num_key_value_heads") or h,
                d_model=need("hidden_size"), mlp_hidden=need("intermediate_size"),
                head_dim=head_dim, epsilon=cfg["rms_norm_eps"],
                tie_embeddings=bool(cfg["tie_word_embeddings"]), pos="rope", norm="rms1p",
                mlp="geglu", use_bias=False, embed_scale=True,
                qk_norm=kind == "gemma3_text", **rope, **fields)
  return GPT(**{**fields, **overrides})


def export_type(model: GPT, model_type: str | None) -> str:
  """The Gemma model_type `model` is saved as (default: gemma3_text with qk_norm, gemma2 with
  sandwich norms, else gemma), refusing in one line naming the setting a model that layout
  cannot hold."""
  if model.lora_rank:
    raise ConfigError("model.lora_rank: the adapters must be merged first (lora.merge), got "
                      f"{model.lora_rank}")
  model_type = model_type or ("gemma3_text" if model.qk_norm else
                              "gemma2" if model.ln == "sandwich" else "gemma")
  local = any(model.local_layers)
  want = dict(pos="rope", norm="rms1p", mlp="geglu", use_bias=False, qkv_bias=False,
              attn_bias=False, mlp_bias=False, rope_partial=1.0, embed_scale=True,
              moe_experts=0, mixer="attention",
              ln="pre" if model_type == "gemma" else "sandwich",
              qk_norm=model_type == "gemma3_text")
  if model_type == "gemma":
    want.update(attn_softcap=0.0, logit_softcap=0.0, attn_scale_dim=0.0)
  if model_type != "gemma3_text":
    want.update(rope_local_theta=0.0)
  else:
    want.update(attn_softcap=0.0)
  if model_type == "gemma" and local:
    want.update(sliding_window=0)
  for key, value in want.items():
    if getattr(model, key) != value:
      raise ConfigError(f"model.{key}: a {model_type} checkpoint needs {value!r}, got "
                        f"{getattr(model, key)!r}")
  if model_type == "gemma3_text" and local and not model.rope_local_theta and \
      model.rope_scaling != "none":
    raise ConfigError(f"model.rope_local_theta: a gemma3_text checkpoint's sliding layers have "
                      f"unscaled RoPE; set it (rope_scaling={model.rope_scaling!r}), got 0")
  if model_type != "gemma" and model.d_model % model.n_head:
    raise ConfigError(f"model.d_model: a {model_type} checkpoint needs a multiple of n_head="
                      f"{model.n_head}, got {model.d_model}")
  return model_type


def hf_config(model: GPT, model_type: str) -> dict:
  """config.json for `model` as `model_type` (module docstring)."""
  cfg = {"architectures": [GEMMA_TYPES[model_type]], "model_type": model_type,
         "vocab_size": model.vocab_size, "hidden_size": model.d_model,
         "intermediate_size": model.mlp_width, "num_hidden_layers": model.n_layer,
         "num_attention_heads": model.n_head, "num_key_value_heads": model.kv_heads,
         "head_dim": model.head_width, "max_position_embeddings": model.block_size,
         "rms_norm_eps": model.epsilon, **_rope_config(model), "attention_bias": False,
         "tie_word_embeddings": model.tie_embeddings, "torch_dtype": "float32"}
  if model_type == "gemma":
    return {**cfg, "hidden_act": "gelu_pytorch_tanh"}
  cfg.update(hidden_activation="gelu_pytorch_tanh",
             # an int in transformers 5's strict config (a fractional one is kept as is)
             query_pre_attn_scalar=_number(model.attn_scale_dim or model.head_width),
             attn_logit_softcapping=model.attn_softcap or None,
             final_logit_softcapping=model.logit_softcap or None,
             sliding_window=model.sliding_window or None, layer_types=layer_types(model))
  if model_type == "gemma3_text":
    cfg["rope_local_base_freq"] = model.rope_local_theta or model.rope_theta
  return cfg
