"""`jaxdl sample WORKDIR`: draw samples from a trained generative run's latest checkpoint.

  jaxdl sample runs/fm_digits_cfg --sampler heun --steps 50 --guidance 2.0 --class 3 --num 64 \
      --out grid.png

Unset options take the run's `config.gen.*` values. The output is a PNG (an image grid for image
data, a scatter plot for 2-D data) or, for a name ending in .npy, the raw samples.
The sampling itself is `jaxdl.generative.tasks.make_run_sampler(config, model, ...)`, i.e.
`jaxdl.generative.samplers.make_sampler` with the run's path, prediction and classes.
"""

from __future__ import annotations

import math
import sys

HELP = "sample from a trained flow_matching / ddpm / vae / gan run"


def add_arguments(parser) -> None:
  parser.add_argument("workdir", help="the run's workdir (config.json + checkpoints/)")
  parser.add_argument("--sampler", default=None,
                      help="ddpm | ddim | euler | heun (default: the run's)")
  parser.add_argument("--steps", type=int, default=None, help="sampler steps (default: the run's)")
  parser.add_argument("--guidance", type=float, default=None, help="classifier-free guidance w")
  parser.add_argument("--eta", type=float, default=None,
                      help="DDIM noise scale (0 = deterministic)")
  parser.add_argument("--class", dest="cls", type=int, default=None, help="class to condition on")
  parser.add_argument("--num", type=int, default=64, help="number of samples")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default="samples.png", help="output .png or .npy")
  parser.add_argument("--no-ema", dest="ema", action="store_false",
                      help="sample with the last parameters even if the run kept an average "
                           "(optim.ema_decay)")


def sample_run(workdir, *, sampler=None, steps=None, guidance=None, eta=None, cls=None, num=64,
               seed=0, ema=True):
  """Returns (config, samples as a numpy array (num, *sample_shape)) for a trained run, from its
  parameter average when it kept one and `ema`, else from its last parameters."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jaxdl.generative import tasks  # pylint: disable=g-import-not-at-top
  from jaxdl.train import load_run
  config, model, variables, _ = load_run(workdir, ema=ema)
  if config.task in ONE_CALL_TASKS:
    return config, _sample_one_call(config, model, variables, num, seed, sampler=sampler,
                                    steps=steps, guidance=guidance, eta=eta, cls=cls)
  if cls is not None and not config.gen.num_classes:
    raise ValueError(f"--class {cls}: the run in {workdir} is unconditional (gen.num_classes = 0)")
  if guidance is not None and cls is None:
    raise ValueError("--guidance needs --class: the class to guide towards")
  sample = tasks.make_run_sampler(config, model, sampler=sampler, steps=steps, eta=eta,
                                  guidance=guidance if guidance is not None else (
                                      config.gen.guidance if cls is not None else None))
  return config, np.asarray(sample(variables, jax.random.PRNGKey(seed), num, y=cls))


def _sample_one_call(config, model, variables, num, seed, **options):
  """A VAE or GAN sample is one network call from z ~ N(0, I) (the decoder's mean, the
  generator's output): the options of a sampler loop (and a class, for these unconditional
  models) are refused, naming the first one given."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jaxdl.generative import gan, vae  # pylint: disable=g-import-not-at-top
  given = [name for name, value in options.items() if value is not None]
  if given:
    flag = {"cls": "class"}.get(given[0], given[0])
    raise ValueError(f"--{flag}: a {config.task!r} run samples with one network call and takes "
                     f"no --{flag} (options of flow_matching / ddpm runs)")
  family = {"vae": vae, "gan": gan}[config.task]
  sample = family.make_run_sampler(config, model)
  return np.asarray(sample(variables, jax.random.PRNGKey(seed), num))


def save_samples(config, x, out: str) -> None:
  import numpy as np  # pylint: disable=g-import-not-at-top
  if out.endswith(".npy"):
    np.save(out, x)
    return
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  if x.ndim == 2 and x.shape[1] == 2:
    fig, ax = plt.subplots(figsize=(4, 4))
    ax.scatter(x[:, 0], x[:, 1], s=2, alpha=0.6)
    ax.set_aspect("equal")
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return
  img = x.reshape((len(x),) + tuple(config.gen.sample_shape))[..., 0]
  if config.data.get("scale", "unit") == "symmetric":
    img = (img + 1) / 2
  n, (h, w) = len(img), img.shape[1:]
  cols = int(math.ceil(math.sqrt(n)))
  rows = int(math.ceil(n / cols))
  canvas = np.ones((rows * (h + 1) + 1, cols * (w + 1) + 1))
  for i in range(n):
    r, c = divmod(i, cols)
    canvas[1 + r * (h + 1):1 + r * (h + 1) + h, 1 + c * (w + 1):1 + c * (w + 1) + w] = img[i]
  plt.imsave(out, np.clip(canvas, 0, 1), cmap="gray_r", vmin=0, vmax=1)


ONE_CALL_TASKS = ("vae", "gan")
GENERATIVE_TASKS = ("flow_matching", "ddpm", *ONE_CALL_TASKS)


def check_request(workdir: str, num: int, out: str) -> None:
  """Refuses, with one line naming the option or path, what would fail only after loading the
  checkpoint and sampling: `--num` < 1, an `--out` folder that is missing or read-only, and a
  workdir that holds no run or a run that is not a flow_matching / ddpm / vae / gan one."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  if num < 1:
    raise ValueError(f"--num: must be >= 1, got {num}")
  folder = os.path.dirname(os.path.abspath(out))
  if not os.path.isdir(folder):
    raise ValueError(f"--out {out}: folder {folder} does not exist")
  if not os.access(folder, os.W_OK):
    raise ValueError(f"--out {out}: folder {folder} is not writable")
  config_json = os.path.join(workdir, "config.json")
  if not os.path.isfile(config_json):
    raise ValueError(f"{workdir}: no trained run here (no config.json)")
  try:
    task = json.loads(open(config_json, encoding="utf-8").read()).get("task")
  except (OSError, ValueError, AttributeError) as e:
    raise ValueError(f"{config_json}: unreadable ({type(e).__name__}: {e})") from None
  if task not in GENERATIVE_TASKS:
    raise ValueError(f"{workdir}: a {task!r} run has nothing to sample; `jaxdl sample` needs "
                     f"a {' or '.join(GENERATIVE_TASKS)} run")


def main(args) -> int:
  try:
    check_request(args.workdir, args.num, args.out)
    config, x = sample_run(args.workdir, sampler=args.sampler, steps=args.steps,
                           guidance=args.guidance, eta=args.eta, cls=args.cls, num=args.num,
                           seed=args.seed, ema=args.ema)
  except (ValueError, FileNotFoundError) as e:
    print(f"jaxdl: error: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2
  save_samples(config, x, args.out)
  print(f"wrote {args.num} samples to {args.out}")
  return 0
