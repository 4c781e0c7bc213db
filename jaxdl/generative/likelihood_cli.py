"""`jaxdl likelihood WORKDIR`: the log-likelihood of a trained generative run on the first
`--num` examples of its evaluation split: exact through the probability-flow ODE for a flow or
diffusion run, the ELBO (a lower bound) for a VAE.

  jaxdl likelihood runs/fm_toy2d --num 256 --steps 100
  jaxdl likelihood runs/fm_digits_cfg --divergence hutchinson --probes 4
  jaxdl likelihood runs/vae_digits

Prints one JSON object: `kind` (exact or bound), `nats` (the mean log p(x), or ELBO, per
example), `bits_per_dim` (the mean of -log p(x) / (D ln 2)) and the settings used. A
class-conditional run reports log p(x | y) with each example's own label. `--divergence auto`
takes the exact trace up to 16 dimensions per example and Hutchinson's estimator (`--probes`
Rademacher probes) above. The computations are `likelihood.run_log_likelihood` and
`vae.run_elbo`; a GAN or any other run is refused in one line saying what it has instead.
"""

from __future__ import annotations

import json
import math
import pathlib
import sys

HELP = ("log-likelihood of a flow_matching / ddpm run (exact, probability-flow ODE) or a vae run "
        "(ELBO bound) on its eval split")
EXACT_MAX_DIMS = 16  # 'auto': the exact trace costs D JVPs per evaluation


def add_arguments(parser) -> None:
  parser.add_argument("workdir", help="the run's workdir (config.json + checkpoints/)")
  parser.add_argument("--num", type=int, default=256,
                      help="evaluation examples (the first NUM of the split; default 256)")
  parser.add_argument("--steps", type=int, default=None, help="RK4 steps (default 100)")
  parser.add_argument("--divergence", default=None, choices=("auto", "exact", "hutchinson"),
                      help=f"trace of dv/dx (default auto: exact up to {EXACT_MAX_DIMS} dims)")
  parser.add_argument("--probes", type=int, default=None, help="Hutchinson probes (default 1)")
  parser.add_argument("--batch-size", type=int, default=256,
                      help="examples per ODE solve (bounds memory; default 256)")
  parser.add_argument("--seed", type=int, default=0, help="seed of the Hutchinson probes")
  parser.add_argument("--no-ema", dest="ema", action="store_false",
                      help="use the last parameters rather than the run's average")


def check_request(workdir, num: int, batch_size: int = 1, **ode_options) -> None:
  """Refuses, before anything is loaded, counts below 1, a workdir that holds no run or a run
  without a likelihood (a GAN, a classifier), and ODE options (`steps`, `divergence`, `probes`:
  None when not given) for a VAE, whose bound takes none; one line naming the option or run."""
  from jaxdl.generative import likelihood  # pylint: disable=g-import-not-at-top
  counts = {"--num": num, "--batch-size": batch_size, "--steps": ode_options.get("steps"),
            "--probes": ode_options.get("probes")}
  for flag, value in counts.items():
    if value is not None and value < 1:
      raise ValueError(f"{flag}: must be >= 1, got {value}")
  config_json = pathlib.Path(workdir) / "config.json"
  if not config_json.is_file():
    raise ValueError(f"{workdir}: no trained run here (no config.json)")
  try:
    task = json.loads(config_json.read_text(encoding="utf-8")).get("task")
  except (OSError, ValueError, AttributeError) as e:
    raise ValueError(f"{config_json}: unreadable ({type(e).__name__}: {e})") from None
  if task == "vae":  # its bound, one decoder pass: no ODE
    given = [name for name, value in ode_options.items() if value is not None]
    if given:
      raise ValueError(f"--{given[0]}: a 'vae' run's likelihood is its ELBO bound, which takes "
                       f"no --{given[0]} (an option of flow_matching / ddpm runs)")
    return
  try:
    likelihood.check_task(task)
  except ValueError as e:
    raise ValueError(f"{workdir}: {e}") from None


def eval_examples(config, num: int) -> dict:
  """The first `num` examples of the run's evaluation split ('x', and 'y' where it has labels);
  fewer when the split is smaller."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jaxdl import data as jdata  # pylint: disable=g-import-not-at-top
  parts, have = [], 0
  for batch in jdata.make_dataset(config).eval_batches(batch_size=min(num, 512)):
    keep = np.asarray(batch["mask"]) > 0  # the last batch is padded to the batch size
    parts.append({k: np.asarray(v)[keep] for k, v in batch.items() if k in ("x", "y")})
    have += int(keep.sum())
    if have >= num:
      break
  if not have:
    raise ValueError(f"data: the run's evaluation split ({config.data.name}) is empty")
  return {k: np.concatenate([p[k] for p in parts])[:num] for k in parts[0]}


def run_likelihood(workdir, *, num: int = 256, steps: int | None = None,
                   divergence: str | None = None, probes: int | None = None, seed: int = 0,
                   ema: bool = True, batch_size: int = 256) -> dict:
  """What `jaxdl likelihood` prints, as a dict. The examples are solved `batch_size` at a time
  (one compiled solve; the result does not depend on the batch size)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jaxdl.generative import likelihood, vae  # pylint: disable=g-import-not-at-top
  from jaxdl.train import load_run  # pylint: disable=g-import-not-at-top
  config, model, variables, step = load_run(workdir, ema=ema)
  examples = eval_examples(config, num)
  x = examples["x"]
  dims = math.prod(x.shape[1:])
  head = {"workdir": str(workdir), "step": int(step), "task": config.task, "num": len(x),
          "dims": dims}
  if config.task == "vae":
    bound = vae.run_elbo(config, model, variables, x, batch_size=batch_size)
    return {**head, "kind": "bound (-ELBO, one z per example)", "nats": bound["elbo"],
            "bits_per_dim": bound["bpd"]}
  steps, probes = steps or 100, probes or 1
  if divergence in (None, "auto"):
    divergence = "exact" if dims <= EXACT_MAX_DIMS else "hutchinson"
  y = examples.get("y") if config.gen.get("num_classes", 0) else None
  out = likelihood.run_log_likelihood(config, model, variables, x, steps=steps,
                                      divergence=divergence, probes=probes,
                                      rng=jax.random.PRNGKey(seed), y=y, batch_size=batch_size)
  return {**head, "kind": "exact (probability-flow ODE)", "conditional": y is not None,
          "nats": float(np.mean(np.asarray(out["logp"]))),
          "bits_per_dim": float(np.mean(np.asarray(out["bpd"]))), "steps": steps,
          "divergence": divergence, "probes": probes if divergence == "hutchinson" else None}


def main(args) -> int:
  try:
    check_request(args.workdir, args.num, args.batch_size, steps=args.steps,
                  divergence=args.divergence, probes=args.probes)
    result = run_likelihood(args.workdir, num=args.num, steps=args.steps,
                            divergence=args.divergence, probes=args.probes, seed=args.seed,
                            ema=args.ema, batch_size=args.batch_size)
  except (ValueError, FileNotFoundError) as e:
    print(f"jaxdl: error: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2
  print(json.dumps(result, indent=2))
  return 0
