"""Hugging Face Llama / Mistral / Qwen2 / Qwen3 / GPT-2 import and export (`jaxdl.models.hf`).

The models are tiny random ones that transformers builds and saves inside the tests
(tests/hf_reference.py, `conftest.hf_model`), held to what transformers computes on them here.
Every family's logits, greedy tokens and export reload are tests/test_hf_roundtrip.py's; this
module checks the rest: batched left-padded decoding with an end of sequence, Mistral's window,
the layouts, the tensors an export writes, the tokenizer and the refusals. Exports that
transformers loads back (more variants, GPT-2, dtypes) are tests/test_hf_save.py's.
"""

import json
import os
import re
import shutil

import chex
import hf_reference
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.data import tokenize
from jaxdl.models import decoding, hf, hf_families, hf_tensors, lora, stack
from jaxdl.schema import ConfigError

NAMES = ("llama", "llama_tied", "mistral", "qwen2")
TOKENS = np.random.default_rng(100).integers(0, 96, (2, 8))  # a fixed batch (vocab_size 96)


@pytest.fixture(scope="module")
def reference(hf_model):
  """reference(name, **kw) -> (the directory `hf_model(name, **kw)`, transformers' model of it
  loaded back from there), once per module."""
  cache = {}

  def get(name, **kw):
    key = (name, repr(sorted(kw.items())))
    if key not in cache:
      directory = hf_model(name, **kw)
      cache[key] = directory, hf_reference.load(directory)
    return cache[key]

  return get


@pytest.fixture(scope="module")
def llama_dir(hf_model):
  """The tokenized, sharded llama (`hf_reference.TOKENIZED_LLAMA`)."""
  return hf_model("llama", **hf_reference.TOKENIZED_LLAMA)


def _logits(model, params, tokens):
  return np.asarray(jax.jit(lambda p, t: model.apply({"params": p}, t, train=False))(
      params, jnp.asarray(tokens, jnp.int32)))


def _header(directory):
  """{name: (shape, dtype)} of every tensor of a model directory's safetensors."""
  return {k: (v.shape, v.dtype) for k, v in hf.read_weights(directory).items()}


def _copy(src, tmp_path, **config_changes):
  """The model directory `src` copied to tmp_path with config.json entries changed (None
  deletes)."""
  out = tmp_path / os.path.basename(src)
  shutil.copytree(src, out)
  cfg = json.loads((out / "config.json").read_text())
  for k, v in config_changes.items():
    cfg.pop(k) if v is None else cfg.__setitem__(k, v)
  (out / "config.json").write_text(json.dumps(cfg))
  return out


@pytest.mark.parametrize("name", ("llama", "mistral", "qwen2"))
def test_batched_greedy_generation_with_an_eos_matches_transformers(name, reference):
  """A batch whose row 1 is left-padded by 5 (transformers' attention mask 0 there), decoded
  greedily until eos, taken from a run without one as the first of row 0's new tokens from the
  4th on that row 1 never draws: row 0 meets it and is padded with 0 after it as transformers
  does; row 1 never does: 16 tokens. Mistral's window is
  16: its logits at 40 tokens and its 28-token rows without eos run past it. transformers'
  `generate` computes both runs here, and its smallest top-1 minus top-2 logit must exceed 1e-3
  (the logits agree to 1e-5: test_hf_roundtrip)."""
  directory, ref = reference(name)
  model, params = hf.load_hf(directory)
  rng = np.random.default_rng(206)
  prompt = rng.integers(1, 96, (2, 12))
  mask = np.ones_like(prompt)
  prompt[1, :5], mask[1, :5] = 0, 0
  generated, margin = hf_reference.greedy(ref, prompt, 16, attention_mask=mask)
  assert generated.shape == (2, 28)
  eos = next(int(t) for t in generated[0, 12 + 3:] if t not in generated[1, 12:])
  assert list(generated[0, 12:]).index(eos) < 15  # row 0 stops before its last token
  want, _ = hf_reference.greedy(ref, prompt, 16, attention_mask=mask, eos=eos)
  assert margin > 1e-3  # the greedy choices are decided well above 1e-5
  prompt_BxP = jnp.asarray(prompt, jnp.int32)
  start_B = jnp.asarray((mask == 0).sum(1), jnp.int32)
  assert start_B.tolist() == [0, 5]
  out = decoding.generate(model, params, prompt_BxP, jax.random.key(0), 16, start_B=start_B,
                          temperature=0, eos_ids=[eos])
  np.testing.assert_array_equal(np.asarray(out), want)
  assert (want[0, -1], want[1, -1]) == (0, generated[1, -1])  # row 0 padded after eos
  if name == "mistral":
    long_tokens = rng.integers(0, 96, (2, 40))
    assert model.sliding_window == 16
    np.testing.assert_allclose(_logits(model, params, long_tokens),
                               hf_reference.logits(ref, long_tokens), atol=1e-5, rtol=0)
    out = decoding.generate(model, params, prompt_BxP, jax.random.key(0), 16, start_B=start_B,
                            temperature=0)
    np.testing.assert_array_equal(np.asarray(out), generated)


@pytest.mark.parametrize("name", ("llama3", "qwen3"))
def test_llama3_and_qwen3_import_their_layout_and_export_back(name, hf_model, tmp_path):
  """llama3: Llama 3.1's RoPE scaling and heads of 16 features (hidden / heads = 8); qwen3: its
  per-head q/k RMSNorm, head_dim 16, YaRN (attention factor 0.1 ln 4 + 1) and a tied head
  (their logits within 1e-5 of transformers', 16 greedy tokens and the export's reload:
  test_hf_roundtrip). The import's shapes, and an export holding exactly the source's tensors
  and RoPE settings that imports back to the same model."""
  src = hf_model(name)
  model, params = hf.load_hf(src)
  assert (model.head_dim, model.head_width, model.d_model, model.n_head) == (16, 16, 32, 4)
  assert (model.rope_scaling, model.qk_norm) == (
      {"llama3": ("llama3", False), "qwen3": ("yarn", True)}[name])
  assert params["h"]["attn"]["c_attn"]["kernel"].shape == (2, 32, (4 + 2 * 2) * 16)
  assert params["h"]["attn"]["c_proj"]["kernel"].shape == (2, 64, 32)
  hf.save_hf(str(tmp_path), model, params)
  assert _header(str(tmp_path)) == _header(src)
  chex.assert_trees_all_equal(hf.read_weights(str(tmp_path)), hf.read_weights(src))
  ours = json.loads((tmp_path / "config.json").read_text())
  theirs = _config(src)
  assert (ours["model_type"], ours["head_dim"]) == (theirs["model_type"], 16)
  for key, value in theirs["rope_parameters"].items():  # v5's settings, written v4's way
    assert (ours if key == "rope_theta" else ours["rope_scaling"])[key] == value, key
  model2, params2 = hf.load_hf(str(tmp_path))
  assert model2 == model
  chex.assert_trees_all_equal(params2, params)


def test_lora_on_wider_heads_merges_and_exports(hf_model, tmp_path):
  """LoRA on every attention site of qwen3 (queries H K = 64 wide, D = 32): the merged model
  computes the adapted one, and exports as qwen3."""
  base, params = hf.load_hf(hf_model("qwen3"))
  model = base.clone(lora_rank=2, lora_targets=("attn",))
  tok = jnp.asarray(TOKENS, jnp.int32)
  init = jax.jit(lambda: model.init(jax.random.key(0), tok, train=False))()["params"]
  assert init["h"]["attn"]["lora_q"]["b"].shape == (2, 2, 64)
  assert init["h"]["attn"]["lora_o"]["a"].shape == (2, 64, 2)
  rng = np.random.default_rng(0)  # nonzero B, so every adapter changes the output
  adapted = {**init, **params, "h": {**init["h"], "attn": {**init["h"]["attn"], **params["h"][
      "attn"]}, **{k: v for k, v in params["h"].items() if k != "attn"}}}
  adapted = jax.tree_util.tree_map_with_path(
      lambda p, a: a + 0.1 * rng.normal(size=a.shape).astype(np.float32)
      if "lora_" in jax.tree_util.keystr(p) else a, adapted)
  merged_model, merged = lora.merge(model, adapted)
  want = _logits(model, adapted, tok)
  assert np.abs(want - _logits(base, params, tok)).max() > 1e-2
  np.testing.assert_allclose(_logits(merged_model, merged, tok), want, atol=1e-5, rtol=0)
  hf.save_hf(str(tmp_path), merged_model, merged)
  assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen3"


def test_config_fields_and_unrolled_layers(reference, hf_model, llama_dir):
  """The sharded llama, unrolled, computes transformers' logits; scanned, the same params."""
  _, ref = reference("llama", **hf_reference.TOKENIZED_LLAMA)
  model, params = hf.load_hf(llama_dir, scan_layers=False)
  assert (model.n_head, model.kv_heads, model.d_model, model.mlp_hidden, model.n_layer) == (
      4, 2, 32, 48, 2)
  assert (model.rope_theta, model.epsilon, model.tie_embeddings, model.qkv_bias) == (
      5e5, 1e-5, False, False)
  assert len(hf.weight_files(llama_dir)) == 5
  np.testing.assert_allclose(_logits(model, params, TOKENS), hf_reference.logits(ref, TOKENS),
                             atol=1e-5, rtol=0)
  scanned, p_scanned = hf.load_hf(llama_dir)
  chex.assert_trees_all_equal(stack.stack_layers(params), p_scanned)
  assert scanned.scan_layers and "h" in p_scanned
  # Mistral's window of 16 below its 64 positions: a setting, the context stays 64.
  mistral = hf.load_hf(hf_model("mistral"))[0]
  assert (mistral.sliding_window, mistral.block_size) == (16, 64)
  qwen2, p = hf.load_hf(hf_model("qwen2"))
  assert qwen2.qkv_bias and not qwen2.use_bias and qwen2.rope_theta == 1e6
  assert p["h"]["attn"]["c_attn"]["bias"].shape == (2, 32 + 2 * 8)
  assert "bias" not in p["h"]["attn"]["c_proj"] and "lm_head" in p
  assert "lm_head" not in hf.load_hf(hf_model("llama_tied"))[1]


@pytest.mark.parametrize("name", NAMES)
def test_export_writes_the_tensors_transformers_saved(name, hf_model, tmp_path):
  """save_hf's files hold exactly the tensors transformers saved (names, shapes, dtypes and
  values), so transformers loads them as it loaded its own; and they import back to the same
  params."""
  src = hf_model(name)
  model, params = hf.load_hf(src)
  shard = 20_000 if name == "llama" else None
  files = hf.save_hf(str(tmp_path), model, params, model_type=name.split("_")[0],
                     max_shard_bytes=shard)
  assert (len(files) > 1) == (name == "llama")
  assert _header(str(tmp_path)) == _header(src)
  chex.assert_trees_all_equal(hf.read_weights(str(tmp_path)), hf.read_weights(src))
  ours = json.loads((tmp_path / "config.json").read_text())
  theirs = _config(src)
  for key in ("model_type", "architectures", "vocab_size", "hidden_size", "intermediate_size",
              "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "rms_norm_eps", "tie_word_embeddings"):
    assert ours[key] == theirs[key], key
  assert ours["rope_theta"] == theirs["rope_parameters"]["rope_theta"]
  model2, params2 = hf.load_hf(str(tmp_path))
  chex.assert_trees_all_equal(params2, params)
  assert model2 == model  # mistral's window included
  assert ours.get("sliding_window") == theirs.get("sliding_window")


def test_tokenizer_beside_the_weights(llama_dir, tmp_path):
  tok = tokenize.load_hf_tokenizer(llama_dir)
  assert tok.vocab_size <= 96 and tok.hf.id_to_token(tok.eot_id) == "</s>"
  assert tok.decode(tok.encode("the quick brown fox")) == "the quick brown fox"
  # A model directory is a tokenizer spec (`jaxdl data prepare --tokenizer DIR`).
  assert tokenize.get_tokenizer(llama_dir).fingerprint == tok.fingerprint
  # More ids than the embedding has rows: refused in one line.
  from tokenizers import Tokenizer, models
  big = tmp_path / "big"
  big.mkdir()
  vocab = {f"w{i}": i for i in range(199)} | {"</s>": 199}
  Tokenizer(models.WordLevel(vocab, unk_token="w0")).save(str(big / "tokenizer.json"))
  shutil.copy(os.path.join(llama_dir, "config.json"), big)
  with pytest.raises(ValueError, match=r"^--tokenizer: .* has 200 ids but the model's "
                                       r"vocab_size is 96: the tokenizer does not match[^\n]*$"):
    tokenize.load_hf_tokenizer(str(big))
  assert cli.main(["generate", str(big), "--prompt", "w1 w2"]) == 2


def test_generate_cli_continues_a_prompt(llama_dir, capsys):
  assert cli.main(["generate", llama_dir, "--prompt", "the quick",
                   "--temperature", "0", "--max-new-tokens", "4", "--num", "2"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 2 and lines[0] == lines[1] and lines[0].startswith("the quick")


BAD_CONFIGS = [
    ("llama3", dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}),
     "rope_parameters.rope_type=\"longrope\""),
    ("llama", dict(rope_scaling={"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}),
     "rope_scaling.low_freq_factor=1.0"),
    ("llama", dict(rope_scaling={"rope_type": "linear"}), "rope_scaling.factor=null"),
    ("qwen3", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                    "truncate": False}), "rope_parameters.truncate=false"),
    ("llama", dict(partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
    ("mistral", dict(hidden_act="gelu"), "hidden_act=\"gelu\""),
    ("llama_tied", dict(head_dim=15), "head_dim=15"),
    ("qwen3", dict(attention_bias=True), "attention_bias=true"),
    ("llama_tied", dict(model_type="phi"), "model_type=\"phi\""),
    ("mistral", dict(mlp_bias=True), "mlp_bias=true"),
    ("phi3", dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}),
     "rope_parameters.rope_type=\"dynamic\""),
    ("llama_tied", dict(model_type="gemma3"), "model_type=\"gemma3\""),  # multimodal; *_text is
    ("llama_tied", dict(model_type="gemma"), "hidden_act=\"silu\""),  # Gemma's GELU, not SiLU
    ("llama_tied", dict(hidden_size=None), "hidden_size is missing"),
]


@pytest.mark.parametrize("name,changes,field", BAD_CONFIGS,
                         ids=[c[2].split("=")[0].split(" ")[0] + "-" + c[0] for c in BAD_CONFIGS])
def test_an_unrepresentable_config_is_one_line_naming_the_field(name, changes, field, hf_model,
                                                                tmp_path):
  d = _copy(hf_model(name), tmp_path, **changes)
  with pytest.raises(ConfigError, match=r"^[^\n]*" + re.escape(field) + r"[^\n]*$"):
    hf.load_hf(str(d))
  assert cli.main(["generate", str(d), "--prompt", "the"]) == 2


QWEN2_WINDOWS = [  # (config changes, the GPT's sliding_window), as transformers' Qwen2Config reads
    (dict(use_sliding_window=True, sliding_window=8, max_window_layers=0, layer_types=None), 8),
    (dict(use_sliding_window=True, sliding_window=8, max_window_layers=2, layer_types=None), 0),
    (dict(use_sliding_window=False, sliding_window=8, layer_types=None), 0),
    (dict(use_sliding_window=True, sliding_window=8, layer_types=["sliding_attention"] * 2), 8),
]


@pytest.mark.parametrize("changes,window", QWEN2_WINDOWS)
def test_qwen2_windows_every_layer_or_none(changes, window, hf_model):
  cfg = {k: v for k, v in {**_config(hf_model("qwen2")), **changes}.items() if v is not None}
  model = hf_families.model_from_config(cfg)
  assert (model.sliding_window, model.attn_pattern) == (window, "")


def test_qwen2_mixed_windows_are_a_layer_pattern(hf_model):
  """A mix of windowed and full layers (max_window_layers, or layer_types) is the GPT's
  attn_pattern, one letter per layer kind ('g' full, 'l' windowed); a kind that is neither is
  one line. (tests/test_hf_roundtrip.py holds qwen2_mixed to transformers.)"""
  base = _config(hf_model("qwen2"))  # 2 layers
  for changes in (dict(use_sliding_window=True, sliding_window=8, max_window_layers=1,
                       layer_types=None),
                  dict(use_sliding_window=True, sliding_window=8,
                       layer_types=["full_attention", "sliding_attention"])):
    cfg = {k: v for k, v in {**base, **changes}.items() if v is not None}
    model = hf_families.model_from_config(cfg)
    assert (model.sliding_window, model.attn_pattern, model.local_layers) == (8, "gl",
                                                                               (False, True))
  # MistralForCausalLM windows every layer whatever layer_types says (transformers warns).
  mistral = {**base, "model_type": "mistral", "sliding_window": 8,
             "layer_types": ["full_attention", "sliding_attention"]}
  assert hf_families.model_from_config(mistral).local_layers == (True, True)
  cfg = {**base, "use_sliding_window": True, "sliding_window": 8,
         "layer_types": ["full_attention", "chunked_attention"]}
  with pytest.raises(ConfigError, match=r'^config.json: layer_types=\["full_attention", '
                                        r'"chunked_attention"\] cannot be imported[^\n]*$'):
    hf_families.model_from_config(cfg)


def _config(directory):
  with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
    return json.load(f)


def test_bad_weights_are_one_line_errors(llama_dir, hf_model, tmp_path):
  d = _copy(llama_dir, tmp_path)
  os.remove(d / "model-00003-of-00005.safetensors")
  with pytest.raises(ConfigError, match=r"^.*index.json: shard model-00003-of-00005.safetensors "
                                        r"is missing from [^\n]*$"):
    hf.load_hf(str(d))
  model, params = hf.load_hf(hf_model("qwen2"))
  tensors = hf_tensors.to_tensors(params, model, "qwen2")
  del tensors["model.layers.1.self_attn.k_proj.bias"]
  with pytest.raises(ConfigError,
                     match=r"missing tensors .*: model.layers.1.self_attn.k_proj.bias$"):
    hf_tensors.to_params(tensors, model, "qwen2")
  tensors = hf_tensors.to_tensors(params, model, "qwen2")
  tensors["model.layers.0.mlp.up_proj.weight"] = np.zeros((32, 48), np.float32)
  with pytest.raises(ConfigError, match=r"misshaped .*up_proj.weight \(32, 48\) \(expected "
                                        r"\(48, 32\)\)$"):
    hf_tensors.to_params(tensors, model, "qwen2")
  # Export refuses a model no supported layout holds, naming the setting.
  with pytest.raises(ConfigError, match=r"^model.norm: a Llama-family checkpoint needs 'rms'"):
    hf.save_hf(str(tmp_path / "out"), model.clone(norm="layer"), params)
  with pytest.raises(ConfigError, match=r"^model.qkv_bias: llama checkpoints have no query"):
    hf.save_hf(str(tmp_path / "out"), model, params, model_type="llama")
