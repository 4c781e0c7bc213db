"""safetensors reading/writing and the GPT-2 layout round trip."""

import json
import struct

import chex
import jax
import ml_dtypes
import numpy as np
import pytest

from jaxdl import models
from jaxdl.models import convert, transformer

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
  t = convert.read_safetensors(str(path))
  np.testing.assert_array_equal(t["a"], a)
  np.testing.assert_array_equal(t["b"], b)
  # And our writer's bytes follow the same layout.
  convert.write_safetensors(str(tmp_path / "y.safetensors"),
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
  path = convert.save_gpt2(str(tmp_path / "tiny"), p, m)
  t = convert.read_safetensors(path)
  # The GPT2LMHeadModel names and Conv1D (in, out) shapes.
  assert t["transformer.h.1.attn.c_attn.weight"].shape == (32, 96)
  assert t["transformer.h.0.mlp.c_proj.weight"].shape == (128, 32)
  assert t["transformer.wpe.weight"].shape == (32, 32)
  assert len(t) == 4 + 12 * 2
  np.testing.assert_array_equal(t["transformer.h.1.attn.c_attn.weight"],
                                p["h"]["attn"]["c_attn"]["kernel"][1])
  # Import into an unrolled model (config from config.json) and into the scanned one.
  m2, p2 = convert.load_gpt2(str(tmp_path / "tiny"), scan_layers=False)
  assert (m2.n_head, m2.n_layer, m2.d_model, m2.vocab_size) == (4, 2, 32, 64)
  chex.assert_trees_all_equal(transformer.stack_layers(p2), p)
  _, p3 = convert.load_gpt2(path, model=m)
  chex.assert_trees_all_equal(p3, p)
  f = jax.jit(lambda: (m.apply({"params": p}, TOK, train=False),
                       m2.apply({"params": p2}, TOK, train=False)))
  y, y2 = f()
  np.testing.assert_allclose(y2, y, atol=1e-5)


def test_hf_names_without_prefix_buffers_and_errors(tmp_path):
  m = models.build_model(models.gpt_config("tiny"))
  p = jax.jit(lambda: m.init(jax.random.key(0), TOK, train=False))()["params"]
  sd = convert.params_to_gpt2(p, m, prefix="")
  sd["h.0.attn.bias"] = np.tril(np.ones((1, 1, 32, 32), np.float32))  # HF causal buffer
  chex.assert_trees_all_equal(convert.gpt2_to_params(sd, m), p)
  bad = dict(sd)
  del bad["h.1.ln_2.bias"]
  bad["h.0.mlp.c_fc.weight"] = np.zeros((128, 32), np.float32)
  want = (r"missing: \['h.1.ln_2.bias'\].*misshaped: "
          r"\['h.0.mlp.c_fc.weight: \(128, 32\), expected \(32, 128\)")
  with pytest.raises(ValueError, match=want):
    convert.gpt2_to_params(bad, m)
  with pytest.raises(ValueError, match="GPT-2 has 'layer'"):
    convert.gpt2_to_params(sd, m.clone(norm="rms"))
  with pytest.raises(FileNotFoundError, match="no file"):
    convert.load_gpt2(str(tmp_path / "nothing.safetensors"))


def test_import_without_config_json_needs_n_head(tmp_path):
  """The weights fix V, D, L and the context but not the head count: without config.json the
  import must be told n_head, not guess 64-wide heads (here D = 128 with 4 heads of 32)."""
  m = models.build_model(models.gpt_config("tiny", d_model=128))
  p = jax.jit(lambda: m.init(jax.random.key(0), TOK, train=False))()["params"]
  path = str(tmp_path / "model.safetensors")
  convert.write_safetensors(path, convert.params_to_gpt2(p, m))
  with pytest.raises(ValueError, match="no config.json.*pass n_head"):
    convert.load_gpt2(path)
  m2, p2 = convert.load_gpt2(path, n_head=4)
  assert (m2.n_head, m2.d_model, m2.n_layer) == (4, 128, 2)
  np.testing.assert_allclose(m2.apply({"params": p2}, TOK, train=False),
                             m.apply({"params": p}, TOK, train=False), atol=1e-5)
  with pytest.raises(ValueError, match="n_head=3 but the given model has 4"):
    convert.load_gpt2(path, model=m, n_head=3)
