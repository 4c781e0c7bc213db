"""Flow matching (rectified flow) on a 2-D toy distribution; energy distance vs the two-draw floor.

Run:
  jaxdl train experiments/fm_toy2d.py                 # moons; workdir runs/fm_toy2d
  jaxdl train experiments/fm_toy2d.py:8gaussians      # or :checkerboard, :swissroll
  jaxdl train fm_toy2d:smoke                          # a few hundred steps, for tests

Setup: standardized 2-D data (50,000 training points), x_t = t x + (1 - t) eps with t ~ U[0, 1],
velocity MSE against x - eps; a residual time-embedded MLP (4 blocks of width 256); AdamW 2e-3
with warmup + cosine, batch 256, 8,000 steps. After training, `after_training` samples 2,000 points with
Euler and Heun at 1, 2, 4, 10, 50 steps, writes samples.png and generative_eval.json, and prints the energy distance
to 2,000 fresh target points beside the floor (two independent target draws).

Expected: one Euler step collapses onto the data mean (energy distance ~1500x the floor). At 50
steps, measured at the default config on moons, as means over 5 rounds of fresh draws (the floor,
two independent target draws, averages 3.2e-4; one round alone ranged 2.2e-4 .. 5.4e-4):
Heun@50 2.8x the floor (standard error 0.4), Heun@10 2.8x, Euler@50 3.7x (0.2); W2 1.4x / 1.5x
its floor. Heun is within the issue's 3x, Euler is not. Heun@10 = Heun@50 says the model, not the
solver, sets the floor: 24,000 steps (Euler@50 2.6x, Heun@50 3.0x) and a parameter average
(`--set optim.ema_decay=0.999`: Heun@50 3.0x at 8,000 steps) did not move it beyond the noise.
"""

from jaxdl.generative import evaluation
from jaxdl.generative.configs import toy2d_config


def get_config(arg=None):
  c = toy2d_config("flow_matching", "fm_toy2d", arg)
  c.description = "Flow matching on 2-D toys: Euler/Heun samples vs the two-draw energy floor"
  return c


def after_training(config, workdir, summary):
  """Samples the final checkpoint and measures it (generative_eval.json, figures)."""
  return evaluation.after_training(config, workdir, summary)
