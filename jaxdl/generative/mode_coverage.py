"""Mode coverage on the 8-Gaussian toy: which of its modes a generator's samples land on.

`modes_of_8gaussians(x)` counts, for samples in the standardized coordinates of the 'toy2d'
data, the samples within 3 standard deviations of each of the 8 centres (`gan.modes_covered`);
`evaluate_gan_toy2d(config, workdir)` is gan_toy2d's post-training check: one generator call
per sample, modes covered and the energy distance to fresh target points beside the two-draw
floor.

Shapes: N samples, M = 8 modes.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from jaxdl.generative import gan, metrics


def mode_centres(n: int = 20_000):
  """(centres_Mx2, mean distance of a point to its centre) in the standardized coordinates:
  the means of `n` fresh points grouped by their nearest of the 8 angles."""
  from jaxdl.data import sample_toy2d
  x = sample_toy2d("8gaussians", n, 12_345)
  k_N = np.round(np.arctan2(x[:, 1], x[:, 0]) / (np.pi / 4)).astype(int) % 8
  centres = np.stack([x[k_N == k].mean(0) for k in range(8)])
  return centres, float(np.mean(np.linalg.norm(x - centres[k_N], axis=1)))


def modes_of_8gaussians(x_Nx2) -> dict:
  """`gan.modes_covered` of the samples at radius 3 std around each centre (for a 2-D isotropic
  Gaussian E|x - centre| = std sqrt(pi / 2), so 3 std comes from the mean distance)."""
  centres, mean_dist = mode_centres()
  return gan.modes_covered(x_Nx2, centres, radius=3 * mean_dist / np.sqrt(np.pi / 2))


def evaluate_gan_toy2d(config, workdir, summary=None) -> dict:
  """gan_toy2d's check of its final checkpoint: `gen.eval_num` samples (key 0), the modes they
  cover, and the energy distance to as many fresh 8-Gaussian points beside the floor (two fresh
  draws). Writes gan_eval.json and gan_samples.png; returns {'generative': ...}."""
  import jax
  from jaxdl.data import sample_toy2d
  from jaxdl.generative import trained
  from jaxdl.train import load_run
  del summary
  _, model, variables, step = load_run(workdir)
  num = config.gen.eval_num
  x = np.asarray(gan.make_run_sampler(config, model)(variables, jax.random.PRNGKey(0), num))
  out = {"step": int(step), "r1": config.gen.r1, "updates": config.gen.updates,
         **modes_of_8gaussians(x),
         "energy": metrics.energy_distance(x, sample_toy2d("8gaussians", num, 10_000)),
         "floor": metrics.energy_distance(sample_toy2d("8gaussians", num, 10_001),
                                          sample_toy2d("8gaussians", num, 10_000))}
  out["energy_ratio"] = out["energy"] / out["floor"]
  pathlib.Path(workdir, "gan_eval.json").write_text(json.dumps(out, indent=2))
  trained.save_samples(config, x, str(pathlib.Path(workdir, "gan_samples.png")))
  return {"generative": out}
