"""The passkey data's contract (`jaxdl.data.passkey`) and the `long_context` experiment: the
answer is where the document says, the loss mask covers exactly the answer, a context no longer
than the distance holds no part of the key, the same documents seen through two contexts agree,
bad input is one line (exit 2, nothing written), and `long_context:smoke` trains end to end."""

import json

import numpy as np
import pytest

from jaxdl import cli
from jaxdl.data import parse_data
from jaxdl.data.passkey import HEAD, KEY_BASE, ask_token, vocab_size

DIGITS, DISTANCE, SPREAD = 3, 40, 20


def _source(context, **kw):
  return parse_data(dict(name="passkey", context_length=context, distance=DISTANCE,
                         spread=SPREAD, digits=DIGITS, n=32, n_eval=8, max_bytes=50_000,
                         **kw)).build()


def _rows(context):
  return _source(context).train.gather(np.arange(32))


def test_the_answer_is_the_stated_key_and_only_it_is_scored():
  c = 200  # > DISTANCE + SPREAD + DIGITS + len(HEAD): every row holds the whole statement
  b = _rows(c)
  assert b["x"].shape == b["y"].shape == b["loss_mask"].shape == (32, c)
  np.testing.assert_array_equal(b["loss_mask"], np.repeat([[0] * (c - DIGITS) + [1] * DIGITS],
                                                          32, 0))
  head = np.frombuffer(HEAD, np.uint8)
  distances = []
  for x, y in zip(b["x"], b["y"]):
    assert x[c - DIGITS] == ask_token(DIGITS)                 # the question ends at ASK
    ask = int(np.flatnonzero(x == ask_token(DIGITS))[0])
    stated = np.flatnonzero((x >= KEY_BASE) & (x < ask_token(DIGITS)))
    k1 = int(stated[0])                                       # the statement's first digit
    np.testing.assert_array_equal(x[k1 - len(head):k1], head)  # "The pass key is " before it
    key = x[k1:k1 + DIGITS]
    np.testing.assert_array_equal(key, KEY_BASE + 10 * np.arange(DIGITS) + (key - KEY_BASE) % 10)
    np.testing.assert_array_equal(y[ask:], key)               # the answer: the stated key
    np.testing.assert_array_equal(x[ask + 1:], key[:-1])      # teacher-forced digits
    distances.append(ask - k1)
  assert min(distances) >= DISTANCE and max(distances) <= DISTANCE + SPREAD
  assert len(set(distances)) > 5                              # a random depth
  assert _source(c).info["vocab_size"] == vocab_size(DIGITS) == KEY_BASE + 10 * DIGITS + 1


def test_a_context_no_longer_than_the_distance_cannot_hold_the_key():
  short, long_ = _rows(DISTANCE), _rows(200)
  # The same documents: the short rows are the long rows' last DISTANCE tokens.
  np.testing.assert_array_equal(short["x"], long_["x"][:, -DISTANCE:])
  np.testing.assert_array_equal(short["y"], long_["y"][:, -DISTANCE:])
  before_ask = short["x"][:, :DISTANCE - DIGITS]
  assert not ((before_ask >= KEY_BASE) & (before_ask <= ask_token(DIGITS))).any()
  assert (short["x"][:, -DIGITS] == ask_token(DIGITS)).all()
  np.testing.assert_array_equal(short["y"][:, -DIGITS:], long_["y"][:, -DIGITS:])


def test_the_experiments_contexts_hold_the_key_always_and_never():
  """The full run's own data: every 2048-token row holds the statement, no 512-token row does."""
  from jaxdl.config import load_config
  for context, holds in ((2048, True), (512, False)):
    config, _ = load_config(f"long_context:context={context}")
    source = parse_data(config.data)
    b = source.build().eval.gather(np.arange(8))
    before_ask = b["x"][:, :context - source.digits]
    key_B = ((before_ask >= KEY_BASE) & (before_ask < ask_token(source.digits))).sum(1)
    np.testing.assert_array_equal(key_B, source.digits if holds else 0)
    assert config.model.block_size == context


SMOKE = ["--no-progress", "--set", "train.plot=False"]


@pytest.mark.parametrize("argv, says", [
    (["long_context:smoke", "--set", "data.distance=60000"], "data.distance: a document needs"),
    (["long_context:smoke", "--set", "data.context_length=0"], "data.context_length: must be > 0"),
    (["long_context:smoke,context=-8"], "must be > 0"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(argv, says, tmp_path, capsys):
  workdir = tmp_path / "w"
  assert cli.main(["train", *argv, "--workdir", str(workdir), *SMOKE]) == 2
  err = capsys.readouterr().err.strip()
  assert "\n" not in err and says in err, err
  assert not workdir.exists()


def test_smoke_trains_end_to_end(tmp_path, capsys):
  workdir = tmp_path / "smoke"
  assert cli.main(["train", "long_context:smoke", "--workdir", str(workdir), *SMOKE]) == 0
  summary = json.loads((workdir / "summary.json").read_text())
  results = json.loads((workdir / "results.json").read_text())
  assert summary["step"] == 4 and np.isfinite(summary["eval"]["loss"])
  assert results["C96"]["context"] == 96 and 0 <= results["C96"]["eval_accuracy"] <= 1
