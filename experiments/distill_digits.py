"""Step distillation on 8x8 digits: a class-conditional flow model at 1, 2, 4 Euler steps, before
and after.

Run:
  jaxdl train experiments/distill_digits.py           # workdir runs/distill_digits; ~50 min
  jaxdl train distill_digits:smoke                    # tiny teacher and students, for tests

Setup: the teacher and the judge are reflow_digits' (fm_digits_cfg's config trained into
<workdir>/teacher, guidance w = 2; a digits_cnn run in <workdir>/classifier). `distill.trajectories`
noise draws with uniform labels go through the teacher's guided ODE (Heun, `distill.substeps`
per quarter of [0, 1]); for each n in `distill.student_steps` a student starts from the
teacher's parameters and trains `distill.steps` updates to take the teacher's guided chord over
each of its n intervals in one unguided Euler step (`jaxdl.generative.distill`). Teacher
(guided, 2 calls per step) and students (n calls) are sampled with Euler at n steps, 50 per
class, and judged as in reflow_digits. Writes distill.json and each student as a run of its own
in <workdir>/student<n> (Euler at its n steps), which `jaxdl sample` reads.

Expected (issue 17: 1-4 network calls after distillation). Measured at the default config, seed 0,
with reflow_digits' teacher (500 samples, 50 per class; "right": labelled as its class with
probability >= 0.9; FD: Frechet distance in the judge's features, real-vs-real floor 5.85):

  Euler steps n (calls teacher / student)   1 (2 / 1)     2 (4 / 2)     4 (8 / 4)
  teacher, guided w = 2: right, FD          1.00, 36.6    1.00, 17.3    1.00, 13.2
  distilled (one student per n): right, FD  1.00,  7.3    1.00,  7.7    1.00,  8.0

Each student at its n calls beats the teacher's own sampler (Heun 25 steps, guided, 100 calls:
FD 8.27); reflow_digits' single student gets 7.6 / 8.3 / 8.3. Student losses fell from 0.142 /
0.086 / 0.082 to 0.0078 / 0.0056 / 0.0050 (n = 1 / 2 / 4). About 45 minutes on the loaded 2-core
CPU with the teacher reused (its 3,000 steps add about 6).
"""

import json
import pathlib

import jax
import numpy as np

from _digits import euler_quality, few_step_teacher, unguided
from jaxdl.course.generative_configs import digits_config
from jaxdl.generative import distill, evaluation, reflow


def get_config(arg=None):
  c = digits_config("flow_matching", "distill_digits", arg)
  c.description = "Step distillation on digits: Euler at 1/2/4 steps before and after"
  c.distill = distill.default_distill_config()
  c.distill.trajectories = 5_000
  c.distill.substeps = 6       # 24 Heun steps over [0, 1]: about the teacher's own 25
  c.distill.steps = 1_000
  c.distill.batch = 64
  if c.train.steps < 1000:  # the smoke config
    c.distill.trajectories = 100
    c.distill.substeps = 1
    c.distill.steps = 5
  return c


def run(config, workdir):
  """Trains (or reuses) the teacher and the judge, distills one student per step count and
  measures teacher and students at each count."""
  settings = distill.parse_distill(config)
  model, variables, judge = few_step_teacher(config, workdir)
  k = config.gen.num_classes
  key_traj, key_train = jax.random.split(jax.random.PRNGKey(config.seed + 1))
  y_N = np.arange(settings.trajectories) % k
  traj = distill.make_trajectories(model.apply, variables, key_traj, settings.trajectories,
                                   sample_shape=tuple(config.gen.sample_shape),
                                   grid=settings.grid, substeps=settings.substeps, y_N=y_N,
                                   guidance=config.gen.guidance, num_classes=k)
  tx = reflow.student_optimizer(config, settings.lr, settings.steps)
  student_config = unguided(config)
  out = {"teacher": {}, "distilled": {}, "loss": {}, "guidance": config.gen.guidance}
  for n in settings.student_steps:
    params, losses = distill.train_distill(model.apply, variables["params"], tx, traj,
                                           steps=settings.steps, student_steps=n,
                                           batch=settings.batch, rng=key_train, y_N=y_N)
    out["teacher"][f"euler@{n}"], _ = euler_quality(config, model, variables, judge, n)
    out["distilled"][f"euler@{n}"], pix = euler_quality(student_config, model,
                                                        {"params": params}, judge, n)
    out["loss"][f"euler@{n}"] = {"first": float(losses[0]), "last": float(losses[-1])}
    if n == min(settings.student_steps):
      evaluation.digit_grid(pix.reshape(k, -1, 8, 8)[:, :10],
                            pathlib.Path(workdir) / "digits_grid.png")
    student = pathlib.Path(workdir) / f"student{n}"
    if not student.exists():  # a rerun over a finished workdir keeps the first students
      evaluation.save_run(student, student_config, params, step=settings.steps,
                          sampler="euler", steps=n)
  pathlib.Path(workdir, "distill.json").write_text(json.dumps(out, indent=2))
  return {m: {s: {"confident": q["confident"], "frechet": q["frechet"]} for s, q in r.items()}
          for m, r in out.items() if m in ("teacher", "distilled")}
