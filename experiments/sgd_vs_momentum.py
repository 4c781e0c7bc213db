"""SGD vs heavy-ball momentum on the anisotropic quadratic theta1^2/20 + theta2^2 (16 steps).

Run:
  jaxdl train experiments/sgd_vs_momentum.py      # workdir runs/sgd_vs_momentum
  jaxdl train sgd_vs_momentum:smoke               # the same (the toy is already tiny)

Setup: L(theta) = theta1^2 / 20 + theta2^2 from theta0 = (-8.5, 1.8), 16 updates, no clipping, no
decay, constant lr. SGD: theta -= eta g with eta = 0.85. Momentum: v = mu v + g; theta -= eta v
with eta = 0.14, mu = 0.9.

Expected (within 0.01): SGD ends near (-2.052, 0.006), zigzagging across the narrow theta2
direction (factor 1 - 2 eta = -0.7 per step) while creeping along theta1 (factor 0.915);
momentum ends near (-0.832, -0.697), much further along the valley. Writes
trajectories.png (both paths over the loss contours) and results.json.
"""

import json
import os

import ml_collections

from jaxdl.optim import default_optim_config
from jaxdl.course.toys import quadratic_loss, run_toy_quadratic
from jaxdl.config import parse_arg


def _rule(name, lr, momentum=None):
  # plain sgd has no momentum: leave it unset (None)
  return default_optim_config(name, lr=lr, momentum=momentum, weight_decay=0.0, clip_norm=None,
                              schedule="constant", warmup_frac=0.0)


def get_config(arg=None):
  smoke = parse_arg(arg, smoke=False).smoke  # the toy is already fast: smoke runs it whole
  c = ml_collections.ConfigDict(dict(
      name="sgd_vs_momentum", seed=0, smoke=smoke,
      description="SGD vs heavy-ball momentum on theta1^2/20 + theta2^2, 16 steps from "
                  "(-8.5, 1.8)"))
  c.toy = ml_collections.ConfigDict(dict(theta0=(-8.5, 1.8), coeffs=(1 / 20, 1.0), steps=16))
  c.sgd = _rule("sgd", 0.85)
  c.momentum = _rule("momentum", 0.14, 0.9)
  return c


def run(config, workdir):
  """Runs both optimizers, plots them over the contours, returns their final points."""
  toy = config.toy
  paths = {name: run_toy_quadratic(config[name], tuple(toy.theta0), toy.steps, tuple(toy.coeffs))
           for name in ("sgd", "momentum")}
  results = {name: {"final": [float(v) for v in p[-1]],
                    "final_loss": float(quadratic_loss(p[-1], tuple(toy.coeffs))),
                    "trajectory": p.tolist()} for name, p in paths.items()}
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(results, f, indent=2)
  _plot(paths, toy, os.path.join(workdir, "trajectories.png"))
  return {name: {"theta1": r["final"][0], "theta2": r["final"][1], "loss": r["final_loss"]}
          for name, r in results.items()}


def _plot(paths, toy, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np
  a1, a2 = toy.coeffs
  t1, t2 = np.meshgrid(np.linspace(-10, 1.5, 200), np.linspace(-2.4, 2.4, 200))
  fig, ax = plt.subplots(figsize=(8, 4))
  ax.contour(t1, t2, a1 * t1**2 + a2 * t2**2, levels=[0.4, 1.2, 2.4, 4.0, 6.8], colors="0.75")
  for (name, p), color in zip(paths.items(), ("tab:red", "tab:blue")):
    ax.plot(p[:, 0], p[:, 1], "-o", ms=3, color=color,
            label=f"{name}: ({p[-1, 0]:.3f}, {p[-1, 1]:.3f})")
  ax.plot([0], [0], "k*", ms=10, label="minimum")
  ax.set_xlabel("theta1")
  ax.set_ylabel("theta2")
  ax.set_title(f"{toy.steps} steps on theta1^2/20 + theta2^2")
  ax.legend(loc="lower right", fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
