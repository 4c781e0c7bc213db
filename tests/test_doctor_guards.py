"""Acceptance test of the loop's spike guard (train.spike_guard) with a planted bad batch.

The planted digits MLP (`jaxdl.course.planted`) multiplies its logits by 1e4 in training whenever
the batch holds one marked example (`model.poison_row`), chosen so that it sits in the batch at
data position K of the seeded stream. That step's loss is ~1e4 x a normal one and its gradient
poisons Adam's second moment. A guarded run must rewind to the last checkpoint, skip that batch,
log {"event": "rewind", ...} in metrics.jsonl, and end near a clean run's final eval loss; with no
checkpoint yet it must stop with a clear message.
"""

import json

import pytest

from jaxdl import doctor, train
from jaxdl.course import planted

K = 14           # data position of the bad batch (0-based): the spike shows at step K + 1
STEPS = 30

def _config(*, poison: bool, guard: bool, ckpt_every: int = 10):
  c = planted.digits_experiment("guard_test", "spike guard acceptance", steps=STEPS)
  c.optim.clip_norm = None    # clipping would hide the blow-up from Adam's moments
  c.optim.lr = 3e-3
  c.train.eval_every = 0
  c.train.log_every = 1
  c.train.ckpt_every = ckpt_every
  c.train.async_checkpoint = False
  c.train.plot = False
  c.train.spike_guard = guard
  c.train.spike_factor = 5.0
  c.train.spike_window = 10
  c.model.poison_row = planted.poison_row_at_step(c, K)
  c.model.poison_scale = 1e4 if poison else 1.0
  return c


def _records(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def clean_eval_loss(tmp_path_factory):
  summary = train.run(_config(poison=False, guard=False), tmp_path_factory.mktemp("clean"),
                      progress=False)
  return summary["eval"]["loss"]


def test_bad_batch_without_guard_derails_the_run(tmp_path, clean_eval_loss):
  history = doctor.HistoryHook()
  summary = train.run(_config(poison=True, guard=False), tmp_path, progress=False,
                      hooks=[history])
  spike = [r for r in _records(tmp_path) if r.get("step") == K + 1 and r.get("split") == "train"]
  assert spike[0]["loss"] > 100.0          # the planted step: logits x 1e4
  # The doctor's hook saw the same records through on_step_end and names the spike there.
  found = {d.symptom: d for d in history.found}
  assert found["spike"].step == K + 1
  assert [d.text() for d in history.found] == [d.text() for d in doctor.diagnose_workdir(tmp_path)]
  # Adam's second moment keeps the poisoned gradient: the run ends far from the clean one.
  assert summary["eval"]["loss"] > clean_eval_loss + 0.3


def test_guard_rewinds_skips_the_batch_and_matches_a_clean_run(tmp_path, clean_eval_loss):
  summary = train.run(_config(poison=True, guard=True), tmp_path, progress=False)
  rewinds = [r for r in _records(tmp_path) if r.get("event") == "rewind"]
  assert len(rewinds) == 1
  assert rewinds[0]["step"] == K + 1 and rewinds[0]["skipped_batch"] == K
  assert rewinds[0]["to_step"] == 10       # the last checkpoint before the spike (every 10)
  assert summary["step"] == STEPS
  train_losses = [r["loss"] for r in _records(tmp_path) if r.get("split") == "train"]
  assert max(train_losses) < 10.0          # the spiking step was never logged as training
  # One skipped batch out of 30 moves the final eval loss a little, not like the unguarded run.
  assert abs(summary["eval"]["loss"] - clean_eval_loss) < 0.1


def test_spike_before_any_checkpoint_stops_with_a_clear_message(tmp_path):
  with pytest.raises(train.SpikeError, match="no checkpoint"):
    train.run(_config(poison=True, guard=True, ckpt_every=100), tmp_path, progress=False)
