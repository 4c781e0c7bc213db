"""Issue 50's path walked as a new user walks it, README and `--help` in hand: the joints that
broke, each through `jaxdl.cli.main` in this process.

The base is the chat Llama the fine-tuning tests share (`hf_reference.CHAT_LLAMA`: a 64-id BPE
tokenizer, bos '<s>' 1 / eos '</s>' 2 and a chat template in transformers' own files); the
chats are prepared with it as the README says, and the runs its `<!-- finetune:hf -->` block
starts (LoRA from the Hugging Face folder, then every parameter from that run) are saved as they
start, without training (test_finetune.py trains them).
"""

import json
import shutil

import hf_reference
import jax
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.config import load_config
from jaxdl.data import records
from jaxdl.data.tokenize import get_tokenizer
from jaxdl.models import decoding
from jaxdl.train import build, checkpoint

SHORT = ["train.plot=False", "data.batch_size=4", "data.eval_batch_size=4"]


def sets(items: list[str]) -> list[str]:
  return [a for kv in items for a in ("--set", kv)]


def save_fresh_run(experiment: str, overrides: list[str], workdir) -> None:
  """The run `jaxdl train EXP --set ...` starts, saved as training saves it (its config.json and
  a checkpoint of its step-0 state) without the cost of a train step's compile: the base read
  as `init_from` reads it, the adapters as initialized."""
  config, _ = load_config(experiment, [*overrides, *SHORT])
  run = build(config)
  state = run.init_state(None)
  workdir.mkdir(parents=True)
  (workdir / "config.json").write_text(json.dumps(run.config.to_dict()))
  saver = checkpoint.Checkpointer(workdir / "checkpoints", async_save=False)
  saver.save(1, jax.device_get(state), data_state={}, config={}, manifest={})
  saver.close()


@pytest.fixture(scope="module")
def walk(hf_model, tmp_path_factory):
  """A folder holding my_model (the chat Llama), chat.jsonl, my_chat (prepared with the model's
  tokenizer), runs/finetune_lora (LoRA from my_model) and runs/finetune_lora-full (every
  parameter, from that run), the runs as the README's commands start them."""
  root = tmp_path_factory.mktemp("walk")
  shutil.copytree(hf_model("llama", **hf_reference.CHAT_LLAMA), root / "my_model")
  chats = [{"prompt": f"the quick fox {i}", "response": f"the lazy dog {i}"} for i in range(80)]
  (root / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
  with pytest.MonkeyPatch.context() as mp:
    mp.chdir(root)
    assert cli.main(["data", "prepare", "chat.jsonl", "--tokenizer", "my_model", "--out",
                     "my_chat"]) == 0
    for exp, base, workdir in (("finetune_lora", "my_model", "runs/finetune_lora"),
                               ("finetune_lora:full", "runs/finetune_lora",
                                "runs/finetune_lora-full")):
      save_fresh_run(exp, [f"init_from={base}", "data.path=my_chat"], root / workdir)
  return root


def test_a_run_fine_tuned_from_a_run_exports_and_chats_as_its_hugging_face_base(
    walk, monkeypatch, capsys):
  """The README's third command fine-tunes the LoRA run: the Hugging Face folder is its base's
  base. Its export carries that folder's bos / eos and chat template (it had none: no bos, no
  template, so transformers' rendering lost every '<s>'), and `jaxdl generate RUN --chat` renders
  with that template (it was refused: "has no chat template"); the decoder is replaced by one
  that records the prompt it was given."""
  monkeypatch.chdir(walk)
  assert cli.main(["export", "runs/finetune_lora-full", "--out", "exported"]) == 0
  config = json.loads((walk / "exported/tokenizer_config.json").read_text())
  generation = json.loads((walk / "exported/generation_config.json").read_text())
  assert config["chat_template"] == hf_reference.CHAT_TEMPLATE
  assert (config["bos_token"], config["eos_token"]) == ("<s>", "</s>")
  assert (generation["bos_token_id"], generation["eos_token_id"]) == (1, 2)
  seen = {}

  def fake_generate(model, params, prompt_BxP, key, n, **kw):
    seen.update(prompt=np.asarray(prompt_BxP), eos=kw["eos_ids"])
    return np.concatenate([prompt_BxP, np.full((len(prompt_BxP), n), 2)], axis=1)

  monkeypatch.setattr(decoding, "generate", fake_generate)
  capsys.readouterr()
  assert cli.main(["generate", "runs/finetune_lora-full", "--chat", "--prompt", "the quick",
                   "--temperature", "0", "--max-new-tokens", "2"]) == 0
  # transformers' rendering with the base's own files (not jaxdl's encode_prompt, under test).
  want = hf_reference.tokenizer("my_model").apply_chat_template(
      [{"role": "user", "content": "the quick"}], add_generation_prompt=True,
      tokenize=True)["input_ids"]
  assert seen["prompt"].tolist() == [list(want)] and 2 in seen["eos"]


def test_eval_of_chat_data_scores_the_responses_as_transformers_does(walk, monkeypatch, capsys):
  """`jaxdl eval DIR --data my_chat` on the README's chat data (a loss mask) was a KeyError
  traceback. It scores each record alone (as fine-tuning packs it: e, the record, the e that
  closes it) on its response tokens and that closing e: the same sum from transformers' logits,
  to 1e-5 relative; the bits per byte over the responses' bytes."""
  import torch
  monkeypatch.chdir(walk)
  capsys.readouterr()
  assert cli.main(["eval", "my_model", "--data", "my_chat"]) == 0
  got = dict(line.split() for line in capsys.readouterr().out.splitlines())
  manifest = records.read_manifest("my_chat")
  split = manifest["splits"]["val"]
  reader = records.RecordReader("my_chat", split, manifest["fields"])
  model, tok = hf_reference.load("my_model"), get_tokenizer("my_model")
  nll, scored, n_bytes = 0.0, 0, 0
  for r in reader.get(range(len(reader))):
    ids, mask = r["tokens_mask"][:, 0].astype(np.int64), r["tokens_mask"][:, 1]
    z = np.concatenate([[2], ids, [2]])
    w = np.concatenate([mask, [1]])
    with torch.no_grad():
      logp = torch.log_softmax(model(torch.as_tensor(z[None, :-1])).logits.double(), -1)[0]
    nll += float((-logp[np.arange(len(z) - 1), z[1:]].numpy() * w).sum())
    scored += int(w.sum())
    n_bytes += int((tok.token_bytes()[ids] * mask).sum())
  assert int(got["tokens"]) == scored == split["response_tokens"] + split["count"]
  np.testing.assert_allclose(float(got["loss"]), nll / scored, rtol=1e-5)
  np.testing.assert_allclose(float(got["bits_per_byte"]), nll / np.log(2) / n_bytes, rtol=1e-5)


def test_a_data_path_with_no_prepared_data_is_named_in_one_line(walk, monkeypatch, capsys):
  """A typo in `data.path` was refused as "the 'stdlib_instructions' source reads with the
  tokenizer 'bytes'", naming neither the path nor its problem; now the line says the folder
  holds no prepared data, exit 2, and nothing is written."""
  monkeypatch.chdir(walk)
  before = sorted(p.name for p in walk.iterdir()), sorted(p.name for p in (walk / "runs").iterdir())
  capsys.readouterr()
  assert cli.main(["train", "finetune_lora", *sets(["init_from=my_model",
                                                    "data.path=my_chta"])]) == 2
  (line,) = capsys.readouterr().err.strip().splitlines()
  assert line.startswith("jaxdl: error: data.path: 'my_chta' holds no prepared data"), line
  assert "--tokenizer my_model" in line
  assert (sorted(p.name for p in walk.iterdir()),
          sorted(p.name for p in (walk / "runs").iterdir())) == before


def test_data_prepare_help_says_the_tokenizer_can_be_a_model_directory(capsys):
  """The README prepares chats with `--tokenizer my_model` (a folder); `--help` listed only
  bytes, bpe and a tokenizer.json path."""
  with pytest.raises(SystemExit):
    cli.main(["data", "prepare", "--help"])
  assert "model directory" in " ".join(capsys.readouterr().out.split())


def test_a_chat_record_is_one_segment_though_its_template_writes_the_end_of_text(walk,
                                                                                 monkeypatch):
  """The chat Llama's template closes every turn with '</s>', the tokenizer's end of text e:
  packing opened a segment at each, so a response was trained without its prompt in view. A
  segment now opens only where a record starts (e before it): in the first eval window the
  segment ids step exactly at the records' starts (from val.lengths.npy), though the window
  holds more e than that, and positions restart there only."""
  monkeypatch.chdir(walk)
  config, _ = load_config("finetune_lora", ["init_from=my_model", "data.path=my_chat", *SHORT])
  run = build(config)
  batch = next(iter(run.ds.eval_batches()))
  x_T, seg_T, pos_T = (np.asarray(batch[k])[0] for k in ("x", "segment_ids", "positions"))
  t = len(x_T)
  starts = np.concatenate([[0], np.cumsum(np.load(walk / "my_chat/val.lengths.npy") + 1)])
  opens_T = np.isin(np.arange(t), starts)
  assert opens_T.sum() >= 2 and (x_T == 2).sum() > opens_T.sum()
  np.testing.assert_array_equal(seg_T, np.cumsum(opens_T))
  np.testing.assert_array_equal(pos_T, np.arange(t) - np.maximum.accumulate(
      np.where(opens_T, np.arange(t), 0)))
