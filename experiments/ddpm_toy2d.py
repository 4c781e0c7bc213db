"""DDPM (eps-prediction, linear betas, T = 1000) on a 2-D toy; DDIM and ancestral vs the energy floor.

Run:
  jaxdl train experiments/ddpm_toy2d.py               # moons; workdir runs/ddpm_toy2d
  jaxdl train experiments/ddpm_toy2d.py:8gaussians    # or :checkerboard, :swissroll
  jaxdl train ddpm_toy2d:smoke                        # a few hundred steps, for tests

Setup: the fm_toy2d data, model and optimizer (see jaxdl.generative.configs.toy2d_config), trained
with the DDPM loss E||eps - eps_theta(x_t, t)||^2, x_t = sqrt(alpha_bar_t) x + sqrt(1 - alpha_bar_t)
eps, t ~ U{1..1000}, beta linear 1e-4 -> 0.02. After training, `run` samples 2,000 points with
deterministic DDIM (eta = 0) and ancestral DDPM steps on evenly spaced sub-sequences of 1, 2, 4,
10, 50 steps, writes samples.png and generative_eval.json with the energy distance and W2 to
2,000 fresh target points beside the two-draw floor.

Expected: 1 step gives a blurred blob around the mean; DDIM at 50 steps is within 3x of the energy
floor on moons (W2 within 1.5x); ancestral sampling needs more steps than DDIM for the same quality.
"""

from jaxdl.generative import evaluation
from jaxdl.generative.configs import toy2d_config


def get_config(arg=None):
  c = toy2d_config("ddpm", "ddpm_toy2d", arg)
  c.description = "DDPM on 2-D toys: DDIM / ancestral samples vs the two-draw energy floor"
  return c


def run(config, workdir):
  """Trains with `jaxdl.train.run`, then evaluates the final checkpoint."""
  return evaluation.train_and_evaluate(config, workdir)
