"""Step distillation on a 2-D toy: Euler at 1, 2, 4 steps before and after, vs the energy floor.

Run:
  jaxdl train experiments/distill_toy2d.py             # moons; workdir runs/distill_toy2d
  jaxdl train experiments/distill_toy2d.py:8gaussians  # or :checkerboard, :swissroll
  jaxdl train distill_toy2d:smoke                      # small teacher and students, for tests

Setup: this experiment's own run, fm_toy2d's config trained by the engine into <workdir>, is the
teacher (it went to <workdir>/teacher before issue 24; the same run). After training,
`jaxdl.generative.few_step.toy2d_distill` distills it: `distill.trajectories` noise draws go through
its ODE (Heun, `distill.substeps` per quarter of [0, 1]) and its states at t = 0, 1/4, 1/2, 3/4, 1
are kept; for each n in `distill.student_steps` a student starts from the teacher's parameters and
trains `distill.steps` updates to take in one Euler step the teacher's chord over each of its n
intervals (`jaxdl.generative.distill`). Teacher and students are sampled with Euler at n steps and
compared with 2,000 fresh target points (energy distance, 8 rounds, beside the two-draw floor;
`evaluation.evaluate_toy2d`). Writes distill.json and each student as a run of its own in
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

from jaxdl.course.generative_configs import toy2d_config
from jaxdl.generative import few_step


def get_config(arg=None):
  c = toy2d_config("flow_matching", "distill_toy2d", arg, few_step="distill")
  c.description = "Step distillation on 2-D toys: Euler at 1/2/4 steps before and after"
  return c


after_training = few_step.toy2d_distill  # `jaxdl train` calls it once trained
