"""The README's fine-tuning commands (`<!-- finetune:hf -->`), run verbatim in one process on a
tiny Llama that transformers saves inside the test as a chat model comes from the Hub
(`hf_reference.CHAT_LLAMA`: 5 shards, a 64-id BPE tokenizer with bos / eos and a chat template
in transformers' own files) and a chat file the test writes; only the length and the batch are
shrunk (`--set`). The architecture comes from the base (`jaxdl.train.init_from.resolve`), from a
Hugging Face directory and from a jaxdl run, and data of another tokenizer, or a base that is
not there, is one line, exit 2, with nothing written. The LoRA run, exported with `jaxdl
export`, round trips through transformers: its tokenizer, chat template and eos, and `generate`
equal to `jaxdl generate` on the export."""

import json
import pathlib
import re
import shlex
import shutil

import hf_reference
import jax
import ml_collections
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.models import build_model, hf, lora
from jaxdl.train.checkpoint import load_state

ROOT = pathlib.Path(__file__).resolve().parents[1]
# 2 steps of batch 8: the commands as written, at the size of a test.
SHORT = ["train.steps=2", "train.plot=False", "data.batch_size=8", "data.eval_batch_size=8",
         "data.max_eval_windows=8"]


def readme_commands() -> list[list[str]]:
  text = (ROOT / "README.md").read_text()
  found = re.search(r"<!-- finetune:hf -->\n```sh\n(.*?)```\n<!-- /finetune:hf -->", text, re.S)
  assert found, "README.md has no <!-- finetune:hf --> sh block"
  lines = [shlex.split(line) for line in found.group(1).splitlines() if line.strip()]
  assert all(line[0] == "jaxdl" for line in lines), lines
  return [line[1:] for line in lines]


def train(argv: list[str]) -> list[str]:
  return [*argv, "--no-progress", *(a for kv in SHORT for a in ("--set", kv))]


def one_error_line(capsys) -> str:
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1, err
  return err[0]


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, hf_model):
  """The README's three commands, run in a fresh directory: (directory, their argv)."""
  tmp = tmp_path_factory.mktemp("finetune")
  shutil.copytree(hf_model("llama", **hf_reference.CHAT_LLAMA), tmp / "my_model")
  records = [{"prompt": f"add {i} and {i + 1}", "response": f"{2 * i + 1}"} for i in range(200)]
  (tmp / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  commands = readme_commands()
  assert [c[:2] for c in commands] == [["data", "prepare"], ["train", "finetune_lora"],
                                       ["train", "finetune_lora:full"]]
  with pytest.MonkeyPatch.context() as mp:
    mp.chdir(tmp)
    for argv in commands:
      assert cli.main(train(argv) if argv[0] == "train" else argv) == 0, argv
  return tmp, commands


def test_lora_from_a_hugging_face_directory_takes_its_architecture_and_weights(finetuned):
  """The run's model is the Llama's (grouped-query 4 / 2 heads, RoPE base 5e5, SwiGLU 48, an
  untied head, 96 ids) with the experiment's LoRA on top, and after 2 steps every frozen base
  leaf is still the Hugging Face weight, bit for bit, while the adapters moved."""
  tmp, _ = finetuned
  run = tmp / "runs/finetune_lora"
  model = json.loads((run / "config.json").read_text())["model"]
  assert {k: model[k] for k in ("vocab_size", "n_layer", "d_model", "n_head", "n_kv_head",
                                "mlp_hidden", "rope_theta", "pos", "norm", "mlp",
                                "tie_embeddings", "lora_rank")} == dict(
      vocab_size=96, n_layer=2, d_model=32, n_head=4, n_kv_head=2, mlp_hidden=48,
      rope_theta=500000.0, pos="rope", norm="rms", mlp="swiglu", tie_embeddings=False,
      lora_rank=8)
  _, hf_params = hf.load_hf(str(tmp / "my_model"))
  step, state = load_state(run)
  adapters, base = lora.split(state["params"])
  want = lora.split(jax.device_get(hf_params))[1]
  assert step == 2 and base.keys() == want.keys() and len(adapters) == 2 * 6
  for k in base:
    np.testing.assert_array_equal(base[k], want[k], err_msg=k)
  assert any(np.abs(v).max() > 0 for k, v in adapters.items() if k.endswith("/b"))


def test_full_fine_tuning_from_a_jaxdl_run_starts_from_its_merged_weights(finetuned):
  """The third command's base is the LoRA run, its adapters folded in (W + (alpha / r) A B):
  after 2 AdamW steps (lr at most 1e-3 during warmup: an Adam step moves a weight by about lr)
  every weight moved, and is within 1e-2 of that merged base, far below the spread of the
  weights themselves (std 0.15: any other start fails it); the architecture is the Llama's."""
  tmp, _ = finetuned
  lora_run, full_run = tmp / "runs/finetune_lora", tmp / "runs/finetune_lora-full"
  config = json.loads((lora_run / "config.json").read_text())
  _, merged = lora.merge(build_model(ml_collections.ConfigDict(config["model"])),
                         load_state(lora_run)[1]["params"])
  merged = {lora.path_str(p): np.asarray(x)
            for p, x in jax.tree_util.tree_leaves_with_path(merged)}
  step, state = load_state(full_run)
  full = {lora.path_str(p): np.asarray(x)
          for p, x in jax.tree_util.tree_leaves_with_path(state["params"])}
  assert step == 2 and full.keys() == merged.keys()
  moved = [float(np.abs(full[k] - merged[k]).max()) for k in full]
  assert 0 < min(moved) and max(moved) < 1e-2, moved
  assert np.std(merged["wte/embedding"]) > 0.1
  full_model = json.loads((full_run / "config.json").read_text())["model"]
  assert full_model["lora_rank"] == 0 and full_model["n_kv_head"] == 2


def test_data_of_another_tokenizer_or_no_base_is_one_line_and_nothing_written(finetuned,
                                                                              hf_model,
                                                                              monkeypatch,
                                                                              capsys):
  from jaxdl.data.tokenize import load_hf_tokenizer
  """Bytes-prepared data (257 ids) into the Llama of a 64-id BPE, and into the run fine-tuned
  from it: the manifest's fingerprint is not the base's, exit 2, no workdir; into a 96-id Llama
  without a tokenizer.json: more ids than its vocabulary; a base that is not there, or one
  missing a weight shard: the same."""
  tmp, commands = finetuned
  monkeypatch.chdir(tmp)
  prepare = commands[0]
  bytes_prepare = [*prepare[:prepare.index("--tokenizer")], "--tokenizer", "bytes", "--out",
                   "bytes_chat"]
  assert cli.main(bytes_prepare) == 0
  capsys.readouterr()
  fingerprint = load_hf_tokenizer("my_model").fingerprint[:12]
  shutil.copytree(hf_model("llama_tied"), tmp / "no_tokenizer")  # 96 ids, no tokenizer.json
  shutil.copytree(tmp / "my_model", tmp / "damaged")
  (tmp / "damaged/model-00003-of-00005.safetensors").unlink()
  for base in ("my_model", "runs/finetune_lora", "no_tokenizer", "nowhere", "damaged"):
    argv = [a.replace("my_chat", "bytes_chat").replace("my_model", base) for a in commands[1]]
    assert cli.main(train([*argv, "--workdir", "runs/refused"])) == 2, base
    line = one_error_line(capsys)
    if base == "damaged":  # a shard its index names is missing: found before the run writes
      assert line == ("jaxdl: error: damaged/model.safetensors.index.json: shard "
                      "model-00003-of-00005.safetensors is missing from damaged"), line
    elif base == "nowhere":
      assert line.startswith("jaxdl: error: init_from: 'nowhere' is neither a jaxdl workdir"), line
    elif base == "no_tokenizer":  # no tokenizer.json to compare: the vocabulary sizes
      assert line.startswith("jaxdl: error: data.path: 'bytes_chat' was prepared with a "
                             "tokenizer of 257 ids, more than the vocab_size 96 of the base "
                             "'no_tokenizer'"), line
    else:
      assert line.startswith("jaxdl: error: data.path: 'bytes_chat' was prepared with the "
                             "tokenizer 'bytes' (257 ids, sha256 bytes), not the tokenizer of "
                             f"the base {base!r} (sha256 {fingerprint})"), line
    assert not (tmp / "runs/refused").exists()
  # One spelling: the experiment's old `base=` arg is refused, not ignored.
  assert cli.main(["train", "finetune_lora:smoke,base=my_model", "--workdir", "runs/refused"]) == 2
  assert "unknown arg 'base'" in one_error_line(capsys)
  assert not (tmp / "runs/refused").exists()


def test_a_bf16_frozen_base_beside_float32_adapters(finetuned, monkeypatch):
  """`--set model.param_dtype=bfloat16` (a run's own key, kept over the base's): the initial
  state holds the Hugging Face weights rounded to bf16, the adapters in float32 (A random, B 0),
  and the optimizer state only the adapters' float32 moments."""
  from jaxdl.config import load_config
  from jaxdl.train import build
  tmp, _ = finetuned
  monkeypatch.chdir(tmp)
  config, _ = load_config("finetune_lora", ["init_from=my_model", "data.path=my_chat",
                                            "model.param_dtype=bfloat16", *SHORT])
  state = build(config).init_state()
  adapters, base = lora.split(jax.device_get(state.params))
  want = lora.split(jax.device_get(hf.load_hf("my_model")[1]))[1]
  assert base.keys() == want.keys() and len(adapters) == 12
  for k in base:
    assert base[k].dtype == jax.numpy.bfloat16, k
    np.testing.assert_array_equal(base[k], want[k].astype(jax.numpy.bfloat16), err_msg=k)
  assert all(v.dtype == np.float32 for v in adapters.values())
  moments = [x for x in jax.tree.leaves(state.opt_state) if np.ndim(x) > 0]
  assert moments and all(x.dtype == np.float32 for x in moments)
  assert sum(x.size for x in moments) == 2 * sum(v.size for v in adapters.values())


def test_the_export_of_the_lora_run_round_trips_through_transformers(finetuned, monkeypatch,
                                                                     capsys):
  """`jaxdl export runs/finetune_lora` (the adapters folded in): transformers' AutoTokenizer
  loads the export with the base's eos and chat template, and encodes a text to the ids jaxdl's
  tokenizer gives, decoding back to it; `AutoModelForCausalLM.from_pretrained(out).generate`
  (greedy, 16 tokens, its own generation_config) writes the ids `jaxdl generate` draws on the
  export for the same prompt (read from the generator the command calls), and the text it
  prints. transformers' top-1 minus top-2 logit over its choices exceeds 1e-4, ten times the
  1e-5 to which the logits agree, so a difference is a bug."""
  import torch
  import transformers
  from jaxdl.data.tokenize import load_hf_tokenizer
  from jaxdl.models import decoding
  tmp, _ = finetuned
  monkeypatch.chdir(tmp)
  assert cli.main(["export", "runs/finetune_lora", "--out", "exported"]) == 0
  capsys.readouterr()
  source, tok = (transformers.AutoTokenizer.from_pretrained(d) for d in ("my_model", "exported"))
  assert tok.eos_token == source.eos_token == "</s>" and tok.bos_token == "<s>"
  assert tok.chat_template == source.chat_template == hf_reference.CHAT_TEMPLATE
  chat = [{"role": "user", "content": "add the fox"}]
  assert (tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) ==
          "<s>user add the fox</s><s>assistant ")
  ours = load_hf_tokenizer("exported")
  text = "she sells the lazy dog a tiny text"
  ids = tok.encode(text, add_special_tokens=False)
  assert ids == ours.encode(text).tolist() and len(ids) > 5
  assert tok.decode(ids) == ours.decode(ids) == text

  prompt = "the quick brown fox"
  prompt_ids = ours.encode(prompt).tolist()
  model = hf_reference.load("exported")
  assert model.generation_config.eos_token_id == 2
  with torch.no_grad():
    res = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(
        1, len(prompt_ids), dtype=torch.long), do_sample=False, max_new_tokens=16,
        return_dict_in_generate=True, output_logits=True)
  top2 = torch.topk(torch.stack(res.logits).float(), 2, dim=-1).values
  assert float((top2[..., 0] - top2[..., 1]).min()) > 1e-4
  theirs = res.sequences[0].tolist()
  drawn = []
  real_generate = decoding.generate
  monkeypatch.setattr(decoding, "generate",
                      lambda *a, **k: drawn.append(real_generate(*a, **k)) or drawn[-1])
  assert cli.main(["generate", "exported", "--prompt", prompt, "--temperature", "0",
                   "--max-new-tokens", "16"]) == 0
  (row,) = np.asarray(drawn[0]).tolist()
  assert len(row) == len(prompt_ids) + 16 and row[:len(theirs)] == theirs
  assert all(t == 2 for t in row[len(theirs):])  # after an eos: the pad id (eos's, as theirs)
  new = [t for t in theirs[len(prompt_ids):] if t != 2]
  assert capsys.readouterr().out == tok.decode(prompt_ids + new, skip_special_tokens=True) + "\n"
