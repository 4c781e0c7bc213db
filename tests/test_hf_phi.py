"""Phi-3 / Phi-4-mini, Llama's biases, dynamic NTK RoPE and many-group GQA (`jaxdl.models.hf_phi`,
`jaxdl.models.rope`), against transformers on the tiny models of tests/hf_reference.py's FAMILIES
(phi3, phi4_mini, llama_bias, llama_dynamic, smollm). What is particular to them: RoPE frequencies
that follow the length a call reaches, LongRoPE's switch at the original context, dynamic NTK's
cached keys keeping their rotation, and the config fields refused in one line. The three checks
every family gets (logits, 16 greedy tokens, the export reloaded) are tests/test_hf_roundtrip.py's.
torch and transformers are imported by the tests that use them (`hf_reference._tf`).
"""

import json

import hf_reference
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdl.models import decoding, hf, hf_families, rope
from jaxdl.schema import ConfigError

TOL = 1e-5


def _config(hf_model, name):
  with open(f"{hf_model(name)}/config.json", encoding="utf-8") as f:
    return json.load(f)


@pytest.mark.parametrize("name", ["phi3", "phi4_mini", "llama_dynamic"])
def test_rope_frequencies_follow_the_length_as_transformers(name, hf_model):
  """rope_frequencies at lengths n below, at and past L equal transformers' ROPE_INIT_FUNCTIONS
  (longrope: short factors up to L, long past it, sqrt(1 + ln 4 / ln 16) for both; dynamic:
  theta (2 n / 16 - 1)^(R / (R - 2)) past 16); apply_rope, jitted, turns queries as transformers'
  rotary embedding and apply_rotary_pos_emb do (phi4_mini: 6 of 8 features, 2 passing)."""
  torch, transformers = hf_reference._tf()  # pylint: disable=protected-access
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # pylint: disable=g-import-not-at-top
  from transformers.models.phi3 import modeling_phi3  # pylint: disable=g-import-not-at-top
  theirs_cfg = transformers.AutoConfig.from_pretrained(hf_model(name))
  model = hf_families.model_from_config(_config(hf_model, name))
  spec, k = model.rope_spec, model.head_width
  big_l = spec.original_max
  assert big_l == 16 and spec.scaling == theirs_cfg.rope_parameters["rope_type"]
  init = ROPE_INIT_FUNCTIONS[spec.scaling]
  for n in (None, 5, big_l, big_l + 1, 24, 40):
    want, want_scale = init(theirs_cfg, None, seq_len=n)
    ours, scale = rope.rope_frequencies(spec, k, n)
    np.testing.assert_allclose(ours, want.numpy(), rtol=1e-6, atol=0, err_msg=f"{name} n={n}")
    assert scale == pytest.approx(want_scale, rel=1e-7)
  long_vs_short = rope.rope_frequencies(spec, k, 40)[0] / rope.rope_frequencies(spec, k, 16)[0]
  assert long_vs_short.min() < 0.5  # past L the frequencies change, the slowest most
  if spec.scaling == "longrope":
    assert scale == pytest.approx(np.sqrt(1 + np.log(4) / np.log(16)))
  q_BxTxHxK = np.random.default_rng(0).normal(size=(1, 24, 2, k)).astype(np.float32)
  turn = jax.jit(lambda q, p: rope.apply_rope(q, p, spec))
  for t in (16, 24):  # each a call of its own, fresh rotary module: no remembered length
    rotary = modeling_phi3.Phi3RotaryEmbedding(theirs_cfg)
    x = torch.as_tensor(q_BxTxHxK[:, :t]).transpose(1, 2)
    cos, sin = rotary(x, torch.arange(t)[None])
    want = modeling_phi3.apply_rotary_pos_emb(x, x, cos, sin)[0].transpose(1, 2).numpy()
    np.testing.assert_allclose(turn(q_BxTxHxK[:, :t], jnp.arange(t)), want, atol=2e-6, rtol=0)


def test_longrope_as_phi3_configs_state_it():
  """Phi-3's v4 spelling (top-level rope_theta, partial_rotary_factor; rope_scaling of type 'su'),
  an explicit factor and attention_factor, a sliding window: the frequencies and scaling of
  transformers' Phi3Config, and an export that states them again."""
  _, transformers = hf_reference._tf()  # pylint: disable=protected-access
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # pylint: disable=g-import-not-at-top
  cfg = dict(model_type="phi3", vocab_size=8, hidden_size=256, num_attention_heads=4,
             num_key_value_heads=4, num_hidden_layers=1, intermediate_size=8,
             max_position_embeddings=131072, original_max_position_embeddings=4096,
             rope_theta=250000.0, partial_rotary_factor=0.75, sliding_window=2047, rope_scaling={
                 "type": "su", "factor": 8.0, "attention_factor": 1.25,
                 "short_factor": [1.0 + i / 48 for i in range(24)],
                 "long_factor": [1.0 + i for i in range(24)]})
  theirs = transformers.Phi3Config(**{k: v for k, v in cfg.items() if k != "model_type"})
  model = hf_families.model_from_config(cfg)
  assert (model.rope_scaling, model.rope_partial, model.rope_factor, model.sliding_window) == (
      "longrope", 0.75, 8.0, 2047)  # Phi-3-mini-4k's window, on every layer as Mistral's
  for n in (None, 4096, 4097):
    want, want_scale = ROPE_INIT_FUNCTIONS["longrope"](theirs, None, seq_len=n)
    ours, scale = rope.rope_frequencies(model.rope_spec, model.head_width, n)
    assert ours.shape == (24,) and scale == want_scale == 1.25
    np.testing.assert_allclose(ours, want.numpy(), rtol=1e-6, atol=0)
  again = hf_families.hf_config(model, "phi3")
  assert again["rope_scaling"]["attention_factor"] == 1.25 and again["sliding_window"] == 2047
  assert hf_families.model_from_config(again) == model


def test_longrope_turns_every_position_by_the_long_factors_past_the_original_context(hf_model):
  """phi3: a 16-token call (L = 16) uses the short factors and a 17-token call the long ones on
  every position, so the first 16 positions' logits change between the calls; both equal
  transformers'."""
  src = hf_model("phi3")
  ref = hf_reference.load(src)
  model, params = hf.load_hf(src)
  tokens_1xT = np.random.default_rng(1).integers(0, 96, (1, 17))
  forward = jax.jit(lambda p, t: model.apply({"params": p}, t, train=False))
  short, long = (np.asarray(forward(params, jnp.asarray(tokens_1xT[:, :t]))) for t in (16, 17))
  for t, ours in ((16, short), (17, long)):
    np.testing.assert_allclose(ours, hf_reference.logits(ref, tokens_1xT[:, :t]), atol=TOL, rtol=0)
  assert np.abs(long[:, :16] - short).max() > 0.1


def test_dynamic_ntk_cached_keys_keep_their_rotation(hf_model):
  """llama_dynamic (L = 16): a 12-token prompt decoded 8 steps past L with the KV cache. Each
  step's logits equal transformers' generate's (the new token turns by the frequencies of its
  position + 1, cached keys as they were computed), and differ from the full forward of the same
  tokens, where every position turns by the frequencies of the whole length."""
  torch, _ = hf_reference._tf()  # pylint: disable=protected-access
  src = hf_model("llama_dynamic")
  ref = hf_reference.load(src)
  model, params = hf.load_hf(src)
  assert (model.rope_scaling, model.rope_spec.original_max, model.block_size) == ("dynamic", 16, 32)
  prompt_1xP = np.random.default_rng(2).integers(0, 96, (1, 12))
  with torch.no_grad():
    res = ref.generate(torch.as_tensor(prompt_1xP), do_sample=False, max_new_tokens=8,
                       min_new_tokens=8, pad_token_id=0, return_dict_in_generate=True,
                       output_logits=True)
  tokens_1xN, want_NxV = res.sequences.numpy(), torch.cat(res.logits).numpy()
  step = jax.jit(lambda p, t, c, pos: model.apply({"params": p}, t, train=False, cache=c,
                                                  pos=pos))
  logits, cache = step(params, jnp.asarray(prompt_1xP), decoding.init_cache(model, 1, 20), 0)
  ours = [logits[0, -1]]
  for pos in range(12, 19):
    logits, cache = step(params, jnp.asarray(tokens_1xN[:, pos:pos + 1]), cache, pos)
    ours.append(logits[0, -1])
  np.testing.assert_allclose(np.stack(ours), want_NxV, atol=TOL, rtol=0)
  full = np.asarray(jax.jit(lambda p, t: model.apply({"params": p}, t, train=False))(
      params, jnp.asarray(tokens_1xN[:, :19])))[0, 11:]
  assert np.abs(full - np.stack(ours)).max() > 1e-2


@pytest.mark.parametrize("name", ["phi3", "llama_dynamic"])
def test_left_padded_generation_across_the_original_context(name, hf_model):
  """A batch of a 10-token prompt and a 7-token one left-padded by 3, 12 greedy tokens past L =
  16: the frequencies follow the batch's largest position, as transformers' `generate` with the
  attention mask (LongRoPE's recomputation at the padded length L + 1 included)."""
  src = hf_model(name)
  model, params = hf.load_hf(src)
  prompt_BxP = np.random.default_rng(5).integers(3, 96, (2, 10))
  prompt_BxP[1, :3] = 0
  mask = (np.arange(10)[None] >= np.array([[0], [3]])).astype(np.int64)
  theirs, margin = hf_reference.greedy(hf_reference.load(src), prompt_BxP, 12, attention_mask=mask)
  assert margin > 1e-3
  out = decoding.generate(model, params, jnp.asarray(prompt_BxP, jnp.int32), jax.random.key(0), 12,
                          start_B=jnp.asarray([0, 3], jnp.int32), temperature=0)
  np.testing.assert_array_equal(np.asarray(out), theirs)


def test_llama_attention_bias_without_mlp_bias(tmp_path):
  """attention_bias alone: biases on q, k, v, o, none in the MLP; logits equal transformers'."""
  ref = hf_reference.save("llama_bias", str(tmp_path), mlp_bias=False)
  model, params = hf.load_hf(str(tmp_path))
  assert (model.attn_bias, model.mlp_bias, model.use_bias) == (True, False, False)
  assert set(params["h"]["attn"]["c_proj"]) == {"kernel", "bias"}
  assert set(params["h"]["mlp"]["c_fc"]) == {"kernel"}
  tokens = np.random.default_rng(3).integers(0, 96, (1, 8))
  ours = np.asarray(jax.jit(lambda p, t: model.apply({"params": p}, t, train=False))(
      params, jnp.asarray(tokens)))
  np.testing.assert_allclose(ours, hf_reference.logits(ref, tokens), atol=TOL, rtol=0)


def _rope_params(**kw):
  return {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 4,
          "long_factor": [2.0] * 4, **kw}


BAD = [  # (family, config.json changes, the one line's field)
    ("llama_tied", dict(rope_parameters=_rope_params()), 'rope_parameters.rope_type="longrope"'),
    ("phi3", dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0}),
     'rope_parameters.rope_type="dynamic"'),
    ("phi3", dict(rope_parameters=_rope_params(short_factor=[1.0] * 3)),
     "rope_parameters.short_factor=[1.0, 1.0, 1.0]"),
    ("phi3", dict(rope_parameters=_rope_params(long_factor=[2.0, 2.0, 2.0, -1.0])),
     "rope_parameters.long_factor=[2.0, 2.0, 2.0, -1.0]"),
    ("phi3", dict(partial_rotary_factor=0.625), "partial_rotary_factor=0.625"),  # 5 features
    ("llama_tied", dict(partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
    ("phi3", dict(attention_bias=True), "attention_bias=true"),
    ("qwen2", dict(mlp_bias=True), "mlp_bias=true"),
    ("llama_tied", dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4}),
     "rope_parameters.factor=null"),
]


@pytest.mark.parametrize("name,changes,field", BAD, ids=[f"{b[0]}-{b[2][:30]}" for b in BAD])
def test_unrepresentable_fields_are_one_line_naming_them(name, changes, field):
  cfg = {"model_type": "phi3", "hidden_size": 32, "num_attention_heads": 4, "vocab_size": 96,
         "num_hidden_layers": 2, "intermediate_size": 48, "max_position_embeddings": 64,
         "original_max_position_embeddings": 16}
  cfg["model_type"] = {"llama_tied": "llama"}.get(name, name)
  cfg.update(changes)
  if "partial_rotary_factor" in changes and "rope_parameters" not in changes:
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e4}
  with pytest.raises(ConfigError) as e:
    hf_families.model_from_config(cfg)
  message = str(e.value)
  assert "\n" not in message and f"config.json: {field} cannot be imported" in message, message


def test_exports_refuse_what_the_model_type_cannot_hold():
  """LongRoPE and partial rotary are phi3's; Llama's biases llama's; phi3 has no dynamic RoPE."""
  base = dict(vocab_size=96, block_size=64, n_layer=1, n_head=4, d_model=32, pos="rope",
              norm="rms", mlp="swiglu", use_bias=False)
  longrope = dict(rope_scaling="longrope", rope_original_max=16, rope_short_factor=(1.0,) * 4,
                  rope_long_factor=(2.0,) * 4)
  from jaxdl.models.gpt import GPT  # pylint: disable=g-import-not-at-top
  assert hf_families.export_type(GPT(**base, **longrope), None) == "phi3"
  assert hf_families.export_type(GPT(**base, rope_partial=0.5), None) == "phi3"
  assert hf_families.export_type(GPT(**base, attn_bias=True), None) == "llama"
  for fields, model_type, line in (
      (longrope, "llama", "model.rope_scaling: llama checkpoints have no LongRoPE"),
      (dict(rope_partial=0.5), "mistral", "model.rope_partial: mistral checkpoints have no"),
      (dict(mlp_bias=True), "phi3", "model.mlp_bias: phi3 checkpoints have no such biases"),
      (dict(rope_scaling="dynamic", rope_factor=2.0), "phi3",
       "model.rope_scaling: phi3 checkpoints have 'longrope' or 'none', got 'dynamic'")):
    with pytest.raises(ConfigError, match="^" + line):
      hf_families.export_type(GPT(**base, **fields), model_type)
  with pytest.raises(ConfigError, match=r"^model.rope_short_factor: one factor per rotated "
                                        r"feature pair, 4, for rope_scaling='longrope'"):
    GPT(**base, **{**longrope, "rope_short_factor": (1.0,) * 3})


def test_the_export_command_offers_every_model_type():
  import argparse  # pylint: disable=g-import-not-at-top
  from jaxdl.cli import export  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser()
  export.add_arguments(parser)
  choices = next(a.choices for a in parser._actions if a.dest == "model_type")  # pylint: disable=protected-access
  assert sorted(choices) == sorted(hf.MODEL_TYPES)  # every family's, Gemma's included
