"""`jaxdl sample WORKDIR`: draw samples from a trained generative run's latest checkpoint.

  jaxdl sample runs/fm_digits_cfg --sampler heun --steps 50 --guidance 2.0 --class 3 --num 64 \
      --out grid.png

Unset options take the run's `config.gen.*` values. The output is a PNG (an image grid for image
data, a scatter plot for 2-D data) or, for a name ending in .npy, the raw samples. The sampling
itself is `jaxdl.generative.trained.sample_run`.
"""

from __future__ import annotations

import json
import os
import sys

HELP = "sample from a trained flow_matching / ddpm / vae / gan run"


def add_arguments(parser) -> None:
  parser.add_argument("workdir", help="the run's workdir (config.json + checkpoints/)")
  parser.add_argument("--sampler", default=None,
                      help="ddpm | ddim | euler | heun | edm_heun | dpmpp_2m | dpmpp_3m "
                           "(default: the run's)")
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


def check_request(workdir: str, num: int, out: str) -> None:
  """Refuses, with one line naming the option or path, what would fail only after loading the
  checkpoint and sampling: `--num` < 1, an `--out` folder that is missing or read-only, and a
  workdir that holds no run or a run that is not a flow_matching / ddpm / vae / gan one."""
  from jaxdl.generative.trained import GENERATIVE_TASKS
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
  from jaxdl.generative import trained
  try:
    check_request(args.workdir, args.num, args.out)
    config, x = trained.sample_run(args.workdir, sampler=args.sampler, steps=args.steps,
                                   guidance=args.guidance, eta=args.eta, cls=args.cls,
                                   num=args.num, seed=args.seed, ema=args.ema)
  except (ValueError, FileNotFoundError) as e:
    print(f"jaxdl: error: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2
  trained.save_samples(config, x, args.out)
  print(f"wrote {args.num} samples to {args.out}")
  return 0
