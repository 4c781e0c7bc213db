"""`jaxdl export`: a trained LoRA run of a Llama-shaped GPT becomes a Hugging Face directory whose
model (the adapters merged into the base) computes the adapted model's logits; bad input is one
line, exit 2, and writes nothing."""

import errno
import hashlib
import json
import os
import shutil
from collections.abc import Mapping

import hf_reference
import jax
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.models import hf, lora
from jaxdl.schema import ConfigError
from jaxdl.train import load_run

LLAMA_SHAPED = ["model.pos='rope'", "model.norm='rms'", "model.mlp='swiglu'",
                "model.use_bias=False", "model.tie_embeddings=False", "model.n_layer=1",
                "model.d_model=32", "model.n_head=4", "model.n_kv_head=2", "model.lora_rank=2",
                "model.lora_targets=('q','v','mlp')", "train.steps=3", "train.eval_every=3",
                "train.ckpt_every=3", "train.plot=False", "data.max_bytes=20000",
                "data.max_eval_windows=4", "sample.max_new_tokens=0"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("lora") / "run"
  sets = [a for kv in LLAMA_SHAPED for a in ("--set", kv)]
  assert cli.main(["train", "char_gpt:smoke", "--workdir", str(workdir), "--no-progress",
                   *sets]) == 0
  return workdir


def test_the_exported_directory_computes_the_adapted_models_logits(lora_run, tmp_path, capsys):
  out = tmp_path / "hf"
  assert cli.main(["export", str(lora_run), "--out", str(out), "--max-shard-bytes", "20000"]) == 0
  assert "exported" in capsys.readouterr().out
  config = json.loads((out / "config.json").read_text())
  assert config["model_type"] == "llama" and config["num_key_value_heads"] == 2
  assert (out / "model.safetensors.index.json").is_file()  # sharded as asked
  _, model, variables, _ = load_run(lora_run)
  assert model.lora_rank == 2
  tokens = np.random.default_rng(0).integers(0, model.vocab_size, (2, 16)).astype(np.int32)
  # Each model compiled, not run op by op (each eager operation is a program of its own).
  apply = jax.jit(lambda m, v: m.apply(v, tokens, train=False), static_argnums=0)
  adapted = np.asarray(apply(model, variables))
  exported_model, params = hf.load_hf(str(out), scan_layers=False)
  assert exported_model.lora_rank == 0
  merged = np.asarray(apply(exported_model, {"params": params}))
  np.testing.assert_allclose(merged, adapted, atol=1e-5, rtol=1e-5)
  # The adapters trained (B starts at zero), so the merged weights are not the base's: the
  # exported model differs from the adapted model with its adapters switched off.
  base = np.asarray(apply(model.clone(lora_rank=0), {"params": jax.tree.map(
      np.asarray, _without_adapters(variables["params"]))}))
  assert np.abs(merged - base).max() > 1e-4


def _without_adapters(tree):
  if not isinstance(tree, Mapping):
    return tree
  return {k: _without_adapters(v) for k, v in tree.items() if not k.startswith(lora.PREFIX)}


def test_bad_exports_are_one_line_exit_2_and_write_nothing(lora_run, tmp_path, capsys):
  cases = [
      (["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "a")], "no trained run"),
      (["export", str(lora_run), "--out", str(lora_run)], "already exists"),
      (["export", str(lora_run), "--out", str(tmp_path / "b"), "--model-type", "gpt2"],
       "model.pos: a GPT-2 checkpoint needs 'learned'"),
      (["export", str(lora_run), "--out", str(tmp_path / "c"), "--max-shard-bytes", "0"],
       "--max-shard-bytes"),
  ]
  for argv, needle in cases:
    capsys.readouterr()
    assert cli.main(argv) == 2, argv
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jaxdl: error: ") and needle in err[0], (argv, err)
  assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_full_disk_is_one_line_exit_2_and_leaves_nothing(lora_run, tmp_path, capsys,
                                                           monkeypatch):
  """The disk fills after the first weight file lands (forced: the writer raises ENOSPC then):
  one line, exit 2, and neither --out nor a temporary directory (nor a parent the export made)
  is left behind."""
  real = hf.write_safetensors

  def full_after_writing(path, tensors, metadata=None):
    real(path, tensors, metadata)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

  monkeypatch.setattr(hf, "write_safetensors", full_after_writing)
  for out in (tmp_path / "hf", tmp_path / "new" / "parent" / "hf"):
    capsys.readouterr()
    assert cli.main(["export", str(lora_run), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("jaxdl: error: export: no space left on device: "), err
  assert list(tmp_path.iterdir()) == []


CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}</s>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_an_export_carries_the_bases_tokenizer_special_ids_and_chat_template(hf_model, tmp_path,
                                                                             capsys):
  """A full fine-tune of a Hugging Face base (init_from) on data prepared with its tokenizer,
  saved at the base's own weights: the export holds those weights, the tokenizer.json, and
  bos/eos/pad ids and the chat template as the base declared them (generation_config.json and
  tokenizer_config.json), where transformers' AutoTokenizer and generate read them; `jaxdl
  generate --chat` on the export renders that template and stops at that eos."""
  from jaxdl.config import load_config
  from jaxdl.data import prepare
  from jaxdl.data.tokenize import load_hf_tokenizer
  from jaxdl.generative import evaluation
  from jaxdl.train import init_from
  llama = hf_model("llama", **hf_reference.TOKENIZED_LLAMA)  # '<s>' 1, '</s>' 2
  base, data = tmp_path / "base", tmp_path / "data"
  shutil.copytree(llama, base)
  (base / "generation_config.json").write_text(json.dumps({"bos_token_id": 1,
                                                           "eos_token_id": 2}))
  (base / "tokenizer_config.json").write_text(json.dumps({
      "bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": CHATML}))
  data.mkdir()
  shutil.copy(base / "tokenizer.json", data)
  tokenizer = {"tokenizer": prepare.tokenizer_entry(load_hf_tokenizer(str(base)))}
  (data / "manifest.json").write_text(json.dumps(tokenizer))  # prepared with the base's
  config = init_from.resolve(load_config("finetune_lora:full", [f"init_from={base}",
                                                                 f"data.path={data}"])[0])
  model, params = hf.load_hf(str(base))
  run = evaluation.save_run(tmp_path / "run", config, params, step=0)
  out = tmp_path / "hf"
  assert cli.main(["export", str(run), "--out", str(out)]) == 0
  assert sorted(p.name for p in out.iterdir()) == [
      "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
      "tokenizer_config.json"]
  chex_equal = jax.tree.map(np.array_equal, hf.read_weights(str(out)), hf.read_weights(llama))
  assert all(jax.tree.leaves(chex_equal))
  config_json = json.loads((out / "config.json").read_text())
  generation = json.loads((out / "generation_config.json").read_text())
  for cfg in (config_json, generation):
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (1, 2, 2)
  tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
  assert (tok_cfg["bos_token"], tok_cfg["eos_token"], tok_cfg["pad_token"]) == ("<s>", "</s>",
                                                                                "</s>")
  assert tok_cfg["chat_template"] == CHATML and tok_cfg["model_max_length"] == 64
  assert (out / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
  assert hf.special_ids(str(out)) == {"bos": 1, "eos": [2], "pad": 2}
  capsys.readouterr()
  assert cli.main(["generate", str(out), "--chat", "--prompt", "the quick brown fox", "--prompt",
                   "sea", "--temperature", "0", "--max-new-tokens", "6"]) == 0
  assert len(capsys.readouterr().out.splitlines()) == 2
  # Data whose manifest names the template its chats were rendered with: only that one goes.
  for entry, has_template in (({"template": "tokenizer", "template_sha256": hashlib.sha256(
      CHATML.encode()).hexdigest()}, True), ({"template": "plain"}, False),
                              ({"template": "x.jinja", "template_sha256": "0" * 64}, False)):
    (data / "manifest.json").write_text(json.dumps({**tokenizer, "loss_mask": entry}))
    shutil.rmtree(out)
    assert cli.main(["export", str(run), "--out", str(out)]) == 0
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert ("chat_template" in tok_cfg) == has_template
    assert ("export: no chat_template" in capsys.readouterr().out) != has_template
  # Without generation_config.json the ids come from tokenizer_config.json's tokens.
  (base / "generation_config.json").unlink()
  assert hf.special_ids(str(base), load_hf_tokenizer(str(base)).hf.token_to_id) == {
      "bos": 1, "eos": [2], "pad": None}


def test_a_window_exports_as_mistral_or_qwen2_and_never_as_llama(hf_model, tmp_path):
  model, params = hf.load_hf(hf_model("mistral"))
  assert hf.save_hf(str(tmp_path / "m"), model, params) == ["model.safetensors"]
  assert json.loads((tmp_path / "m" / "config.json").read_text())["sliding_window"] == 16
  hf.save_hf(str(tmp_path / "q"), model.clone(qkv_bias=True), params | {"h": params["h"] | {
      "attn": params["h"]["attn"] | {"c_attn": params["h"]["attn"]["c_attn"] | {
          "bias": np.zeros((2, 64), np.float32)}}}})
  qwen2 = json.loads((tmp_path / "q" / "config.json").read_text())
  assert (qwen2["model_type"], qwen2["use_sliding_window"], qwen2["sliding_window"],
          qwen2["max_window_layers"]) == ("qwen2", True, 16, 0)
  assert hf.load_hf(str(tmp_path / "q"))[0].sliding_window == 16
  with pytest.raises(ConfigError, match=r"^model.sliding_window: a llama checkpoint has no window"):
    hf.save_hf(str(tmp_path / "l"), model, params, model_type="llama")
  assert not (tmp_path / "l").exists()
