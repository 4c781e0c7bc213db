"""Gemma 1, 2 and 3 text as settings of the one GPT (`jaxdl.models.hf_gemma`) and per-layer
attention kinds (`GPT.attn_pattern`): what only Gemma has. tests/test_hf_roundtrip.py holds the
families gemma, gemma2, gemma3 and qwen2_mixed of tests/hf_reference.py to transformers (logits
to 1e-5, 16 greedy tokens past the window of 8, the export reloaded); here each Gemma operation
is shown to act (switched off, the logits leave transformers'), the (1 + w) norm and the config
fields are checked against known values, and what cannot be represented is one line.
"""

import json
import re
import shutil

import hf_reference
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdl.models import attention, hf, layers
from jaxdl.schema import ConfigError

TOKENS = np.random.default_rng(1).integers(0, 96, (2, 20))  # past the window of 8


def _config(directory) -> dict:
  with open(f"{directory}/config.json", encoding="utf-8") as f:
    return json.load(f)


def _logits(model, params, tokens=TOKENS):
  return np.asarray(jax.jit(lambda p, t: model.apply({"params": p}, t, train=False))(
      params, jnp.asarray(tokens, jnp.int32)))


def test_config_fields_become_gpt_settings(hf_model):
  """hf_reference's gemma, gemma2 (3 layers: transformers' default alternation) and gemma3
  (layer_types sliding, sliding, full; per-type RoPE) as GPT settings."""
  g1, g2, g3 = (hf.model_from_config(_config(hf_model(n))) for n in ("gemma", "gemma2", "gemma3"))
  for m in (g1, g2, g3):
    assert (m.norm, m.mlp, m.embed_scale, m.head_dim, m.d_model, m.tie_embeddings) == (
        "rms1p", "geglu", True, 16, 32, True)
  assert (g1.ln, g1.sliding_window, g1.attn_softcap, g1.logit_softcap, g1.n_kv_head) == (
      "pre", 0, 0.0, 0.0, 1)
  assert (g2.ln, g2.attn_scale_dim, g2.attn_softcap, g2.logit_softcap, g2.qk_norm) == (
      "sandwich", 24.0, 4.0, 6.0, False)
  assert (g2.sliding_window, g2.attn_pattern, g2.local_layers) == (8, "lg", (True, False, True))
  assert (g3.qk_norm, g3.attn_scale_dim, g3.attn_softcap, g3.logit_softcap) == (
      True, 12.0, 0.0, 0.0)
  assert (g3.attn_pattern, g3.local_layers) == ("llg", (True, True, False))
  assert (g3.rope_theta, g3.rope_scaling, g3.rope_factor, g3.rope_local_theta) == (
      1e6, "linear", 4.0, 1e4)
  # transformers 4's spelling of Gemma 3's RoPE reads the same; so does its default pattern.
  v4 = {k: v for k, v in _config(hf_model("gemma3")).items()
        if k not in ("rope_parameters", "layer_types")}
  v4.update(rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear",
                                                                     "factor": 4.0},
            num_hidden_layers=13)
  m = hf.model_from_config(v4)
  assert (m.rope_theta, m.rope_scaling, m.rope_factor, m.rope_local_theta) == (
      1e6, "linear", 4.0, 1e4)
  assert m.attn_pattern == "lllllg" and m.local_layers.count(False) == 2


def test_norms_are_one_plus_w_in_float32():
  """RMSNorm(plus_one): x / sqrt(mean(x^2) + eps) (1 + w), w initialised at 0 (gain 1)."""
  norm = layers.RMSNorm(epsilon=0.0, plus_one=True)
  x = jnp.asarray([[3.0, 4.0]])
  assert norm.init(jax.random.key(0), x)["params"]["scale"].tolist() == [0.0, 0.0]
  y = norm.apply({"params": {"scale": jnp.asarray([0.5, -0.5])}}, x)
  rms = np.sqrt(12.5)
  np.testing.assert_allclose(y, [[3 / rms * 1.5, 4 / rms * 0.5]], rtol=1e-6)
  # bf16 in and out, the gain computed in fp32 (transformers: (1 + w.float())): w = 2^-9 is
  # below bf16's resolution at 1, so a bf16 sum 1 + w would drop it.
  norm16 = layers.RMSNorm(epsilon=0.0, plus_one=True, dtype=jnp.bfloat16,
                          param_dtype=jnp.bfloat16)
  y16 = norm16.apply({"params": {"scale": jnp.full((2,), 2.0 ** -9, jnp.bfloat16)}},
                     jnp.asarray([[256.0, 256.0]], jnp.bfloat16))
  assert y16.dtype == jnp.bfloat16 and float(y16[0, 0]) == 1.0  # 1 + 2^-9 rounds to 1 at the end
  y32 = layers.RMSNorm(epsilon=0.0, plus_one=True).apply(
      {"params": {"scale": jnp.full((2,), 2.0 ** -9)}}, jnp.asarray([[256.0, 256.0]]))
  assert float(y32[0, 0]) == 1.0 + 2.0 ** -9


def test_each_gemma_operation_acts(hf_model):
  """Switched off one at a time, the logits leave transformers' by far more than the 1e-5 the
  round trip holds them to: the attention and final soft-caps and the query scale (gemma2),
  the embedding scale (gemma), the q/k norms' (1 + w) and the local layers' own RoPE (gemma3);
  and the final cap bounds the logits. The stored norm weights are transformers' w, not 1 + w."""
  src = hf_model("gemma2")
  ref = hf_reference.load(src)
  want = hf_reference.logits(ref, TOKENS)
  model, params = hf.load_hf(src)
  assert np.abs(want).max() < 6.0 and np.abs(want).max() > 2.0  # the cap 6 tanh(z / 6) bends
  for change in (dict(attn_softcap=0.0), dict(logit_softcap=0.0), dict(attn_scale_dim=0.0)):
    assert np.abs(_logits(model.clone(**change), params) - want).max() > 1e-2, change
  w = hf.read_weights(src)["model.layers.1.pre_feedforward_layernorm.weight"]
  np.testing.assert_array_equal(params["h"]["ln_2"]["scale"][1], w)
  assert abs(float(np.mean(w))) < 0.1  # drawn around 0: the gain 1 + w is ~1

  src = hf_model("gemma")
  want = hf_reference.logits(hf_reference.load(src), TOKENS)
  model, params = hf.load_hf(src)
  assert np.abs(_logits(model.clone(embed_scale=False), params) - want).max() > 1e-2

  src = hf_model("gemma3")
  want = hf_reference.logits(hf_reference.load(src), TOKENS)
  model, params = hf.load_hf(src, scan_layers=False)  # unrolled: each layer's kind concrete
  np.testing.assert_allclose(_logits(model, params), want, atol=1e-5, rtol=0)
  assert np.abs(_logits(model.clone(rope_local_theta=0.0), params) - want).max() > 1e-2
  plain_qk = model.clone(norm="rms")  # q/k norms (and block norms) as Qwen3's w, not 1 + w
  assert np.abs(_logits(plain_qk, params) - want).max() > 1e-2


def test_every_attention_path_takes_the_query_scale_and_the_softcap_its_own_path():
  """scale replaces 1 / sqrt(K) on the reference, chunked and XLA paths alike; a softcap c
  (c tanh(z / c) on the scaled logits) sends any path to the reference one, which computes it."""
  q, k, v = (jax.random.normal(jax.random.key(i), (1, 8, 4, 16)) * 3 for i in range(3))
  kv = (k[:, :, :2], v[:, :, :2])  # grouped: 2 key/value heads
  ref = attention.dot_product_attention(q, *kv, causal=True, impl="reference", scale=0.2)
  for impl in ("chunked", "xla"):
    np.testing.assert_allclose(attention.dot_product_attention(q, *kv, causal=True, impl=impl,
                                                               scale=0.2), ref, atol=1e-5)
  assert np.abs(ref - attention.dot_product_attention(q, *kv, causal=True)).max() > 1e-2
  capped = attention.dot_product_attention(q, *kv, causal=True, impl="xla", scale=0.2,
                                           softcap=1.0)
  out, w = attention.attention_reference(q, *kv, causal=True, scale=0.2, softcap=1.0)
  np.testing.assert_allclose(capped, out, atol=1e-6)
  z = np.einsum("bthk,bshk->bhts", q, np.repeat(kv[0], 2, axis=2)) * 0.2
  z = np.where(np.tril(np.ones((8, 8), bool)), np.tanh(z), -np.inf)  # c = 1: tanh(z)
  np.testing.assert_allclose(w, np.exp(z) / np.exp(z).sum(-1, keepdims=True), atol=1e-6)
  assert np.abs(capped - ref).max() > 1e-2


REFUSED = [  # (family, config changes, the field the one line names)
    ("gemma2", dict(hidden_activation="gelu"), 'hidden_activation="gelu"'),
    ("gemma", dict(attention_bias=True), "attention_bias=true"),
    ("gemma3", dict(attn_logit_softcapping=50.0), "attn_logit_softcapping=50.0"),
    ("gemma3", dict(use_bidirectional_attention=True), "use_bidirectional_attention=true"),
    ("gemma3", dict(rope_parameters={
        "sliding_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1e6}}),
     'rope_parameters.sliding_attention.rope_type="linear"'),
    ("gemma2", dict(sliding_window=None), "sliding_window=null"),
    ("gemma2", dict(layer_types=["sliding_attention", "chunked_attention", "full_attention"]),
     "layer_types="),
    ("gemma2", dict(layer_types=["sliding_attention", "full_attention"]), "layer_types="),
    ("gemma2", dict(final_logit_softcapping=-1.0), "final_logit_softcapping=-1.0"),
]


@pytest.mark.parametrize("name,changes,field", REFUSED)
def test_an_unrepresentable_config_is_one_line_naming_the_field(name, changes, field, hf_model):
  cfg = {**_config(hf_model(name)), **changes}
  with pytest.raises(ConfigError, match=r"^config.json: " + re.escape(field) + r"[^\n]*$"):
    hf.model_from_config(cfg)


@pytest.mark.parametrize("name,kv_heads", [("gemma", 16), ("gemma2", 4), ("gemma3", 4)])
def test_a_config_without_num_key_value_heads_has_its_config_class_default(name, kv_heads):
  """GemmaConfig's 16, Gemma2Config's and Gemma3TextConfig's 4 (not the number of heads)."""
  kind = {"gemma3": "gemma3_text"}.get(name, name)
  cfg = dict(model_type=kind, vocab_size=64, hidden_size=32, intermediate_size=48,
             num_hidden_layers=2, num_attention_heads=32, head_dim=16,
             max_position_embeddings=64)
  assert hf.model_from_config(cfg).n_kv_head == kv_heads


def test_load_refuses_before_reading_weights(hf_model, tmp_path):
  d = tmp_path / "g"
  shutil.copytree(hf_model("gemma3"), d)
  (d / "config.json").write_text(json.dumps({**_config(d), "attention_bias": True}))
  with pytest.raises(ConfigError, match=r"^[^\n]*attention_bias=true cannot be imported[^\n]*$"):
    hf.load_hf(str(d))


def test_exports_a_layout_cannot_hold_are_refused(hf_model):
  g1, g2 = (hf.model_from_config(_config(hf_model(n))) for n in ("gemma", "gemma2"))
  mixed = hf.model_from_config(_config(hf_model("qwen2_mixed")))
  for model, model_type, message in (
      (g2, "gemma", "model.ln: a gemma checkpoint needs 'pre', got 'sandwich'"),
      (g2, "gemma3_text", "model.qk_norm: a gemma3_text checkpoint needs True"),
      (g1, "llama", "model.embed_scale: a Llama-family checkpoint needs False, got True"),
      (g1.clone(embed_scale=False), "llama", "model.norm: a Llama-family checkpoint needs "
                                             "'rms', got 'rms1p'"),
      (g2.clone(norm="rms"), "gemma2", "model.norm: a gemma2 checkpoint needs 'rms1p'"),
      (mixed, "mistral", "model.attn_pattern: a mistral checkpoint windows every layer"),
      (g2, "gemma4", "model_type: 'gemma4'; expected one of")):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
      hf.export_type(model, model_type)
  assert hf.export_type(g2, None) == "gemma2" and hf.export_type(mixed, None) == "qwen2"


@pytest.mark.parametrize("change,message", [
    (dict(attn_pattern="lx"), "model.attn_pattern: must be letters 'l' (local) and 'g'"),
    (dict(attn_pattern="lg"), "model.attn_pattern: has local layers ('l'), which need "
                              "sliding_window > 0"),
    (dict(rope_local_theta=1e4), "model.rope_local_theta: sets the local layers' RoPE; "
                                 "pos='learned' has none"),
    (dict(pos="rope", rope_local_theta=1e4, sliding_window=8, attn_pattern="g"),
     "model.rope_local_theta: sets the local layers' RoPE; there are none (sliding_window=8, "
     "attn_pattern='g')"),
    (dict(rope_partial=0.5), "model.rope_partial: is the share of features RoPE turns; "
                             "pos='learned' has none"),
    (dict(mixer="ssm", attn_softcap=50.0), "model.attn_softcap: acts on attention; "
                                           "mixer='ssm' has none"),
])
def test_layer_kind_settings_the_model_cannot_use_are_refused(change, message):
  from jaxdl import models  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match="^" + re.escape(message)):
    models.build_model(models.gpt_config("tiny", **change))
