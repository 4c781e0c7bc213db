"""jaxdl.course.digits_judge: the digits judge trained beside a run, and the post-training checks
of the digits experiments, at smoke size."""

import json

import numpy as np
import pytest

from jaxdl.config import load_config
from jaxdl.course import digits_judge
from jaxdl.train import run

SHORT = ["train.plot=False", "train.steps=4", "train.eval_every=4", "train.ckpt_every=4"]


def test_only_vae_and_gan_runs_have_a_one_call_check(tmp_path):
  with pytest.raises(ValueError, match="task: 'flow_matching' has no one-call check"):
    digits_judge.one_call_check(load_config("fm_digits_cfg:smoke")[0], tmp_path)


@pytest.mark.slow
def test_the_judge_trains_once_and_labels_real_digits_confidently(tmp_path):
  from jaxdl.data import digits_split
  directory = digits_judge.train_judge(tmp_path, smoke=True)
  assert directory == tmp_path / "classifier"
  config = json.loads((directory / "config.json").read_text())
  assert config["name"] == "digits_cnn" and config["smoke"] is True
  mtime = (directory / "summary.json").stat().st_mtime_ns
  digits_judge.train_judge(tmp_path, smoke=True)  # a finished judge is reused
  assert (directory / "summary.json").stat().st_mtime_ns == mtime
  x_te = digits_split()[2][:50]
  out = digits_judge.judge_samples(2 * x_te[..., None] / 16 - 1, directory)  # [-1, 1] pixels
  assert sum(out["class_counts"]) == 50 and 0 <= out["confident_fraction"] <= 1


@pytest.mark.slow
def test_one_call_check_of_a_smoke_run_samples_without_training_the_judge(tmp_path):
  config, _ = load_config("gan_digits:smoke", SHORT)
  run(config, tmp_path, progress=False)
  out = digits_judge.one_call_check(config, tmp_path)["generative"]
  assert out == {"step": 4}
  assert json.loads((tmp_path / "generative_eval.json").read_text()) == out
  assert not (tmp_path / "classifier").exists()


@pytest.mark.slow
def test_class_check_with_the_svm_judge_reports_class_accuracy(tmp_path):
  config, _ = load_config("fm_digits_cfg:smoke", SHORT)
  assert config.gen.classifier == "svm"
  run(config, tmp_path, progress=False)
  out = digits_judge.class_check(config, tmp_path)["generative"]
  assert out["num"] == config.gen.eval_num and 0 <= out["class_accuracy"] <= 1
  assert out["classifier_test_accuracy"] > 0.9 and (tmp_path / "digits_grid.png").exists()
  assert np.isfinite(out["class_accuracy"]) and not (tmp_path / "classifier").exists()
