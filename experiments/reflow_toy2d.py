"""Reflow on a 2-D toy: Euler at 1, 2, 4 steps before and after, vs the two-draw energy floor.

Run:
  jaxdl train experiments/reflow_toy2d.py             # moons; workdir runs/reflow_toy2d
  jaxdl train experiments/reflow_toy2d.py:8gaussians  # or :checkerboard, :swissroll
  jaxdl train reflow_toy2d:smoke                      # small teacher and student, for tests

Setup: the teacher is this experiment's own run: fm_toy2d's config trained by the engine into
<workdir> (before issue 24 it went to <workdir>/teacher; the same run). After training,
`jaxdl.generative.few_step.toy2d_reflow` reflows it: `reflow.pairs` noise draws eps go through the
teacher's ODE (Heun, `reflow.teacher_steps` steps) to x1; the student starts from the teacher's
parameters and trains `reflow.steps` updates on the coupled pairs (`jaxdl.generative.reflow`), with
the run's optimizer rule at peak lr `reflow.lr`. Both are then sampled with Euler at
`reflow.eval_steps` and compared with 2,000 fresh target points (energy distance, 8 rounds of fresh
draws, beside the two-draw floor; `evaluation.evaluate_toy2d`). Writes reflow.json, samples.png (the
student's samples) and the student as a run of its own in <workdir>/student (Euler, 1 step by
default), so `jaxdl sample <workdir>/student --steps 1` draws from it.

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

from jaxdl.course.generative_configs import toy2d_config
from jaxdl.generative import few_step


def get_config(arg=None):
  c = toy2d_config("flow_matching", "reflow_toy2d", arg, few_step="reflow")
  c.description = "Reflow on 2-D toys: Euler at 1/2/4 steps before and after vs the energy floor"
  return c


after_training = few_step.toy2d_reflow  # `jaxdl train` calls it once trained
