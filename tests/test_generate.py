"""`jaxdl generate DIR --prompt TEXT` (jaxdl.cli.generate): text continuation of a Hugging Face
model directory and of a jaxdl 'lm' run; bad inputs are one line, exit 2, refused before the
weights are read (top-k against the model's vocabulary).

The Hugging Face directory is tests/data/hf/llama, a tiny random Llama that `transformers` saved
(with the tokenizer.json beside it; its greedy continuations are checked against transformers' in
test_hf.py); the 'lm' run an untrained char_gpt:smoke checkpoint (bytes), saved here.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.cli import generate
from jaxdl.data.tokenize import bytes_tokenizer
from jaxdl.models import decoding, hf
from jaxdl.train import load_run

LLAMA = os.path.join(os.path.dirname(__file__), "data", "hf", "llama")  # vocab_size 96


def test_an_lm_run_continues_a_prompt_greedily(tmp_path, untrained_run, capsys):
  run = untrained_run(tmp_path / "lm", "char_gpt:smoke", jnp.zeros((1, 4), jnp.int32))
  _, model, variables, _ = load_run(run)
  assert cli.main(["generate", str(run), "--prompt", "To be", "--temperature", "0",
                   "--max-new-tokens", "5", "--num", "2"]) == 0
  # Greedy: both rows are the library's own greedy continuation, decoded as bytes.
  ids = np.frombuffer(b"To be", np.uint8).astype(np.int32)[None]
  want = np.asarray(decoding.generate(model, variables["params"], ids, jax.random.key(0), 5,
                                     temperature=0))[0]
  row = bytes_tokenizer().decode(want)
  assert row.startswith("To be") and len(want) == 10
  assert capsys.readouterr().out == f"{row}\n{row}\n"


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
])
def test_a_bad_generate_input_is_one_line_exit_2(argv, message, refuse_after_config, capsys):
  assert cli.main(["generate", LLAMA, "--prompt", "the quick", *argv]) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("jaxdl: error: ") and message in lines[0], lines


def test_generate_refuses_what_is_not_a_language_model(tmp_path, capsys):
  (tmp_path / "config.json").write_text('{"task": "flow_matching"}')
  for directory, message in ((tmp_path, "a 'flow_matching' run continues no text"),
                             (tmp_path / "none", "no config.json")):
    assert cli.main(["generate", str(directory), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
  assert generate.HELP  # listed by `jaxdl --help`
