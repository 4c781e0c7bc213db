"""The safetensors format and the GPT-2 table (`jaxdl.models.hf`, `jaxdl.models.hf_families`):
GPT-2 goes through the one pair of entry points, `save_hf` / `load_hf`, like the Llama family
(whose tables tests/test_hf.py and tests/test_hf_roundtrip.py check against models
transformers builds in the tests)."""

import json
import re
import struct

import chex
import jax
import ml_dtypes
import numpy as np
import pytest

from jaxdl import models
from jaxdl.models import hf, hf_families, hf_tensors, rope, stack
from jaxdl.schema import ConfigError

TOK = jax.random.randint(jax.random.key(1), (2, 8), 0, 64)


def test_reads_a_file_written_by_hand_to_the_spec(tmp_path):
  # Header JSON, padded with spaces to 8 bytes, then little-endian data at the given offsets.
  a = np.arange(6, dtype="<f4").reshape(2, 3)
  b = np.array([1, -2], dtype="<i8")
  header = {"b": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]},
            "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [16, 40]},
            "__metadata__": {"format": "pt"}}
  h = json.dumps(header).encode()
  h += b" " * (-len(h) % 8)
  path = tmp_path / "x.safetensors"
  path.write_bytes(struct.pack("<Q", len(h)) + h + b.tobytes() + a.tobytes())
  t = hf.read_safetensors(str(path))
  np.testing.assert_array_equal(t["a"], a)
  np.testing.assert_array_equal(t["b"], b)
  # And our writer's bytes follow the same layout.
  hf.write_safetensors(str(tmp_path / "y.safetensors"),
                       {"w": np.ones((2, 2), ml_dtypes.bfloat16)}, {"format": "pt"})
  raw = (tmp_path / "y.safetensors").read_bytes()
  (n,) = struct.unpack("<Q", raw[:8])
  assert n % 8 == 0
  hdr = json.loads(raw[8:8 + n])
  assert hdr["w"] == {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}
  assert hdr["__metadata__"] == {"format": "pt"}
  assert raw[8 + n:] == b"\x80\x3f" * 4  # bf16 1.0 = 0x3f80, little-endian


def test_gpt2_export_import_round_trip(tmp_path):
  m = models.build_model(models.gpt_config("tiny"))
  p = jax.jit(lambda: m.init(jax.random.key(0), TOK, train=False))()["params"]
  files = hf.save_hf(str(tmp_path / "tiny"), m, p)
  assert files == ["model.safetensors"]
  t = hf.read_weights(str(tmp_path / "tiny"))
  # The GPT2LMHeadModel names and Conv1D (in, out) shapes; the tied head is not written.
  assert t["transformer.h.1.attn.c_attn.weight"].shape == (32, 96)
  assert t["transformer.h.0.mlp.c_proj.weight"].shape == (128, 32)
  assert t["transformer.wpe.weight"].shape == (32, 32)
  assert len(t) == 4 + 12 * 2
  np.testing.assert_array_equal(t["transformer.h.1.attn.c_attn.weight"],
                                p["h"]["attn"]["c_attn"]["kernel"][1])
  config = json.loads((tmp_path / "tiny" / "config.json").read_text())
  assert (config["model_type"], config["n_head"], config["n_embd"]) == ("gpt2", 4, 32)
  # Import into an unrolled model (its config from config.json) computes the same logits.
  m2, p2 = hf.load_hf(str(tmp_path / "tiny"), scan_layers=False)
  assert (m2.n_head, m2.n_layer, m2.d_model, m2.vocab_size) == (4, 2, 32, 64)
  chex.assert_trees_all_equal(stack.stack_layers(p2), p)
  f = jax.jit(lambda: (m.apply({"params": p}, TOK, train=False),
                       m2.apply({"params": p2}, TOK, train=False)))
  y, y2 = f()
  np.testing.assert_allclose(y2, y, atol=1e-5)


def test_gpt2_names_without_prefix_buffers_and_errors():
  m = models.build_model(models.gpt_config("tiny"))
  p = jax.jit(lambda: m.init(jax.random.key(0), TOK, train=False))()["params"]
  # GPT2Model's names have no 'transformer.' prefix; its causal buffers hold nothing to import.
  sd = {k.removeprefix("transformer."): v
        for k, v in hf_tensors.to_tensors(p, m, "gpt2").items()}
  sd["h.0.attn.bias"] = np.tril(np.ones((1, 1, 32, 32), np.float32))
  sd["lm_head.weight"] = sd["wte.weight"]  # the tied head, as some checkpoints store it
  chex.assert_trees_all_equal(hf_tensors.to_params(sd, m, "gpt2"), p)
  bad = dict(sd)
  del bad["h.1.ln_2.bias"]
  with pytest.raises(ConfigError, match=r"^weights: missing tensors for 2 layers: h.1.ln_2.bias$"):
    hf_tensors.to_params(bad, m, "gpt2")
  bad = dict(sd, **{"h.0.mlp.c_fc.weight": np.zeros((128, 32), np.float32)})
  with pytest.raises(ConfigError, match=r"misshaped .*h.0.mlp.c_fc.weight \(128, 32\) "
                                        r"\(expected \(32, 128\)\)$"):
    hf_tensors.to_params(bad, m, "gpt2")
  # Export refuses what GPT-2's layout cannot hold, naming the setting.
  for change, needle in ((dict(norm="rms"), "model.norm: a GPT-2 checkpoint needs 'layer'"),
                         (dict(n_kv_head=2), "model.n_kv_head: a GPT-2 checkpoint needs 4"),
                         (dict(pos="rope"), "model.pos: a GPT-2 checkpoint needs 'learned'")):
    with pytest.raises(ConfigError, match="^" + needle):
      hf_families.export_type(m.clone(**change), "gpt2")


def test_rope_frequencies_equal_transformers():
  """transformers' RoPE frequencies, computed here (`hf_reference.rope_reference`: its
  LlamaRotaryEmbedding and ROPE_INIT_FUNCTIONS; inverse frequencies and the cos/sin scaling) for
  default, linear, llama3 (as written by transformers 5 and 4) and yarn configs (its betas, an
  explicit attention_factor, mscale / mscale_all_dim, no original_max_position_embeddings) at
  real checkpoints' sizes; ours from the same config.json fields through the import, computed in
  float64 and rounded once (transformers' are float32 throughout: a few ulp apart)."""
  import hf_reference
  assert len(hf_reference.ROPE_CASES) == 8
  inv_freqs = {}
  for name, fields in hf_reference.ROPE_CASES.items():
    config, want_freq, want_scaling = hf_reference.rope_reference(fields)
    model = hf_families.model_from_config(config)
    inv_freq, scaling = rope.rope_frequencies(model.rope_spec, model.head_width)
    np.testing.assert_allclose(inv_freq, want_freq, rtol=1e-6, atol=0, err_msg=name)
    assert scaling == pytest.approx(want_scaling, rel=1e-12), name
    inv_freqs[name] = want_freq
  # The types act: llama3 keeps the fastest frequency and divides the slowest by its factor 8.
  llama3 = np.array(inv_freqs["llama3"], np.float64) / 5e5 ** (-np.arange(0, 128, 2) / 128)
  np.testing.assert_allclose(llama3[[0, -1]], [1.0, 1 / 8], rtol=1e-6)


@pytest.mark.parametrize("change,message", [
    (dict(rope_scaling="llama3"), "model.rope_scaling: scales RoPE; pos='learned' has none"),
    (dict(pos="rope", head_dim=7), "model.head_dim: RoPE turns feature pairs: the head width "
                                   "must be even, got 7"),
    (dict(pos="rope", rope_scaling="llama3", rope_high_freq_factor=1.0),
     "model.rope_high_freq_factor: must exceed rope_low_freq_factor=1.0"),
    # A key the scaling never reads would be ignored.
    (dict(pos="rope", rope_factor=8.0), "model.rope_factor: rope_scaling='none' does not use "
                                        "it (only rope_theta), got 8.0 (expected 1.0)"),
    (dict(pos="rope", rope_scaling="linear", rope_factor=2.0, rope_original_max=16),
     "model.rope_original_max: rope_scaling='linear' does not use it (only rope_factor)"),
    (dict(pos="rope", rope_scaling="dynamic", rope_factor=2.0, rope_beta_fast=16.0),
     "model.rope_beta_fast: rope_scaling='dynamic' does not use it"),
])
def test_rope_settings_the_model_cannot_use_are_refused(change, message):
  with pytest.raises(ConfigError, match="^" + re.escape(message)):
    models.build_model(models.gpt_config("tiny", **change))


@pytest.mark.parametrize("model_type,field,want", [
    ("llama", "epsilon", 1e-6), ("phi3", "epsilon", 1e-5),  # each config class's rms_norm_eps
    ("llama", "n_kv_head", 32), ("mistral", "n_kv_head", 8), ("qwen2", "n_kv_head", 32),
    # Qwen2Config's max_window_layers 28: a window on layers 28 and up only, none of these 2.
    ("qwen2", "sliding_window", 0), ("mistral", "sliding_window", 16)])
def test_a_field_config_json_leaves_out_is_its_config_class_default(model_type, field, want):
  """transformers' defaults (LlamaConfig, Phi3Config, MistralConfig, Qwen2Config) for the
  fields a hand-written config.json may leave out, not the Llama family's for every type."""
  cfg = dict(model_type=model_type, vocab_size=64, hidden_size=256, intermediate_size=64,
             num_hidden_layers=2, num_attention_heads=32, max_position_embeddings=64,
             sliding_window=16, use_sliding_window=True)
  if field != "n_kv_head":
    cfg["num_key_value_heads"] = 4
  assert getattr(hf_families.model_from_config(cfg), field) == want
