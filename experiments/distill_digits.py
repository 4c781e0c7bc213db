"""Step distillation on 8x8 digits: a class-conditional flow model at 1, 2, 4 Euler steps, before
and after.

Run:
  jaxdl train experiments/distill_digits.py           # workdir runs/distill_digits; ~50 min
  jaxdl train distill_digits:smoke                    # tiny teacher and students, for tests

Setup: the teacher and the judge are reflow_digits': this experiment's own run is the teacher,
fm_digits_cfg's config trained by the engine into <workdir> (guidance w = 2; before issue 24 it went
to <workdir>/teacher; a finished reflow_digits workdir copied here and run with `--force` is
reused), and a digits_cnn run in <workdir>/classifier is the judge. After training,
`jaxdl.course.few_step_digits.digits_distill` distills it: `distill.trajectories` noise draws with
uniform labels go through the teacher's guided ODE (Heun, `distill.substeps` per quarter of [0, 1]);
for each n in `distill.student_steps` a student starts from the teacher's parameters and trains
`distill.steps` updates to take the teacher's guided chord over each of its n intervals in one
unguided Euler step (`jaxdl.generative.distill`). Teacher (guided, 2 calls per step) and students (n
calls) are sampled with Euler at n steps, 50 per class, and judged as in reflow_digits. Writes
distill.json and each student as a run of its own in <workdir>/student<n> (Euler at its n steps),
which `jaxdl sample` reads.

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

from jaxdl.course import few_step_digits
from jaxdl.course.generative_configs import digits_config
from jaxdl.generative.distill import default_distill_config


def get_config(arg=None):
  c = digits_config("flow_matching", "distill_digits", arg)
  c.description = "Step distillation on digits: Euler at 1/2/4 steps before and after"
  c.distill = default_distill_config()
  c.distill.update(trajectories=5_000,
                   substeps=6,  # 24 Heun steps over [0, 1]: about the teacher's own 25
                   steps=1_000, batch=64)
  if c.smoke:
    # batch 8: the suite's unoptimised XLA:CPU takes ~2 s per update of the U-Net at batch 64
    c.distill.update(trajectories=20, substeps=1, steps=2, batch=8)
  return c


after_training = few_step_digits.digits_distill  # `jaxdl train` calls it once trained
