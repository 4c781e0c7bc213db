"""jaxdl.generative.few_step: students of a trained flow run from its config, and the 2-D toy
procedures of reflow_toy2d and distill_toy2d on a tiny teacher trained by the engine."""

import json

import jax
import numpy as np
import pytest

from jaxdl.config import load_config
from jaxdl.generative import few_step


def test_unguided_drops_the_guidance_of_a_copy():
  config = load_config("reflow_digits:smoke")[0]
  student = few_step.unguided(config)
  assert student.gen.guidance is None and config.gen.guidance == 2.0


def test_teacher_draws_cycle_the_labels_of_a_conditional_run_only():
  draws = few_step._teacher_draws(load_config("reflow_digits:smoke")[0], 25)  # noqa: SLF001
  np.testing.assert_array_equal(draws["y_N"], np.arange(25) % 10)
  assert draws["guidance"] == 2.0 and draws["num_classes"] == 10
  assert draws["sample_shape"] == (8, 8, 1)
  assert few_step._teacher_draws(load_config("reflow_toy2d:smoke")[0], 25) == {  # noqa: SLF001
      "sample_shape": (2,)}


TINY = ("gen.eval_num=200", "distill.trajectories=200", "distill.steps=20")


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
  """distill_toy2d:smoke's flow trained 40 steps by the engine, with small few-step sections."""
  from jaxdl.train import run
  config = load_config("distill_toy2d:smoke", ["train.plot=False", *TINY])[0]
  config.train.update(steps=40, eval_every=40, ckpt_every=40)
  workdir = tmp_path_factory.mktemp("teacher")
  run(config, workdir, progress=False)
  return config, workdir


def test_students_start_from_the_teacher_and_fit_their_targets(teacher):
  from jaxdl.train import load_run
  config, workdir = teacher
  _, model, variables, _ = load_run(workdir, config)
  students = few_step.distill_students(config, model, variables, student_steps=(1, 4))
  assert sorted(students) == [1, 4]
  params, losses = students[1]
  assert losses.shape == (20,) and float(losses[-5:].mean()) < float(losses[:5].mean())
  assert jax.tree.structure(params) == jax.tree.structure(variables["params"])


@pytest.mark.slow
def test_toy2d_distill_writes_its_students_and_beats_the_teacher_at_one_step(teacher):
  config, workdir = teacher
  out = few_step.toy2d_distill(config, workdir)["distill"]
  assert set(out["teacher"]) == set(out["distilled"]) == {"euler@1", "euler@2", "euler@4"}
  assert out["distilled"]["euler@1"] < out["teacher"]["euler@1"]  # one step: the mean vs the map
  saved = json.loads((workdir / "distill.json").read_text())
  assert saved["loss"]["euler@1"]["last"] < saved["loss"]["euler@1"]["first"]
  student = json.loads((workdir / "student1" / "config.json").read_text())
  assert (student["gen"]["sampler"], student["gen"]["steps"]) == ("euler", 1)
  before = (workdir / "student1" / "config.json").stat().st_mtime_ns
  few_step.save_student(workdir / "student1", config, {}, step=1, steps=1)  # kept, not rewritten
  assert (workdir / "student1" / "config.json").stat().st_mtime_ns == before


@pytest.mark.slow
def test_toy2d_reflow_measures_teacher_and_student_and_saves_the_student(teacher, tmp_path):
  import shutil
  config, workdir = teacher
  reflow_config, _ = load_config("reflow_toy2d:smoke", [
      "gen.eval_num=200", "reflow.pairs=200", "reflow.teacher_steps=4", "reflow.steps=20"])
  shutil.copytree(workdir / "checkpoints", tmp_path / "checkpoints")
  shutil.copy(workdir / "config.json", tmp_path / "config.json")
  out = few_step.toy2d_reflow(reflow_config, tmp_path)["reflow"]
  assert set(out["reflowed"]) == {"euler@1", "euler@2", "euler@4"} and out["floor"] > 0
  assert out["reflowed"]["euler@1"]["energy_ratio"] < out["teacher"]["euler@1"]["energy_ratio"]
  assert (tmp_path / "samples.png").exists() and (tmp_path / "reflow.json").exists()
  assert (tmp_path / "student" / "checkpoints").is_dir()
