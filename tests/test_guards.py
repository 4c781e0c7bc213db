"""Spike guard mechanics: detection against a rolling median, rewind, skipped batch, give-up."""

import json

import numpy as np
import pytest

from jaxdl.config import apply_overrides, load_config
from jaxdl.data import default_data_config
from jaxdl.train import SpikeError, run
from jaxdl.train.guards import SpikeDetector


def test_detector_flags_only_values_far_above_the_median():
  d = SpikeDetector(factor=5.0, window=4)
  assert d.check({"loss": 1.0}) is None and d.check({"loss": 1.2}) is None
  assert d.check({"loss": 4.0}) is None          # 4 < 5 x median(1.0, 1.2)
  spike = d.check({"loss": 30.0})
  assert spike == {"metric": "loss", "value": 30.0, "median": 1.2}
  assert list(d.history["loss"]) == [1.0, 1.2, 4.0]  # the spike is not added
  with pytest.raises(ValueError, match="train.spike_watch"):
    SpikeDetector(watch="accuracy")


@pytest.fixture
def poisoned_npz(tmp_path):
  """1000 moons points in a fixed order; rows 500..599 (the 6th batch of 100) scaled by 1e3."""
  from sklearn.datasets import make_moons  # imported here: 1.6 s at collection
  x, y = make_moons(1000, noise=0.25, random_state=0)
  x = x.astype(np.float32)
  x[500:600] *= 1e3
  path = tmp_path / "poisoned.npz"
  np.savez(path, x=x, y=y.astype(np.float32), x_eval=x[:200] / 1.0, y_eval=y[:200])
  return path


def _config(path, *extra):
  config, _ = load_config("moons_mlp")
  with config.unlocked():
    config.data = default_data_config("npz")
  apply_overrides(config, [
      f"data.path='{path}'", "data.kind='binary'", "data.shuffle=False",
      "data.batch_size=100", "train.steps=10", "train.ckpt_every=2", "train.eval_every=0",
      "train.log_every=1", "train.plot=False", "train.spike_guard=True", "train.spike_window=4",
      "optim.lr=1e-3", *extra])
  return config


def test_spike_rewinds_to_last_checkpoint_and_skips_the_batch(poisoned_npz, tmp_path):
  summary = run(_config(poisoned_npz), tmp_path / "run", progress=False)
  assert summary["rewinds"] == 1 and summary["step"] == 10
  events = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
            if '"event"' in l]
  rewind = [e for e in events if e["event"] == "rewind"]
  assert len(rewind) == 1
  assert rewind[0]["step"] == 6 and rewind[0]["to_step"] == 4 and rewind[0]["skipped_batch"] == 5
  assert rewind[0]["value"] > 5 * rewind[0]["median"]
  assert summary["train"]["loss"] < 1.0


def test_spike_before_any_checkpoint_stops_clearly(poisoned_npz, tmp_path):
  with pytest.raises(SpikeError, match="no checkpoint to rewind to yet"):
    run(_config(poisoned_npz, "train.ckpt_every=0"), tmp_path / "run", progress=False)


def test_doctor_switch_stops_a_planted_bug_before_the_workdir(tmp_path):
  from jaxdl import doctor
  from jaxdl.train import PreflightError
  config, _ = load_config("bug_last_layer_x100", ["train.doctor=True"])
  with pytest.raises(PreflightError, match="last_layer_too_large"):
    run(config, tmp_path / "run", progress=False, hooks=doctor.hooks_for(config))
  assert not (tmp_path / "run").exists()
  # Without the doctor's hook the switch cannot be honoured: refused, not silently skipped.
  with pytest.raises(ValueError, match="train.doctor"):
    run(config, tmp_path / "run", progress=False)
  assert not (tmp_path / "run").exists()
