"""Few-step students of the class-conditional digits flow, judged: reflow_digits' and
distill_digits' post-training procedures.

The teacher is the run in `workdir` (fm_digits_cfg's config: U-Net 16/32, guidance w = 2); the
judge is a digits_cnn run in <workdir>/classifier (`jaxdl.course.digits_judge`, its smoke size
when `config.smoke`). The students (`jaxdl.generative.few_step`) learn the guided teacher and
sample unguided. Teacher (guided: 2 calls per step) and students (1 call per step) are sampled
with Euler, `PER_CLASS` per class (`SMOKE_PER_CLASS` when `config.smoke`; key 0), and judged
by `evaluation.digits_quality`: the fraction labelled as their class with probability >= 0.9,
and the Frechet distance of the judge's penultimate features to real digits beside the
real-vs-real floor.

- `digits_reflow(config, workdir)`: one reflowed student, measured at `reflow.eval_steps`;
  writes reflow.json, digits_grid.png (the student at its fewest steps) and <workdir>/student
  (Euler, 1 step);
- `digits_distill(config, workdir)`: one student per `distill.student_steps` n, each measured at
  its n; writes distill.json, digits_grid.png and <workdir>/student<n> (Euler, n steps).

Shapes: N samples, K classes.
"""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np

from jaxdl.course import digits_judge
from jaxdl.generative import distill, evaluation, few_step, reflow, tasks

PER_CLASS = 50
SMOKE_PER_CLASS = 10  # the smoke config's: still a full row of digits_grid.png per class


def samples_per_class(config) -> int:
  """Samples per class of each measurement: `PER_CLASS`, `SMOKE_PER_CLASS` when smoke."""
  return SMOKE_PER_CLASS if config.smoke else PER_CLASS


def euler_quality(config, model, variables, judge, steps: int, per_class: int | None = None):
  """(quality, pixels16_Nx64) of Euler at `steps` with the config's guidance, `per_class`
  samples of each class (default `samples_per_class(config)`; key 0), judged by `judge`
  (`digits_judge.judge_outputs`)."""
  per_class = samples_per_class(config) if per_class is None else per_class
  sample = tasks.make_run_sampler(config, model, sampler="euler", steps=steps)
  y_N = np.repeat(np.arange(config.gen.num_classes), per_class)
  x = sample(variables, jax.random.PRNGKey(0), len(y_N), y=y_N)
  pix_Nx64 = evaluation._to_pixels16(x, config.data.scale)  # noqa: SLF001
  return evaluation.digits_quality(judge, pix_Nx64, y_N), pix_Nx64


def _grid(pix_Nx64, config, workdir):
  """digits_grid.png: the first 10 samples of each class, one row per class."""
  k = config.gen.num_classes
  evaluation.digit_grid(pix_Nx64.reshape(k, -1, 8, 8)[:, :10],
                        pathlib.Path(workdir) / "digits_grid.png")


def _brief(out, *families) -> dict:
  """{family: {sampler: {confident, frechet}}} of the measured families."""
  return {m: {s: {"confident": q["confident"], "frechet": q["frechet"]} for s, q in out[m].items()}
          for m in families}


def _teacher_and_judge(config, workdir):
  from jaxdl.train import load_run
  _, model, variables, _ = load_run(workdir, config)
  return model, variables, digits_judge.judge_outputs(workdir, config.smoke)


def digits_reflow(config, workdir, summary=None) -> dict:
  """Reflows the run in `workdir`, measures teacher and student at `reflow.eval_steps` Euler
  steps; returns {'reflow': {teacher / reflowed: {euler@s: confident, frechet}}}."""
  del summary
  settings = reflow.parse_reflow(config)
  model, variables, judge = _teacher_and_judge(config, workdir)
  params, losses = few_step.reflow_student(config, model, variables)
  student_config = few_step.unguided(config)
  out = {"teacher": {}, "reflowed": {}, "guidance": config.gen.guidance,
         "reflow_loss": few_step.loss_ends(losses)}
  for s in settings.eval_steps:
    out["teacher"][f"euler@{s}"], _ = euler_quality(config, model, variables, judge, s)
    out["reflowed"][f"euler@{s}"], pix = euler_quality(student_config, model,
                                                       {"params": params}, judge, s)
    if s == min(settings.eval_steps):
      _grid(pix, config, workdir)
  few_step.save_student(pathlib.Path(workdir) / "student", student_config, params,
                        step=settings.steps, steps=1)
  pathlib.Path(workdir, "reflow.json").write_text(json.dumps(out, indent=2))
  return {"reflow": _brief(out, "teacher", "reflowed")}


def digits_distill(config, workdir, summary=None) -> dict:
  """Distills the run in `workdir` into one student per `distill.student_steps` n, measures
  teacher and student at n Euler steps; returns {'distill': {teacher / distilled: ...}}."""
  del summary
  settings = distill.parse_distill(config)
  model, variables, judge = _teacher_and_judge(config, workdir)
  student_config = few_step.unguided(config)
  out = {"teacher": {}, "distilled": {}, "loss": {}, "guidance": config.gen.guidance}
  for n, (params, losses) in few_step.distill_students(config, model, variables).items():
    out["teacher"][f"euler@{n}"], _ = euler_quality(config, model, variables, judge, n)
    out["distilled"][f"euler@{n}"], pix = euler_quality(student_config, model,
                                                        {"params": params}, judge, n)
    out["loss"][f"euler@{n}"] = few_step.loss_ends(losses)
    if n == min(settings.student_steps):
      _grid(pix, config, workdir)
    few_step.save_student(pathlib.Path(workdir) / f"student{n}", student_config, params,
                          step=settings.steps, steps=n)
  pathlib.Path(workdir, "distill.json").write_text(json.dumps(out, indent=2))
  return {"distill": _brief(out, "teacher", "distilled")}
