"""`jaxdl likelihood WORKDIR`: the log-likelihood of a trained generative run on the first
`--num` examples of its evaluation split: exact through the probability-flow ODE for a flow or
diffusion run, the ELBO (a lower bound) for a VAE.

  jaxdl likelihood runs/fm_toy2d --num 256 --steps 100
  jaxdl likelihood runs/fm_digits_cfg --divergence hutchinson --probes 4
  jaxdl likelihood runs/vae_digits

Prints one JSON object: `kind` (exact or bound), `nats` (the mean log p(x), or ELBO, per
example), `bits_per_dim` (the mean of -log p(x) / (D ln 2)) and the settings used. A
class-conditional run reports log p(x | y) with each example's own label. `--divergence auto`
takes the exact trace up to 16 dimensions per example (`trained.EXACT_MAX_DIMS`) and
Hutchinson's estimator (`--probes` Rademacher probes) above. The computation is
`jaxdl.generative.trained.run_likelihood`; a GAN or any other run is refused in one line saying
what it has instead.
"""

from __future__ import annotations

import json
import pathlib

HELP = ("log-likelihood of a flow_matching / ddpm run (exact, probability-flow ODE) or a vae run "
        "(ELBO bound) on its eval split")


def add_arguments(parser) -> None:
  parser.add_argument("workdir", help="the run's workdir (config.json + checkpoints/)")
  parser.add_argument("--num", type=int, default=256,
                      help="evaluation examples (the first NUM of the split; default 256)")
  parser.add_argument("--steps", type=int, default=None, help="RK4 steps (default 100)")
  parser.add_argument("--divergence", default=None, choices=("auto", "exact", "hutchinson"),
                      help="trace of dv/dx (default auto: exact up to 16 dims)")
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
  from jaxdl.generative import likelihood
  from jaxdl.train.tasks import kind_of
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
  if kind_of(task).likelihood == "elbo":  # a VAE's bound, one decoder pass: no ODE
    given = [name for name, value in ode_options.items() if value is not None]
    if given:
      raise ValueError(f"--{given[0]}: a 'vae' run's likelihood is its ELBO bound, which takes "
                       f"no --{given[0]} (an option of flow_matching / ddpm runs)")
    return
  try:
    likelihood.check_task(task)
  except ValueError as e:
    raise ValueError(f"{workdir}: {e}") from None


def main(args) -> None:
  from jaxdl.generative import trained
  check_request(args.workdir, args.num, args.batch_size, steps=args.steps,
                divergence=args.divergence, probes=args.probes)
  result = trained.run_likelihood(args.workdir, num=args.num, steps=args.steps,
                                  divergence=args.divergence, probes=args.probes,
                                  seed=args.seed, ema=args.ema, batch_size=args.batch_size)
  print(json.dumps(result, indent=2))
