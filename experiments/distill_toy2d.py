"""Step distillation on a 2-D toy: Euler at 1, 2, 4 steps before and after, vs the energy floor.

Run:
  jaxdl train experiments/distill_toy2d.py             # moons; workdir runs/distill_toy2d
  jaxdl train experiments/distill_toy2d.py:8gaussians  # or :checkerboard, :swissroll
  jaxdl train distill_toy2d:smoke                      # small teacher and students, for tests

Setup: the teacher is the fm_toy2d run (the same config, trained through the engine into
<workdir>/teacher, reused when present). `distill.trajectories` noise draws go through its ODE
(Heun, `distill.substeps` per quarter of [0, 1]) and its states at t = 0, 1/4, 1/2, 3/4, 1 are
kept; for each n in `distill.student_steps` a student starts from the teacher's parameters and
trains `distill.steps` updates to take in one Euler step the teacher's chord over each of its n
intervals (`jaxdl.generative.distill`). Teacher and students are sampled with Euler at n steps
and compared with 2,000 fresh target points (energy distance, 8 rounds, beside the two-draw
floor; `evaluation.evaluate_toy2d`). Writes distill.json and each student as a run of its own in
<workdir>/student<n> (Euler at its n steps), which `jaxdl sample` reads.

Expected: at 1-2 Euler steps the students far nearer the floor than the teacher.
Measured (default config, moons, seed 0; the teacher is the 8,000-step fm_toy2d run; 2,000
points, 8 rounds, floor 2.0e-3), energy distance over the floor at Euler 1 / 2 / 4 steps:
- teacher:   418x / 87.1x / 19.2x;
- distilled: 0.94x / 0.92x / 0.92x (each student at its own step count): at the floor, within
  the rounds' noise (single rounds of the floor itself range about 3x).
The smoke config (teacher fm_toy2d:smoke, 300 steps; 1,000 trajectories, 50 student updates;
300 points, 2 rounds): teacher 91.8x / 22.1x / 6.6x, distilled 4.0x / 3.1x / 3.0x.
"""

import json
import pathlib

import jax

from jaxdl.course.generative_configs import toy2d_config
from jaxdl.generative import distill, evaluation, reflow
from jaxdl.train import load_run


def get_config(arg=None):
  c = toy2d_config("flow_matching", "distill_toy2d", arg)
  c.description = "Step distillation on 2-D toys: Euler at 1/2/4 steps before and after"
  c.distill = distill.default_distill_config()
  if c.train.steps < 1000:  # the smoke config
    c.distill.trajectories = 1000
    c.distill.substeps = 3
    c.distill.steps = 50
  return c


def distill_students(config, model, variables):
  """{n: (params, losses)}: one student per `distill.student_steps` n, from the teacher."""
  settings = distill.parse_distill(config)
  key_traj, key_train = jax.random.split(jax.random.PRNGKey(config.seed + 1))
  traj = distill.make_trajectories(model.apply, variables, key_traj, settings.trajectories,
                                   sample_shape=(2,), grid=settings.grid,
                                   substeps=settings.substeps)
  tx = reflow.student_optimizer(config, settings.lr, settings.steps)
  return {n: distill.train_distill(model.apply, variables["params"], tx, traj,
                                   steps=settings.steps, student_steps=n, batch=settings.batch,
                                   rng=key_train)
          for n in settings.student_steps}


def run(config, workdir):
  """Trains (or reuses) the teacher, distills one student per step count, measures them all."""
  from jaxdl.train import run as train_run
  teacher_dir = pathlib.Path(workdir) / "teacher"
  train_run(config, teacher_dir, progress=False)
  _, model, variables, _ = load_run(teacher_dir, config)
  num = config.gen.get("eval_num", 2000)
  repeats = 8 if num >= 1000 else 2

  def measure(v, n):
    res = evaluation.evaluate_toy2d(config, model, v, ("euler",), (n,), num, 0, None,
                                    repeats=repeats)
    return res["results"][f"euler@{n}"]["energy_ratio"], res["floor"]["energy"]

  out = {"teacher": {}, "distilled": {}, "loss": {}}
  for n, (params, losses) in distill_students(config, model, variables).items():
    out["teacher"][f"euler@{n}"], out["floor"] = measure(variables, n)
    out["distilled"][f"euler@{n}"], _ = measure({"params": params}, n)
    out["loss"][f"euler@{n}"] = {"first": float(losses[0]), "last": float(losses[-1])}
    student = pathlib.Path(workdir) / f"student{n}"
    if not student.exists():  # a rerun over a finished workdir keeps the first students
      evaluation.save_run(student, config, params, step=distill.parse_distill(config).steps,
                          sampler="euler", steps=n)
  pathlib.Path(workdir, "distill.json").write_text(json.dumps(out, indent=2))
  return {k: out[k] for k in ("teacher", "distilled", "floor")}
