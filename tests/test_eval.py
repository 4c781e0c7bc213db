"""`jaxdl eval` (jaxdl.cli.eval, jaxdl.train.scoring): perplexity and bits per byte of text in
strided windows, and multiple-choice accuracy, against transformers.

The model is a tiny random llama that transformers saves inside the test, with its BPE
tokenizer (`hf_reference.TOKENIZED_LLAMA`); what jaxdl must report is computed here with
transformers (`expected`): a 260-token text's summed NLL under the striding rule at strides 32
and 64 of its 64-token context (`hf_reference.strided_nll`), and 20 multiple-choice items with
each choice's log-likelihood, acc and acc_norm as lm-evaluation-harness scores them
(`hf_reference.score_choices`). Bad inputs are one line naming FILE:LINE, exit 2, refused
before the weights are read.
"""

import json
import math
import os

import hf_reference
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.data.tokenize import load_hf_tokenizer
from jaxdl.models import hf
from jaxdl.train import load_run, scoring

WORDS = ("the quick brown fox jumps over the lazy dog a tiny model reads the text she sells "
         "sea shells by the sea shore").split()
STRIDES = (32, 64)


@pytest.fixture(scope="module")
def llama_dir(hf_model):
  return hf_model("llama", **hf_reference.TOKENIZED_LLAMA)


@pytest.fixture(scope="module")
def expected(llama_dir):
  """What transformers computes on the llama: a 120-word text's ids (its tokenizer), summed NLL
  and perplexity at each stride (after the '</s>' prefix, as `jaxdl eval` scores it), and 20
  random multiple-choice items with their log-likelihoods, acc and acc_norm."""
  model, tok = hf_reference.load(llama_dir), hf_reference.tokenizer(llama_dir)
  rng = np.random.default_rng(0)
  text = " ".join(rng.choice(WORDS, 120)) + ".\n"
  ids = tok.encode(text, add_special_tokens=False)
  eot = tok.convert_tokens_to_ids("</s>")
  context = model.config.max_position_embeddings
  items = []
  for _ in range(20):
    n_choices = int(rng.integers(2, 5))
    items.append({"context": " ".join(rng.choice(WORDS, int(rng.integers(3, 9)))) + " ",
                  "choices": [" ".join(rng.choice(WORDS, int(rng.integers(1, 4))))
                              for _ in range(n_choices)],
                  "answer": int(rng.integers(0, n_choices))})
  strided = {}
  for stride in STRIDES:
    nll, n = hf_reference.strided_nll(model, [eot] + ids, context, stride)
    strided[str(stride)] = {"nll": nll, "tokens": n, "perplexity": math.exp(nll / n),
                            "bits_per_byte": nll / math.log(2) / len(text.encode("utf-8"))}
  return {"text": text, "text_ids": ids, "eot_id": eot, "strided": strided, "items": items,
          **hf_reference.score_choices(model, tok, items)}


@pytest.fixture(scope="module")
def llama(llama_dir):
  """(model, tokenizer, scorer) of the llama: one compiled program (8 rows of 64 tokens)."""
  model, params = hf.load_hf(llama_dir)
  return model, load_hf_tokenizer(llama_dir), scoring.make_scorer(model, {"params": params})


def _printed(out: str) -> dict:
  return {k: float(v) for k, v in (line.split() for line in out.strip().splitlines())}


@pytest.mark.parametrize("stride", [32, 64])
def test_text_perplexity_equals_transformers(stride, llama_dir, expected, llama, tmp_path, capsys):
  model, tok, score = llama
  want = expected["strided"][str(stride)]
  assert tok.encode(expected["text"]).tolist() == expected["text_ids"]
  if stride == 32:  # the command, end to end (its own load and compile)
    path = tmp_path / "text.txt"
    path.write_text(expected["text"], encoding="utf-8")
    assert cli.main(["eval", llama_dir, "--text", str(path), "--stride", "32"]) == 0
    got = _printed(capsys.readouterr().out)
  else:
    stream, prefixed = scoring.text_stream(tok, tok.encode(expected["text"]), model.vocab_size)
    assert prefixed and stream[0] == expected["eot_id"]
    nll, n = scoring.score_stream(score, stream, model.block_size, stride)
    got = scoring.text_metrics(nll, n, len(expected["text"].encode("utf-8")))
  assert got["tokens"] == want["tokens"] == 260
  # fp32 logits against transformers' (float64 log-softmax of fp32 logits there): 1e-5 relative.
  np.testing.assert_allclose(got["perplexity"], want["perplexity"], rtol=1e-5)
  np.testing.assert_allclose(got["bits_per_byte"], want["bits_per_byte"], rtol=1e-5)


def test_multiple_choice_accuracy_equals_transformers(expected, llama):
  model, tok, score = llama
  got = scoring.score_choices(score, tok, expected["items"], model.block_size)
  assert got["items"] == 20
  for ll, want in zip(got["loglikelihoods"], expected["loglikelihoods"]):
    np.testing.assert_allclose(ll, want, rtol=1e-5, atol=1e-4)
  assert (got["acc"], got["acc_norm"]) == (expected["acc"], expected["acc_norm"]) == (0.5, 0.3)


def test_the_choices_command_prints_accuracy(llama_dir, expected, tmp_path, capsys):
  path = tmp_path / "items.jsonl"
  path.write_text("".join(json.dumps(i) + "\n" for i in expected["items"]), encoding="utf-8")
  assert cli.main(["eval", llama_dir, "--choices", str(path)]) == 0
  assert _printed(capsys.readouterr().out) == {"items": 20, "acc": expected["acc"],
                                               "acc_norm": expected["acc_norm"]}


@pytest.mark.parametrize("n,context,stride", [(261, 64, 32), (261, 64, 64), (65, 64, 1),
                                              (10, 64, 32), (100, 7, 3)])
def test_windows_score_every_target_once_with_at_least_context_minus_stride_before(
    n, context, stride):
  seen = []
  for start, end, scored in scoring.windows(n, context, stride):
    assert end - start <= context + 1
    targets = list(range(end - scored, end))
    seen += targets
    if start > 0:  # past the first window: at least L - S tokens of context
      assert min(targets) - start >= context - stride
  assert seen == list(range(1, n))


def test_an_lm_run_scores_bytes_as_one_forward_pass_does(tmp_path, untrained_run, capsys):
  """A 256-token byte model has no end-of-text row: the first byte is context only. Short text
  (one window): the loss equals a numpy log-softmax of one plain forward pass."""
  run = untrained_run(tmp_path / "lm", "char_gpt:smoke", np.zeros((1, 4), np.int32))
  _, model, variables, _ = load_run(run)
  text = "To be, or not to be: that is the question."
  (tmp_path / "t.txt").write_text(text, encoding="utf-8")
  assert cli.main(["eval", str(run), "--text", str(tmp_path / "t.txt")]) == 0
  got = _printed(capsys.readouterr().out)
  ids = np.frombuffer(text.encode(), np.uint8).astype(np.int32)
  logits = np.asarray(model.apply(variables, ids[None, :-1], train=False), np.float64)[0]
  m = logits.max(-1, keepdims=True)
  logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
  nll = -logp[np.arange(len(ids) - 1), ids[1:]].sum()
  assert got["tokens"] == len(text) - 1
  np.testing.assert_allclose(got["loss"], nll / (len(text) - 1), rtol=1e-5)
  np.testing.assert_allclose(got["bits_per_byte"], nll / math.log(2) / (len(text) - 1),
                             rtol=1e-5)


def _prepare(tmp_path, tokenizer: str) -> str:
  """Ten short documents prepared with `tokenizer`; doc5.txt alone is the val split (the
  split is a hash of the file name, `jaxdl.data.prepare.in_val`)."""
  src = tmp_path / "src"
  src.mkdir(exist_ok=True)
  words = "the quick brown fox jumps over the lazy dog she sells sea shells".split()
  for i in range(10):
    (src / f"doc{i}.txt").write_text(" ".join(words[i:] + words[:i]) + "\n", encoding="utf-8")
  out = str(tmp_path / f"data_{os.path.basename(tokenizer)}")
  assert cli.main(["data", "prepare", str(src), "--out", out, "--tokenizer", tokenizer]) == 0
  return out


def test_prepared_data_scores_its_val_split_as_the_text_of_it(llama_dir, tmp_path, capsys):
  """One val document: its stream is the text's ([end of text] + tokens), so --data and --text
  agree, bits per byte over the manifest's bytes of the split."""
  data = _prepare(tmp_path, llama_dir)
  capsys.readouterr()
  assert cli.main(["eval", llama_dir, "--data", data]) == 0
  from_data = _printed(capsys.readouterr().out)
  assert cli.main(["eval", llama_dir, "--text", str(tmp_path / "src" / "doc5.txt")]) == 0
  assert _printed(capsys.readouterr().out) == from_data
  bytes_data = _prepare(tmp_path, "bytes")
  capsys.readouterr()
  assert cli.main(["eval", llama_dir, "--data", bytes_data]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith(f"jaxdl: error: --data: {bytes_data} was tokenized with another "
                        "tokenizer (sha256 bytes) than the model's") and "\n" not in err


@pytest.fixture
def refuse_before_weights(monkeypatch):
  def load_hf(*a, **kw):
    raise AssertionError("the weights were read before the bad input was refused")
  monkeypatch.setattr(hf, "load_hf", load_hf)


ITEM = {"context": "the quick", "choices": [" fox", " dog"], "answer": 0}


@pytest.mark.parametrize("lines,flag,message", [
    (None, "--text", "--text: {path}: no such file"),
    ("", "--text", "--text: {path}: empty (no text to score)"),
    (None, "--choices", "--choices: {path}: no such file"),
    ([ITEM, {**ITEM, "answer": 2}], "--choices",
     "--choices: {path}:2: 'answer' must be an index 0..1 into its 2 choices, got 2"),
    ([ITEM, "", {**ITEM, "answer": None}], "--choices", "--choices: {path}:3: 'answer' must be"),
    ([{"context": "x", "choices": ["a"], "answer": 0}], "--choices",
     "--choices: {path}:1: 'choices' must be a list of at least 2 non-empty strings"),
    (["{not json"], "--choices", "--choices: {path}:1: not JSON"),
])
def test_bad_eval_input_is_one_line_naming_the_file_exit_2(
    lines, flag, message, llama_dir, tmp_path, refuse_before_weights, capsys):
  path = tmp_path / "input"
  if lines is not None:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
                    if lines else "", encoding="utf-8")
  assert cli.main(["eval", llama_dir, flag, str(path)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("jaxdl: error: " + message.format(path=path)), err


def test_a_stride_past_the_context_is_refused(llama_dir, tmp_path, refuse_before_weights, capsys):
  (tmp_path / "t.txt").write_text("the quick brown fox", encoding="utf-8")
  assert cli.main(["eval", llama_dir, "--text", str(tmp_path / "t.txt"), "--stride", "65"]) == 2
  assert capsys.readouterr().err.strip() == ("jaxdl: error: --stride: must be in 1..64 (the "
                                             "model's context), got 65")

