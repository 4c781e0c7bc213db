"""`jaxdl export`: a trained LoRA run of a Llama-shaped GPT becomes a Hugging Face directory whose
model (the adapters merged into the base) computes the adapted model's logits; bad input is one
line, exit 2, and writes nothing."""

import errno
import json
import os
from collections.abc import Mapping

import jax
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.models import hf, lora
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


def test_a_full_disk_is_one_line_exit_1_and_leaves_nothing(lora_run, tmp_path, capsys,
                                                           monkeypatch):
  """The disk fills after the first weight file lands (forced: the writer raises ENOSPC then):
  one line, exit 1, and neither --out nor a temporary directory (nor a parent the export made)
  is left behind."""
  real = hf.write_safetensors

  def full_after_writing(path, tensors, metadata=None):
    real(path, tensors, metadata)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

  monkeypatch.setattr(hf, "write_safetensors", full_after_writing)
  for out in (tmp_path / "hf", tmp_path / "new" / "parent" / "hf"):
    capsys.readouterr()
    assert cli.main(["export", str(lora_run), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("jaxdl: error: export: no space left on device: "), err
  assert list(tmp_path.iterdir()) == []
