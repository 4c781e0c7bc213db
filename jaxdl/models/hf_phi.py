"""What a Phi-3 / Phi-4-mini checkpoint (model_type phi3, Phi3ForCausalLM) means as a jaxdl GPT:
the Llama family's GPT (`jaxdl.models.hf_families`) with its projections fused, LongRoPE and
partial rotary. `hf_families` and `hf_tensors` call this module where model_type is phi3.

Tensors: the Llama table but for two fused projections, each stored as jaxdl already holds it
(one Dense kernel, its outputs concatenated), so nothing is split or joined:
  self_attn.qkv_proj.weight ((H + 2N) K, D)  -> h_i.attn.c_attn.kernel = qkv^T  (q, k, v rows)
  mlp.gate_up_proj.weight (2F, D)            -> h_i.mlp.c_fc.kernel = gate_up^T (gate, then up:
                                                Phi3MLP's chunk(2), jaxdl's SwiGLU split)
and no biases, no q/k norms.

config.json: the Llama fields (hidden_size, ..., sliding_window on every layer as Mistral's),
and
  partial_rotary_factor f (in rope_parameters, else top-level) -> rope_partial: the first
      int(K f) features of each head rotate (Phi-4-mini: 0.75), the rest pass;
  rope_type longrope ('su' and 'yarn' read as longrope, as Phi3Config does): short_factor,
      long_factor (int(K f) / 2 numbers each) -> rope_short_factor, rope_long_factor; factor
      (absent: max_position_embeddings / original_max_position_embeddings) -> rope_factor;
      attention_factor -> rope_attn_factor (absent: sqrt(1 + ln(factor) / ln(L)));
  original_max_position_embeddings L: the top-level field, whose absence means Phi3Config's
      4096 (it wins over rope_parameters', as transformers' standardize_rope_params has it).
LongRoPE's frequencies follow the call's length (short factors up to L positions, long past it)
and `decoding.make_generator` recomputes the sequence when it first passes L, as Phi-3's
`generate` does (`jaxdl.models.rope`). Phi-3 has no other RoPE type (Phi3Config refuses them).
"""

from __future__ import annotations

from jaxdl.models.hf_errors import refuse

ARCHITECTURE = "Phi3ForCausalLM"
ORIGINAL_MAX = 4096  # Phi3Config's original_max_position_embeddings when config.json has none
ROPE_TYPES = ("default", "longrope")

# The Llama tensors Phi-3 stores as one, stacked along the output axis (module docstring).
FUSED = {("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"):
         "self_attn.qkv_proj.weight",
         ("mlp.gate_proj.weight", "mlp.up_proj.weight"): "mlp.gate_up_proj.weight"}


def rope_type(kind: str) -> str:
  """config.json's rope type as Phi3Config reads it ('su' and 'yarn' are longrope)."""
  return "longrope" if kind in ("su", "yarn") else kind


def original_max(cfg: dict):
  """L of a phi3 config: its top-level original_max_position_embeddings, else Phi3Config's."""
  return cfg.get("original_max_position_embeddings", ORIGINAL_MAX)


def longrope_fields(rp: dict, cfg: dict, where: str, src: str, rotated: int) -> dict:
  """rope_short_factor, rope_long_factor of a longrope `rp` (rope_parameters with L resolved),
  each `rotated` / 2 positive numbers; sets rp's factor where absent (module docstring)."""
  out = {}
  for key in ("short_factor", "long_factor"):
    value = rp.get(key)
    if (not isinstance(value, list) or len(value) != rotated // 2 or
        not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0
                for x in value)):
      refuse(where, f"{src}.{key}", value, f"{rotated // 2} positive numbers (one per rotated "
              f"feature pair of int(head_dim x partial_rotary_factor) = {rotated})")
    out[f"rope_{key}"] = tuple(float(x) for x in value)
  if rp.get("factor") is None and rp.get("original_max_position_embeddings"):
    rp["factor"] = cfg.get("max_position_embeddings", 0) / rp["original_max_position_embeddings"]
  return out


def fuse(per_layer: dict, layer: list) -> tuple[dict, list]:
  """Phi-3's per-layer ({name: shape}, [(path, names, transposed)]) from the Llama table's:
  each `FUSED` group becomes its one tensor, rows stacked in order."""
  per_layer = dict(per_layer)
  for names, fused in FUSED.items():
    shapes = [per_layer.pop(n) for n in names]
    per_layer[fused] = (sum(s[0] for s in shapes), shapes[0][1])
  return per_layer, [(path, (FUSED[names],) if names in FUSED else names, transposed)
                     for path, names, transposed in layer]


def config(model) -> dict:
  """The entries a phi3 config.json adds to the Llama family's for `model` (a GPT). The special
  ids are null unless the export states them (`hf.save_hf`'s specials): absent, Phi3Config's own
  (1, 32000, 32000) would stand for them, and a pad id past the vocabulary fails its embedding."""
  return {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
          "original_max_position_embeddings": model.rope_spec.original_max,
          "partial_rotary_factor": model.rope_partial, "sliding_window":
          model.sliding_window or None, "attention_dropout": 0.0, "resid_pdrop": 0.0,
          "embd_pdrop": 0.0}
