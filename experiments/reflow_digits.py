"""Reflow on 8x8 digits: a class-conditional flow model's few-step samples before and after.

Run:
  jaxdl train experiments/reflow_digits.py            # workdir runs/reflow_digits; ~20 min
  jaxdl train reflow_digits:smoke                     # tiny teacher and student, for tests

Setup: the teacher is this experiment's own run: fm_digits_cfg's config (U-Net 16/32, 3,000 steps,
guidance w = 2) trained by the engine into <workdir> (before issue 24 it went to <workdir>/teacher).
distill_digits trains the same teacher (the configs differ only in name and few-step section): a
finished workdir of either (or of fm_digits_cfg), copied here and run with `--force`, resumes at its
last step instead of training again. After training, `jaxdl.course.few_step_digits.digits_reflow`
reflows it: `reflow.pairs` noise draws eps with uniform labels y go through the teacher's guided ODE
(Heun, `reflow.teacher_steps` steps) to x1, so the student learns the coupling (eps, y) -> x1 and
samples without guidance (one network call per step, where the guided teacher makes two). The
student starts from the teacher's parameters and trains `reflow.steps` updates
(`jaxdl.generative.reflow`) at peak lr `reflow.lr`. Both are sampled with Euler at
`reflow.eval_steps`, 50 per class, and judged by a digits_cnn run (<workdir>/classifier): the
fraction labelled as their class with probability >= 0.9, and the Frechet distance of the
classifier's penultimate features to real digits beside the real-vs-real floor
(`evaluation.digits_quality`). Writes reflow.json, digits_grid.png (the student at 1 step, one row
per class) and the student as a run of its own in <workdir>/student (Euler, 1 step), so `jaxdl
sample <workdir>/student --steps 1` draws from it.

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

from jaxdl.course import few_step_digits
from jaxdl.course.generative_configs import digits_config
from jaxdl.generative.reflow import default_reflow_config


def get_config(arg=None):
  c = digits_config("flow_matching", "reflow_digits", arg)
  c.description = "Reflow on digits: guided teacher vs one-call student at 1/2/4 Euler steps"
  c.reflow = default_reflow_config()
  c.reflow.update(pairs=5_000,       # 10,000 gave the same student (docstring)
                  teacher_steps=25,  # the teacher's own sampler: Heun, 25 steps, 100 calls guided
                  steps=2_000, batch=64, lr=5e-4)
  if c.smoke:
    # batch 8: the suite's unoptimised XLA:CPU takes ~2 s per update of the U-Net at batch 64
    c.reflow.update(pairs=50, teacher_steps=2, steps=2, batch=8)
  return c


after_training = few_step_digits.digits_reflow  # `jaxdl train` calls it once trained
