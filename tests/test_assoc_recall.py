"""The associative-recall data (every query's answer is the value that followed its key) and the
lm task's loss with a loss mask (CE over the masked positions only) against the formula."""

import numpy as np
import pytest

from jaxdl.data import parse_data
from jaxdl.train import TASKS


def test_rows_hold_distinct_keys_and_queries_answered_by_their_values():
  src = parse_data(dict(name="assoc_recall", pairs=5, queries=3, keys=8, values=6, n=40,
                        n_eval=4)).build()
  b = src.train.gather(np.arange(40))
  assert b["x"].shape == b["y"].shape == b["loss_mask"].shape == (40, 13)
  assert src.info["vocab_size"] == 14
  np.testing.assert_array_equal(b["loss_mask"], np.repeat([[0] * 10 + [1] * 3], 40, 0))
  for x, y in zip(b["x"], b["y"]):
    keys, values = x[:10:2], x[1:10:2]
    assert len(set(keys)) == 5 and (keys < 8).all() and ((values >= 8) & (values < 14)).all()
    table = dict(zip(keys, values))
    assert [table[q] for q in x[10:]] == list(y[10:])


def test_fused_rows_hold_one_token_per_pair_and_the_same_answers():
  src = parse_data(dict(name="assoc_recall", pairs=5, queries=3, keys=8, values=6, n=40,
                        n_eval=4, fused=True)).build()
  b = src.train.gather(np.arange(40))
  assert b["x"].shape == (40, 8) and src.info["vocab_size"] == 8 + 6 + 8 * 6
  np.testing.assert_array_equal(b["loss_mask"], np.repeat([[0] * 5 + [1] * 3], 40, 0))
  for x, y in zip(b["x"], b["y"]):
    keys, values = np.divmod(x[:5] - 14, 6)  # token K + V + k V + (v - K)
    assert (x[:5] >= 14).all() and len(set(keys)) == 5 and (keys < 8).all()
    table = dict(zip(keys, values + 8))
    assert [table[q] for q in x[5:]] == list(y[5:])


def test_more_pairs_than_keys_is_one_line():
  with pytest.raises(ValueError, match="^data.pairs: ") as e:
    parse_data(dict(name="assoc_recall", pairs=9, keys=8))
  assert "\n" not in str(e.value)


def test_the_lm_loss_scores_only_the_masked_positions():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 4, 5)).astype(np.float32)
  batch = {"x": logits, "y": rng.integers(0, 5, (2, 4)).astype(np.int32),
           "loss_mask": np.array([[0, 0, 1, 1], [0, 1, 0, 1]], np.float32),
           "mask": np.array([1.0, 1.0], np.float32)}
  identity = lambda variables, x, train: x  # noqa: E731  the logits are the input
  loss, (metrics, _) = TASKS["lm"](None, None).loss_fn(identity, {}, {}, batch, {}, False)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  ce = -np.take_along_axis(logp, batch["y"][..., None], -1)[..., 0]
  w = batch["loss_mask"]
  np.testing.assert_allclose(loss, (ce * w).sum() / w.sum(), rtol=1e-5)
  np.testing.assert_allclose(metrics["accuracy"],
                             ((logits.argmax(-1) == batch["y"]) * w).sum() / w.sum())
