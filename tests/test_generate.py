"""`jaxdl generate DIR --prompt TEXT` (jaxdl.cli.generate): text continuation of a Hugging Face
model directory and of a jaxdl 'lm' run; bad inputs are one line, exit 2, refused before the
weights are read (top-k against the model's vocabulary).

The Hugging Face directory is a tiny random Llama that transformers saves inside the test, with
a BPE tokenizer.json beside it (`hf_reference.TOKENIZED_LLAMA`; its greedy continuations are
checked against transformers' in test_hf.py and test_hf_roundtrip.py); the 'lm' run an untrained
char_gpt:smoke checkpoint (bytes), saved here.
"""

import hf_reference
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.cli import generate
from jaxdl.data import chat_template
from jaxdl.data.tokenize import bytes_tokenizer, load_hf_tokenizer
from jaxdl.models import decoding, hf
from jaxdl.train import load_run



@pytest.fixture(scope="module")
def llama_dir(hf_model):
  return hf_model("llama", **hf_reference.TOKENIZED_LLAMA)  # vocab_size 96


def test_an_lm_run_continues_a_batch_of_prompts_greedily(tmp_path, untrained_run, capsys):
  """Two prompts of different lengths, twice each, in one left-padded batch: each row is the
  library's greedy continuation of its prompt decoded alone (no padding), as bytes."""
  run = untrained_run(tmp_path / "lm", "char_gpt:smoke", jnp.zeros((1, 4), jnp.int32))
  _, model, variables, _ = load_run(run)
  assert cli.main(["generate", str(run), "--prompt", "To be", "--prompt", "or not to",
                   "--temperature", "0", "--max-new-tokens", "5", "--num", "2"]) == 0
  rows = []
  for text in ("To be", "or not to"):
    ids = np.frombuffer(text.encode(), np.uint8).astype(np.int32)[None]
    want = np.asarray(decoding.generate(model, variables["params"], ids, jax.random.key(0), 5,
                                       temperature=0))[0]
    assert len(want) == len(text) + 5
    rows += [bytes_tokenizer().decode(want)] * 2
  assert capsys.readouterr().out.splitlines() == rows


def test_left_pad_and_the_chat_prompt_ids(llama_dir):
  prompt_BxP, start_B = decoding.left_pad([[5, 6, 7], [8]], pad_id=2)
  assert prompt_BxP.tolist() == [[5, 6, 7], [2, 2, 8]] and start_B.tolist() == [0, 2]
  tok = load_hf_tokenizer(llama_dir)
  template = chat_template.ChatTemplate("t", "t", "{% for m in messages %}<s>{{ m.content }}</s>"
                                        "{% endfor %}{% if add_generation_prompt %}<s>{% endif %}")
  # The template's '<s>' / '</s>' are their ids (1, 2); the message's text is text.
  ids = chat_template.encode_prompt(template, "the fox", tok)
  assert ids.tolist() == [1, *tok.encode("the fox").tolist(), 2, 1]
  # The whole rendering is tokenized at once, so '</s>' typed in the message would be read as the
  # turn's end: refused, naming the prompt and the token.
  with pytest.raises(ValueError, match="^--prompt: message 0 holds '</s>', a special token"):
    chat_template.encode_prompt(template, "the fox </s>", tok)
  # The turn ends with '</s>', a special token: generation stops there too; a plain-text end
  # of turn is no stop id.
  assert chat_template.end_of_turn_id(template, tok) == 2
  plain = chat_template.ChatTemplate("p", "p", "{% for m in messages %}{{ m.content }}\n"
                                     "{% endfor %}")
  assert chat_template.end_of_turn_id(plain, tok) is None


@pytest.fixture
def refuse_after_config(monkeypatch):
  """Fails the test if the weights are read: each bad input must be refused before."""
  def load_hf(*a, **kw):
    raise AssertionError("the weights were read before the bad input was refused")
  monkeypatch.setattr(hf, "load_hf", load_hf)


@pytest.mark.parametrize("argv,message", [
    (["--top-k", "100000"], "--top-k: must be in 1..96 (the model's vocabulary) or 0 (all "
                            "tokens), got 100000"),
    (["--top-k", "-1"], "--top-k: must be in 1..96"),
    (["--temperature", "inf"], "--temperature: must be a finite number >= 0 (0: greedy), got inf"),
    (["--temperature", "-0.5"], "--temperature: must be a finite number >= 0"),
    (["--top-p", "0"], "--top-p: must be in (0, 1], got 0.0"),
    (["--top-p", "nan"], "--top-p: must be in (0, 1], got nan"),
    (["--num", "0"], "--num: must be >= 1, got 0"),
    (["--max-new-tokens", "0"], "--max-new-tokens: must be >= 1, got 0"),
    (["--max-new-tokens", "100000"], "exceed the model's context"),
    (["--prompt", "the quick brown fox " * 20], "tokens fill the model's context of 64"),
    (["--chat"], "--chat: {dir} has no chat template"),
])
def test_a_bad_generate_input_is_one_line_exit_2(argv, message, llama_dir, refuse_after_config,
                                                 capsys):
  assert cli.main(["generate", llama_dir, "--prompt", "the quick", *argv]) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  message = message.format(dir=llama_dir)
  assert len(lines) == 1 and lines[0].startswith("jaxdl: error: ") and message in lines[0], lines


def test_generate_refuses_what_is_not_a_language_model(tmp_path, capsys):
  (tmp_path / "config.json").write_text('{"task": "flow_matching"}')
  for directory, message in ((tmp_path, "a 'flow_matching' run continues no text"),
                             (tmp_path / "none", "no config.json")):
    assert cli.main(["generate", str(directory), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
  assert generate.HELP  # listed by `jaxdl --help`


def test_chat_prompt_ids_and_greedy_reply_are_transformers(hf_model, monkeypatch, capsys):
  """`jaxdl generate DIR --chat` on `hf_reference.CHAT_LLAMA` (a Metaspace BPE, its template in
  transformers' files): the prompt ids are transformers' `apply_chat_template([user],
  add_generation_prompt=True, tokenize=True)` and the greedy tokens its `generate`'s on them
  (stopping at '</s>', the eos and the end of turn). A prompt holding '</s>' is one line, exit 2."""
  llama = hf_model("llama", **hf_reference.CHAT_LLAMA)
  seen = {}
  real = decoding.generate

  def recording_generate(model, params, prompt_BxP, *a, **kw):
    seen["prompt"] = np.asarray(prompt_BxP)
    seen["out"] = np.asarray(real(model, params, prompt_BxP, *a, **kw))
    return seen["out"]

  monkeypatch.setattr(decoding, "generate", recording_generate)
  assert cli.main(["generate", llama, "--chat", "--prompt", "the quick fox", "--temperature", "0",
                   "--max-new-tokens", "8"]) == 0
  ref_tok = hf_reference.tokenizer(llama)
  want = ref_tok.apply_chat_template([{"role": "user", "content": "the quick fox"}],
                                     add_generation_prompt=True, tokenize=True)["input_ids"]
  assert seen["prompt"].tolist() == [list(want)]
  ref, p = hf_reference.load(llama), len(want)
  greedy, margin = hf_reference.greedy(ref, seen["prompt"], 8, eos=2, pad=2)
  assert margin > 1e-3  # decided well above the port's 1e-5
  new, ref_new = seen["out"][0, p:].tolist(), greedy[0, p:].tolist()
  n = ref_new.index(2) + 1 if 2 in ref_new else len(ref_new)
  assert new[:n] == ref_new[:n]
  assert capsys.readouterr().out == ref_tok.decode(ref_new[:n], skip_special_tokens=True) + "\n"
  assert cli.main(["generate", llama, "--chat", "--prompt", "the </s> fox"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "--prompt: prompt 1: message 0 holds '</s>'" in err[0], err
