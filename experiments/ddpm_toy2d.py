"""DDPM (linear betas, T = 1000, v-prediction) on a 2-D toy; DDIM and ancestral vs the energy floor.

Run:
  jaxdl train experiments/ddpm_toy2d.py               # moons; workdir runs/ddpm_toy2d
  jaxdl train experiments/ddpm_toy2d.py:8gaussians    # or :checkerboard, :swissroll
  jaxdl train ddpm_toy2d:smoke                        # a few hundred steps, for tests
  jaxdl train ddpm_toy2d --set gen.prediction=eps     # the eps loss of Ho et al.

Setup: the fm_toy2d data, model and optimizer (see jaxdl.course.generative_configs.toy2d_config),
trained on x_t = sqrt(alpha_bar_t) x + sqrt(1 - alpha_bar_t) eps, t ~ U{1..1000}, beta linear 1e-4
-> 0.02, with the v target alpha eps - sigma x (Salimans & Ho; the eps loss is one override away).
After training, `after_training` samples 2,000 points with deterministic DDIM (eta = 0) and
ancestral DDPM steps on evenly spaced sub-sequences of 1, 2, 4, 10, 50 steps, writes samples.png and
generative_eval.json with the energy distance (and W2 at 50 steps) to 2,000 fresh target points
beside the two-draw floor.

Expected (measured, moons, 8,000 steps; means over 8 rounds of fresh draws, floor 2.0e-3):
- DDIM@50: 1.04x the energy floor (standard error 0.29; W2 0.99x).
- Ancestral@50: 1.32x (0.30; W2 1.06x).
- At 10 steps: DDIM 5.4x, ancestral 11x.
- 1 step lands far off (x_hat at alpha_T ~ 0.006).
With the eps target, DDIM does much worse (measured against the older, stratified moons targets):
eps errors at high noise are amplified by sigma/alpha in x_hat, which the deterministic sampler
never re-noises away. The cosine schedule with eps and no clip_x0 diverges (alpha_T ~ 5e-5); the
digits experiments clip x_hat to [-1, 1].
"""

from jaxdl.generative import evaluation
from jaxdl.course.generative_configs import toy2d_config


def get_config(arg=None):
  c = toy2d_config("ddpm", "ddpm_toy2d", arg)
  c.description = "DDPM (v-prediction) on 2-D toys: DDIM / ancestral samples vs the energy floor"
  c.gen.prediction = "v"
  return c


after_training = evaluation.after_training  # `jaxdl train` calls it once trained
