"""jaxdl.course.few_step_digits: reflow_digits' and distill_digits' procedures on a tiny
teacher, judged by the smoke-size digits judge."""

import json
import shutil

import pytest

from jaxdl.config import load_config
from jaxdl.course import digits_judge, few_step_digits
from jaxdl.train import run

# Batch 8: under the suite's XLA flags (tests/conftest.py) an update of the U-Net at batch 64
# takes ~2 CPU-s. No MFU or health signals are read here, so neither is counted or compiled in.
SHORT = ["train.plot=False", "train.steps=4", "train.eval_every=4", "train.ckpt_every=4",
         "data.batch_size=8", "train.count_flops=False", "train.watch=off"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
  """reflow_digits:smoke's teacher trained 4 steps, and its judge."""
  workdir = tmp_path_factory.mktemp("teacher")
  # Two of the three default Euler step counts: the measuring loop is the same, with two fewer
  # guided-sampler compiles.
  config, _ = load_config("reflow_digits:smoke", SHORT + ["reflow.eval_steps=(1, 2)"])
  run(config, workdir, progress=False)
  # The judge both procedures use, trained here (each test may run first, or alone).
  digits_judge.train_judge(workdir, smoke=True)
  return config, workdir


@pytest.mark.slow
def test_digits_reflow_judges_teacher_and_unguided_student(teacher):
  config, workdir = teacher
  out = few_step_digits.digits_reflow(config, workdir)["reflow"]
  assert set(out) == {"teacher", "reflowed"}
  assert set(out["reflowed"]) == set(out["teacher"]) == {"euler@1", "euler@2"}
  saved = json.loads((workdir / "reflow.json").read_text())
  assert saved["teacher"]["euler@1"]["num"] == 10 * few_step_digits.samples_per_class(config)
  student = json.loads((workdir / "student" / "config.json").read_text())
  assert student["gen"]["guidance"] is None and student["gen"]["steps"] == 1
  assert json.loads((workdir / "classifier" / "config.json").read_text())["smoke"] is True


@pytest.mark.slow
def test_digits_distill_saves_one_student_per_step_count(teacher, tmp_path):
  config, workdir = teacher
  for name in ("checkpoints", "classifier"):  # the same teacher and judge, reused
    shutil.copytree(workdir / name, tmp_path / name)
  shutil.copy(workdir / "config.json", tmp_path / "config.json")
  distill_config, _ = load_config("distill_digits:smoke", SHORT + ["distill.student_steps=(2,)"])
  out = few_step_digits.digits_distill(distill_config, tmp_path)["distill"]
  assert set(out["distilled"]) == {"euler@2"}
  assert [p.name for p in sorted(tmp_path.glob("student*"))] == ["student2"]
  assert (tmp_path / "digits_grid.png").exists()
