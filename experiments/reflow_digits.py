"""Reflow on 8x8 digits: a class-conditional flow model's few-step samples before and after.

Run:
  jaxdl train experiments/reflow_digits.py            # workdir runs/reflow_digits; ~20 min
  jaxdl train reflow_digits:smoke                     # tiny teacher and student, for tests

Setup: the teacher is fm_digits_cfg's config (U-Net 16/32, 3,000 steps, guidance w = 2, with
this run's overrides) trained through the engine into <workdir>/teacher, reused when present: the
same run as distill_digits' teacher, so either workdir's teacher can seed the other. `reflow.pairs`
noise draws eps with uniform labels y go through the teacher's guided ODE (Heun,
`reflow.teacher_steps` steps) to x1, so the student learns the coupling (eps, y) -> x1 and samples
without guidance (one network call per step, where the guided teacher makes two). The student
starts from the teacher's parameters and trains `reflow.steps` updates (`jaxdl.generative.reflow`)
at peak lr `reflow.lr`. Both are sampled with Euler at `reflow.eval_steps`, 50 per class, and
judged by a digits_cnn run (<workdir>/classifier): the fraction labelled as their class with
probability >= 0.9, and the Frechet distance of the classifier's penultimate features to real
digits beside the real-vs-real floor (`evaluation.digits_quality`). Writes reflow.json,
digits_grid.png (the student at 1 step, one row per class) and the student as a run of its own
in <workdir>/student (Euler, 1 step), so `jaxdl sample <workdir>/student --steps 1` draws from it.

Expected (issue 17: 1-4 network calls after reflow). Measured at the default config, seed 0
(500 samples, 50 per class; "right": labelled as its class with probability >= 0.9; FD: Frechet
distance in the judge's features, real-vs-real floor 5.85):

  Euler steps (calls teacher / student)   1 (2 / 1)     2 (4 / 2)     4 (8 / 4)
  teacher, guided w = 2: right, FD        1.00, 36.7    1.00, 17.3    1.00, 13.2
  reflowed, unguided:    right, FD        1.00,  7.7    1.00,  8.2    1.00,  8.3

The teacher's own sampler (Heun 25 steps, guided: 100 calls) gives 1.00 and FD 8.27 (1.41x the
floor): one call of the reflowed student matches it (7.7, 1.32x), where the teacher's one Euler
step lands on its class means (every sample labelled right, FD 6.3x the floor: no variety). The
student's loss fell from 0.147 to 0.0114. Drawing the 5,000 guided Heun pairs (100 U-Net calls
each) is most of the run: 15 min with the teacher reused, on the 2-core CPU shared with another
job. 10,000 pairs (the earlier default, 70 min on a loaded machine) gave 7.6 / 8.3 / 8.3.
"""

import json
import pathlib

import jax
import numpy as np

from _digits import euler_quality, few_step_teacher, unguided
from jaxdl.course.generative_configs import digits_config
from jaxdl.generative import evaluation, reflow


def get_config(arg=None):
  c = digits_config("flow_matching", "reflow_digits", arg)
  c.description = "Reflow on digits: guided teacher vs one-call student at 1/2/4 Euler steps"
  c.reflow = reflow.default_reflow_config()
  c.reflow.pairs = 5_000        # 10,000 gave the same student (docstring)
  c.reflow.teacher_steps = 25   # the teacher's own sampler: Heun, 25 steps, 100 calls guided
  c.reflow.steps = 2_000
  c.reflow.batch = 64
  c.reflow.lr = 5e-4
  if c.train.steps < 1000:  # the smoke config
    c.reflow.pairs = 200
    c.reflow.teacher_steps = 2
    c.reflow.steps = 5
  return c


def run(config, workdir):
  """Trains (or reuses) the teacher and the judge, reflows the teacher and measures both."""
  settings = reflow.parse_reflow(config)
  model, variables, judge = few_step_teacher(config, workdir)
  k, w = config.gen.num_classes, config.gen.guidance
  key_pairs, key_train = jax.random.split(jax.random.PRNGKey(config.seed + 1))
  y_N = np.arange(settings.pairs) % k
  eps_N, x1_N = reflow.make_pairs(model.apply, variables, key_pairs, settings.pairs,
                                  sample_shape=tuple(config.gen.sample_shape),
                                  steps=settings.teacher_steps, sampler=settings.teacher_sampler,
                                  y_N=y_N, guidance=w, num_classes=k)
  tx = reflow.student_optimizer(config, settings.lr, settings.steps)
  params, losses = reflow.train_reflow(model.apply, variables["params"], tx, eps_N, x1_N,
                                       steps=settings.steps, batch=settings.batch, rng=key_train,
                                       y_N=y_N)
  student_config = unguided(config)
  out = {"teacher": {}, "reflowed": {}, "guidance": w,
         "reflow_loss": {"first": float(losses[0]), "last": float(losses[-1])}}
  for s in settings.eval_steps:
    out["teacher"][f"euler@{s}"], _ = euler_quality(config, model, variables, judge, s)
    out["reflowed"][f"euler@{s}"], pix = euler_quality(student_config, model,
                                                       {"params": params}, judge, s)
    if s == min(settings.eval_steps):
      evaluation.digit_grid(pix.reshape(k, -1, 8, 8)[:, :10],
                            pathlib.Path(workdir) / "digits_grid.png")
  student = pathlib.Path(workdir) / "student"
  if not student.exists():  # a rerun over a finished workdir keeps the first student
    evaluation.save_run(student, student_config, params, step=settings.steps, sampler="euler",
                        steps=1)
  pathlib.Path(workdir, "reflow.json").write_text(json.dumps(out, indent=2))
  return {m: {s: {"confident": q["confident"], "frechet": q["frechet"]} for s, q in r.items()}
          for m, r in out.items() if m in ("teacher", "reflowed")}
