"""Reflow on a 2-D toy: Euler at 1, 2, 4 steps before and after, vs the two-draw energy floor.

Run:
  jaxdl train experiments/reflow_toy2d.py             # moons; workdir runs/reflow_toy2d
  jaxdl train experiments/reflow_toy2d.py:8gaussians  # or :checkerboard, :swissroll
  jaxdl train reflow_toy2d:smoke                      # small teacher and student, for tests

Setup: the teacher is the fm_toy2d run (the same config, trained through the engine into
<workdir>/teacher, reused when present; sampled from its parameters). `reflow.pairs` noise
draws eps go through the teacher's ODE (Heun, `reflow.teacher_steps` steps) to x1; the student
starts from the teacher's parameters and trains `reflow.steps` updates on the coupled pairs
(`jaxdl.generative.reflow`), with the run's optimizer rule at peak lr `reflow.lr`. Both are then
sampled with Euler at `reflow.eval_steps` and compared with 2,000 fresh target points (energy
distance, 8 rounds of fresh draws, beside the two-draw floor; `evaluation.evaluate_toy2d`).
Writes reflow.json, samples.png (the student's samples) and the student as a run of its own in
<workdir>/student (Euler, 1 step by default), so `jaxdl sample <workdir>/student --steps 1`
draws from it.

Expected (issue 17's target): the reflowed model at 2 Euler steps within 2x the floor; the
teacher at 2 steps is far above it (its straight-line average curves).
Measured at the default config on moons (one run, seed 0; energy distance to 2,000 fresh points,
mean of 8 rounds, over the two-draw floor 2.0e-3), Euler at 1 / 2 / 4 steps:
- teacher (fm_toy2d, 8,000 steps):  418x / 87x / 19x the floor;
- reflowed (20,000 Heun@100 pairs, 2,000 steps from the teacher): 0.92x / 0.92x / 0.92x.
The student's regression loss falls from 0.48 to 1.0e-4: on 2-D data the teacher's noise-to-sample
map is smooth enough for one Euler step of the straightened field to reproduce it, so the
reflowed model matches the teacher's own many-step quality (Heun@50 of fm_toy2d: 0.92x) at 1 step.
"""

import json
import pathlib

import jax

from jaxdl.course.generative_configs import toy2d_config
from jaxdl.generative import evaluation, reflow
from jaxdl.train import load_run


def get_config(arg=None):
  c = toy2d_config("flow_matching", "reflow_toy2d", arg)
  c.description = "Reflow on 2-D toys: Euler at 1/2/4 steps before and after vs the energy floor"
  c.reflow = reflow.default_reflow_config()
  if c.train.steps < 1000:  # the smoke config
    c.reflow.pairs = 1000
    c.reflow.teacher_steps = 10
    c.reflow.steps = 50
  return c


def reflow_student(config, model, variables):
  """The reflowed parameters (and the student's losses) of the teacher `variables`."""
  settings = reflow.parse_reflow(config)
  key_pairs, key_train = jax.random.split(jax.random.PRNGKey(config.seed + 1))
  eps_N, x1_N = reflow.make_pairs(model.apply, variables, key_pairs, settings.pairs,
                                  sample_shape=(2,), steps=settings.teacher_steps,
                                  sampler=settings.teacher_sampler)
  tx = reflow.student_optimizer(config, settings.lr, settings.steps)
  return reflow.train_reflow(model.apply, variables["params"], tx, eps_N, x1_N,
                             steps=settings.steps, batch=settings.batch, rng=key_train)


def run(config, workdir):
  """Trains (or reuses) the teacher, reflows it, and measures both; returns the ratios."""
  from jaxdl.train import run as train_run
  settings = reflow.parse_reflow(config)
  teacher_dir = pathlib.Path(workdir) / "teacher"
  train_run(config, teacher_dir, progress=False)
  _, model, variables, _ = load_run(teacher_dir, config)
  params, losses = reflow_student(config, model, variables)
  num = config.gen.get("eval_num", 2000)
  repeats = 8 if num >= 1000 else 2
  out = {}
  for name, v, fig in (("teacher", variables, None), ("reflowed", {"params": params}, workdir)):
    res = evaluation.evaluate_toy2d(config, model, v, ("euler",), settings.eval_steps, num, 0,
                                    pathlib.Path(fig) if fig else None, repeats=repeats)
    out[name] = {k: {"energy_ratio": r["energy_ratio"], "energy": r["energy"]}
                 for k, r in res["results"].items()}
    out["floor"] = res["floor"]["energy"]
  out["reflow_loss"] = {"first": float(losses[0]), "last": float(losses[-1])}
  student = pathlib.Path(workdir) / "student"
  if not student.exists():  # a rerun over a finished workdir keeps the first student
    evaluation.save_run(student, config, params, step=settings.steps, sampler="euler", steps=1)
  pathlib.Path(workdir, "reflow.json").write_text(json.dumps(out, indent=2))
  return {k: out[k] for k in ("teacher", "reflowed", "floor")}
