"""`jaxdl.models.hf.save_hf`'s exports, loaded back: by jaxdl (GPT-2 through the same entry
points as the Llama family) and by transformers (models it builds here, imported and exported
back, logits equal both ways; a bf16 export loads as bf16). The tensors an export writes are
tests/test_hf.py's; every family's round trip tests/test_hf_roundtrip.py's."""

import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.models import hf
from jaxdl.models.gpt import GPT, PRESETS


def test_gpt2_goes_through_the_same_entry_points(tmp_path):
  model = GPT(**PRESETS["tiny"])
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32),
                                             train=False))["params"]
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape), jnp.float32), shapes)
  hf.save_hf(str(tmp_path), model, params, max_shard_bytes=8_000)
  assert os.path.isfile(tmp_path / hf.INDEX)
  model2, params2 = hf.load_hf(str(tmp_path))
  assert model2.clone(dtype=model.dtype) == model
  chex.assert_trees_all_equal(params2, params)


def test_live_round_trip_through_transformers(tmp_path):
  """Builds models in transformers, imports them, exports them back and loads that in
  transformers: logits agree to 1e-5 both ways (Llama with GQA, Qwen2's biases and its sliding
  window over every layer, linear RoPE scaling with wider heads, Qwen3 with YaRN's betas and
  attention factor, GPT-2)."""
  import torch  # the test extra's: a missing torch fails here rather than skipping
  import transformers
  torch.manual_seed(0)
  common = dict(vocab_size=80, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
  built = {
      "llama": transformers.LlamaForCausalLM(transformers.LlamaConfig(
          **common, rope_theta=20000.0, tie_word_embeddings=False)),
      "qwen2": transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
          **common, tie_word_embeddings=True)),
      "qwen2_window": transformers.Qwen2ForCausalLM(transformers.Qwen2Config(  # 12 tokens > 8
          **common, use_sliding_window=True, sliding_window=8, max_window_layers=0)),
      "llama_linear": transformers.LlamaForCausalLM(transformers.LlamaConfig(
          **common, head_dim=12, rope_parameters={"rope_type": "linear", "rope_theta": 1e4,
                                                  "factor": 3.0})),
      "qwen3_yarn": transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
          **common, head_dim=16, rope_parameters={
              "rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0, "beta_fast": 8.0,
              "beta_slow": 2.0, "attention_factor": 1.2, "original_max_position_embeddings": 8})),
      "gpt2": transformers.GPT2LMHeadModel(transformers.GPT2Config(
          vocab_size=80, n_positions=32, n_embd=32, n_layer=2, n_head=4)),
  }
  tokens = np.random.default_rng(0).integers(0, 80, (2, 12))
  for name, ref in built.items():
    ref.eval()
    with torch.no_grad():
      for p in ref.parameters():  # wider than the init, and nonzero biases
        p.add_(0.1 * torch.randn_like(p))
      want = ref(torch.as_tensor(tokens)).logits.numpy()
    ref.save_pretrained(tmp_path / name)
    model, params = hf.load_hf(str(tmp_path / name))
    ours = jax.jit(lambda p, t: model.apply({"params": p}, t, train=False))(params, tokens)
    np.testing.assert_allclose(np.asarray(ours), want, atol=1e-5, rtol=0)
    hf.save_hf(str(tmp_path / f"{name}_out"), model, params, max_shard_bytes=30_000)
    back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / f"{name}_out")).eval()
    with torch.no_grad():
      np.testing.assert_allclose(back(torch.as_tensor(tokens)).logits.numpy(), want, atol=1e-5,
                                 rtol=0)


def test_a_bf16_export_declares_its_dtype_and_transformers_loads_it_so(hf_model, tmp_path):
  """config.json names the weights' dtype (`dtype`, transformers 5; `torch_dtype`, 4.x), so
  `from_pretrained(out)` without a dtype argument loads the bf16 export as bf16, as saved."""
  import ml_dtypes
  import transformers
  model, params = hf.load_hf(hf_model("llama"))
  hf.save_hf(str(tmp_path), model, params, dtype=ml_dtypes.bfloat16)
  with open(tmp_path / "config.json", encoding="utf-8") as f:
    cfg = json.load(f)
  assert (cfg["dtype"], cfg["torch_dtype"]) == ("bfloat16", "bfloat16")
  back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path))
  assert str(back.dtype) == "torch.bfloat16"
