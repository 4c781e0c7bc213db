"""The loop's bookkeeping: early stopping, best + latest checkpoints, resuming on another layout,
and the run artifacts."""

import json

import pytest

from jaxdl.config import load_config
from jaxdl.train import run
from jaxdl.train.checkpoint import Checkpointer, load_state
from jaxdl.train.writers import read_metrics


def _config(*overrides):
  config, _ = load_config("moons_mlp", ["train.log_every=1", "data.batch_size=200", *overrides])
  return config


def test_early_stopping_after_patience_evals_without_improvement(tmp_path):
  # lr 0: eval accuracy never improves after the first eval, so patience 2 stops at the third.
  summary = run(_config("optim.lr=0.0", "train.steps=100", "train.eval_every=5",
                        "train.patience=2", "train.plot=False"), tmp_path, progress=False)
  assert summary["early_stopped"] and summary["step"] == 15
  events = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()
            if '"event"' in l]
  assert events[-1] == {"step": 15, "event": "early_stop", "patience": 2}
  assert load_state(tmp_path)[0] == 15


def test_keeps_latest_and_best_checkpoints(tmp_path):
  run(_config("train.steps=60", "train.eval_every=10", "train.ckpt_every=10", "train.keep_ckpts=1",
              "optim.lr=0.05", "train.plot=False"), tmp_path, progress=False)
  evals = read_metrics(tmp_path, "eval")
  best = max(evals, key=lambda r: (r["accuracy"], r["step"]))["step"]
  steps = Checkpointer(tmp_path / "checkpoints").all_steps()
  assert set(steps) == {best, 60}


@pytest.mark.slow
def test_resume_on_other_strategy_and_device_count(tmp_path):
  run(_config("train.steps=4", "train.ckpt_every=2", "train.plot=False"), tmp_path,
      progress=False)
  summary = run(_config("train.steps=8", "train.ckpt_every=2", "train.plot=False",
                        "parallel.strategy='pmap'", "parallel.devices=2"), tmp_path,
                progress=False)
  assert summary["start_step"] == 4 and summary["step"] == 8
  manifest = json.loads(
      next((tmp_path / "checkpoints" / "8" / "manifest").glob("*")).read_text())
  assert manifest["strategy"] == "pmap" and manifest["devices"] == 2
  assert manifest["process_count"] == 1


def test_run_artifacts(tmp_path):
  run(_config("train.steps=6", "train.eval_every=3"), tmp_path, progress=False)
  assert (tmp_path / "loss.png").stat().st_size > 1000
  assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["name"] == "moons_mlp" and config["train"]["steps"] == 6
  train = read_metrics(tmp_path, "train")
  assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
  assert {"loss", "grad_norm", "lr", "accuracy"} <= set(train[0])
