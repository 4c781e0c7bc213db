"""The fine-tuning path's joints (issue 50): a base read straight into the run's parameter
shardings, architecture keys beside `init_from` refused, and every bad input of the issue's
acceptance one line, exit 2, nothing written, through the CLI in this process.

The base is a tiny Llama transformers saved (`conftest.hf_model`, with `hf_reference`'s 64-id
BPE tokenizer.json: 4 heads over 2 key/value heads, 2 layers, 32 wide, 96 ids, 64 positions);
the devices are conftest's four emulated CPUs.
"""

import dataclasses
import json
import shutil

import jax
import numpy as np
import pytest

import hf_reference
from jaxdl import cli
from jaxdl.config import load_config
from jaxdl.data import chat_template
from jaxdl.data.tokenize import get_tokenizer
from jaxdl.models import decoding, hf, hf_tensors, lora
from jaxdl.schema import ConfigError
from jaxdl.train import build, checkpoint, init_from

SHORT = ["train.steps=2", "train.plot=False", "data.batch_size=8", "data.eval_batch_size=8",
         "data.max_eval_windows=8"]


# The base's chat template (tokenizer_config.json): its turns framed by the tokenizer's special
# '<s>' and '</s>'.
TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant: {% endif %}")


@pytest.fixture(scope="module")
def base(hf_model, tmp_path_factory):
  """(root, the Llama's folder with a chat template, its chat data prepared with its tokenizer
  and template, the same chats prepared as bytes)."""
  root = tmp_path_factory.mktemp("joints")
  llama = root / "llama"
  shutil.copytree(hf_model("llama", **hf_reference.TOKENIZED_LLAMA), llama)  # shared, so copied
  (llama / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
  records = [{"prompt": f"the quick fox {i}", "response": f"the lazy dog {i}"} for i in range(40)]
  (root / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  for out, tok in (("chat", str(llama)), ("bytes_chat", "bytes")):
    assert cli.main(["data", "prepare", str(root / "chat.jsonl"), "--tokenizer", tok,
                     "--out", str(root / out)]) == 0
  return root, str(llama), str(root / "chat"), str(root / "bytes_chat")


def flat(tree) -> dict:
  return {lora.path_str(p): x for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def init_sharded(overrides: list[str], experiment: str = "finetune_lora"):
  """(the run, its initial state placed as the loop places it: the strategy's shardings, those
  shardings by path)."""
  config, _ = load_config(experiment, [*overrides, *SHORT])
  run = build(config)
  shardings = run.strategy.state_shardings(run.abstract_state())
  return run, run.init_state(shardings), flat(shardings.params)


@pytest.mark.parametrize("parallel", [["parallel.strategy=fsdp", "parallel.devices=4"],
                                      ["parallel.tensor=2", "parallel.devices=4"]],
                         ids=["fsdp", "tensor2"])
def test_a_hugging_face_base_is_read_into_the_runs_shardings(base, parallel, monkeypatch):
  """Every parameter of the Llama goes to the device straight into the sharding the run's mesh
  gives it (none to a default device first), and the run starts from the plain import's values
  bit for bit, with some leaves split over the fsdp (tensor) axis."""
  _, llama, chat, _ = base
  placed = []
  spy = hf_tensors._sharding_of
  monkeypatch.setattr(hf_tensors, "_sharding_of",
                      lambda s, key: placed.append(spy(s, key)) or placed[-1])
  run, state, want = init_sharded([f"init_from={llama}", f"data.path={chat}", *parallel])
  params = flat(state.params)
  plain = flat(jax.device_get(hf.load_hf(llama)[1]))
  assert placed and all(isinstance(s, jax.sharding.NamedSharding) and s.mesh == run.strategy.mesh
                        for s in placed[:len(plain)])
  assert sorted(k for k in params if not lora.is_adapter(k)) == sorted(plain)
  for k, x in params.items():
    assert x.sharding == want[k], k
    if k in plain:
      np.testing.assert_array_equal(np.asarray(x), plain[k], err_msg=k)
  axis, size = ("fsdp", 4) if "fsdp" in parallel[0] else ("tensor", 2)
  assert run.strategy.axis_sizes[axis] == size
  assert sum(axis in x.sharding.spec for x in params.values()) >= 5


@pytest.fixture(scope="module")
def lora_run(base, tmp_path_factory):
  """(a jaxdl LoRA run fine-tuned from the Llama as training leaves it: config.json and a
  checkpoint of its state, optimizer state included, adapters B set nonzero; the run's model,
  its params)."""
  _, llama, chat, _ = base
  run, state, _ = init_sharded([f"init_from={llama}", f"data.path={chat}"])
  params = jax.tree_util.tree_map_with_path(
      lambda p, x: x + 0.05 if lora.path_str(p).endswith("/b") else x, state.params)
  workdir = tmp_path_factory.mktemp("runs") / "lora_run"
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps(run.config.to_dict()))
  saver = checkpoint.Checkpointer(workdir / "checkpoints", async_save=False)
  saver.save(2, jax.device_get(dataclasses.replace(state, params=params)), data_state={},
             config={}, manifest={})
  saver.close()
  return str(workdir), run.model, jax.device_get(params)


def test_a_lora_run_base_is_restored_into_the_shardings_its_adapters_folded_in(base, lora_run):
  """The LoRA run as the base of a full fine-tune under fsdp: its params alone come back through
  orbax, each into the new run's sharding, with W + (alpha / r) A B folded in (to float32
  rounding of the same sum)."""
  _, _, chat, _ = base
  workdir, model, params = lora_run
  _, merged = lora.merge(model, jax.tree.map(jax.numpy.asarray, params))
  run, full, want = init_sharded([f"init_from={workdir}", f"data.path={chat}",
                                  "parallel.strategy=fsdp", "parallel.devices=4"],
                                 "finetune_lora:full")
  got = flat(full.params)
  assert run.model.lora_rank == 0 and got.keys() == flat(merged).keys()
  for k, x in got.items():
    assert x.sharding == want[k], k
    np.testing.assert_allclose(np.asarray(x), np.asarray(flat(merged)[k]), rtol=1e-6,
                               atol=1e-7, err_msg=k)
  assert sum(not x.is_fully_replicated for x in got.values()) >= 5


def test_generate_chat_on_a_run_speaks_its_bases_template(base, lora_run, monkeypatch, capsys):
  """The run's data folder holds no template, its Hugging Face base does: `jaxdl generate RUN
  --chat` renders each prompt with the base's (the one the data was rendered with), and stops at
  its end of turn '</s>' (the decoder is replaced by one that records what it was given)."""
  _, llama, _, _ = base
  seen = {}

  def fake_generate(model, params, prompt_BxP, key, n, **kw):
    seen.update(prompt=np.asarray(prompt_BxP), eos=kw["eos_ids"])
    return np.concatenate([prompt_BxP, np.full((len(prompt_BxP), n), 2)], axis=1)

  monkeypatch.setattr(decoding, "generate", fake_generate)
  assert cli.main(["generate", lora_run[0], "--chat", "--prompt", "the quick", "--temperature",
                   "0", "--max-new-tokens", "3"]) == 0
  tok = get_tokenizer(llama)
  want = chat_template.encode_prompt(chat_template.resolve("auto", llama, llama), "the quick", tok)
  assert seen["prompt"].tolist() == [want.tolist()] and tok.hf.token_to_id("</s>") in seen["eos"]
  assert capsys.readouterr().out == "\n"  # the reply: nothing before the end of turn


def test_the_runs_own_model_keys_are_declared_and_the_architectures_are_not():
  """`run_fields` comes from the settings' declarations (`setting(..., run_choice=True)`)."""
  own = set(init_from.run_fields("gpt"))
  assert {"lora_rank", "lora_alpha", "lora_targets", "dropout", "attn_dropout", "drop_path",
          "remat", "scan_unroll", "attn_impl", "dtype", "param_dtype"} <= own
  assert not own & {"n_layer", "d_model", "n_head", "n_kv_head", "vocab_size", "block_size",
                    "rope_theta", "rope_scaling", "head_dim", "sliding_window", "mlp_hidden",
                    "tie_embeddings", "norm", "epsilon", "scan_layers"}


def test_an_architecture_key_beside_init_from_is_refused_the_runs_own_keys_are_not(base):
  """An architecture key equal to the base's passes (it changes nothing); LoRA, dropout and
  dtype keys are the run's; any other is refused (the call `jaxdl train` makes)."""
  _, llama, chat, _ = base
  allowed = ["model.lora_rank=4", "model.lora_alpha=8.0", "model.dropout=0.1",
             "model.param_dtype=bfloat16", "model.n_layer=2", "model.rope_theta=500000.0"]
  config, _ = load_config("finetune_lora", [f"init_from={llama}", f"data.path={chat}", *allowed])
  init_from.check_overrides(config, allowed)


def _case(name):
  """(argv of a bad input, what its one line must hold) for the module's `base` paths."""
  def argv(root, llama, chat, bytes_chat):
    bad, text = str(root / "quantized"), str(root / "held_out.txt")
    train = ["train", "finetune_lora", "--no-progress", "--workdir", str(root / "refused"),
             "--set", f"init_from={llama}", "--set", f"data.path={chat}"]
    quantized = ("quantization_config=[\"bits\", \"quant_method\"] cannot be imported; expected "
                 "none (unquantized weights)")
    gen = ["generate", llama, "--prompt", "the quick"]
    return {
        "import_eval": (["eval", bad, "--text", text], quantized),
        "import_generate": (["generate", bad, "--prompt", "the"], quantized),
        "import_finetune": ([*train, "--set", f"init_from={bad}"], quantized),
        "finetune_tokenizer": ([*train, "--set", f"data.path={bytes_chat}"],
                               f"data.path: {bytes_chat!r} was prepared with the tokenizer "
                               "'bytes' (257 ids, sha256 bytes), not the tokenizer of the base"),
        "eval_tokenizer": (["eval", llama, "--data", bytes_chat],
                           "was tokenized with another tokenizer (sha256 bytes) than the "
                           f"model's ({get_tokenizer(llama).fingerprint[:12]}): 'bytes' of 257 "
                           "ids, not the model's 64; "
                           f"prepare it with the model's (`jaxdl data prepare SRC --tokenizer "
                           f"{llama} --out DIR`)"),
        "finetune_n_layer": ([*train, "--set", "model.n_layer=3"],
                             "model.n_layer: 3 is set, but the run takes its architecture "
                             f"from the base {llama!r} (init_from), whose n_layer is 2; leave "
                             "model.n_layer unset (a fine-tuning run sets only its own model "
                             "keys: dropout,"),
        "finetune_rope_theta": ([*train, "--set", "model.rope_theta=10000"],
                                "model.rope_theta: 10000.0 is set, but the run takes its "),
        "doctor_n_layer": (["doctor", "finetune_lora", "--workdir", str(root / "refused"),
                            "--set", f"init_from={llama}", "--set", f"data.path={chat}",
                            "--set", "model.n_layer=3"],
                           "model.n_layer: 3 is set, but the run takes its architecture "),
        "long_prompt": ([*gen, "--prompt", "the quick brown fox " * 20],
                        "--prompt: 201 tokens fill the model's context of 64"),
        "no_assistant": (["data", "prepare", str(root / "no_assistant.jsonl"), "--out",
                          str(root / "refused")],
                         "SRC: no_assistant.jsonl line 2: the last message must be the "
                         "assistant's"),
        "top_p_above_1": ([*gen, "--top-p", "1.5"], "--top-p: must be in (0, 1], got 1.5"),
        "top_p_0": ([*gen, "--top-p", "0"], "--top-p: must be in (0, 1], got 0.0"),
        "temperature": ([*gen, "--temperature", "-1"],
                        "--temperature: must be a finite number >= 0 (0: greedy), got -1.0"),
        "top_k": ([*gen, "--top-k", "-1"], "--top-k: must be in 1..96"),
    }[name]
  return argv


CASES = ["import_eval", "import_generate", "import_finetune", "finetune_tokenizer",
         "eval_tokenizer", "finetune_n_layer", "finetune_rope_theta", "doctor_n_layer",
         "long_prompt",
         "no_assistant", "top_p_above_1", "top_p_0", "temperature", "top_k"]


@pytest.fixture(scope="module")
def bad_inputs(base):
  """The files the bad inputs name: a Llama whose config.json asks for quantized weights, a text
  to score, a chat file whose second record has no assistant turn."""
  root, llama, _, _ = base
  shutil.copytree(llama, root / "quantized")
  cfg = json.loads((root / "quantized/config.json").read_text())
  cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4}
  (root / "quantized/config.json").write_text(json.dumps(cfg))
  (root / "held_out.txt").write_text("the quick brown fox jumps over the lazy dog\n")
  (root / "no_assistant.jsonl").write_text(
      '{"prompt": "p", "response": "r"}\n'
      '{"messages": [{"role": "user", "content": "hello"}]}\n')
  return base


@pytest.mark.parametrize("name", CASES)
def test_each_bad_input_is_one_line_exit_2_and_nothing_written(name, bad_inputs, capsys):
  root = bad_inputs[0]
  argv, message = _case(name)(*bad_inputs)
  before = sorted(p for p in root.rglob("*"))
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("jaxdl: error: ") and message in err[0], err
  assert sorted(p for p in root.rglob("*")) == before


def test_the_python_import_refuses_an_unsupported_field_in_one_line(bad_inputs):
  """`hf.load_hf` (the import the commands above share) raises the same one-line ConfigError
  before any weight is read."""
  with pytest.raises(ConfigError) as refused:
    hf.load_hf(str(bad_inputs[0] / "quantized"))
  assert "quantization_config=" in str(refused.value) and "\n" not in str(refused.value)
