"""`jaxdl nfe WORKDIR --steps 4,8,16,32,64`: sample quality against network calls.

  jaxdl nfe runs/fm_digits_cfg --steps 4,8,16,32,64 [--samplers ddim,euler] [--out DIR]

measures, for every applicable sampler of a class-conditional digits run and each step count,
the Frechet distance and the confident fraction of `--per-class` samples of each class under the
run's guidance (`jaxdl.course.sampler_table`, `jaxdl.generative.nfe_sweep`): prints the table
and writes nfe_sweep.json and nfe_sweep.png into DIR (default: the workdir). The judge is
`--judge` (a digits classification run's workdir), else <workdir>/classifier, trained there if
missing.
"""

from __future__ import annotations

import os

HELP = "quality against network calls of every sampler on a class-conditional digits run"


def add_arguments(parser) -> None:
  parser.add_argument("workdir", help="the run's workdir (config.json + checkpoints/)")
  parser.add_argument("--steps", required=True, metavar="N,N,...",
                      help="step counts to sweep, e.g. 4,8,16,32,64: judge every sampler at each")
  parser.add_argument("--samplers", default=None, metavar="NAME,NAME,...",
                      help="samplers to sweep (default ddpm,ddim,euler,heun,dpmpp_2m,edm_heun)")
  parser.add_argument("--per-class", type=int, default=100, help="samples per class")
  parser.add_argument("--judge", default=None,
                      help="a digits classification run's workdir (default <workdir>/classifier, "
                           "trained there if missing)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=None, help="folder for nfe_sweep.json and .png "
                                                  "(default: the workdir)")
  parser.add_argument("--no-ema", dest="ema", action="store_false",
                      help="sample with the last parameters even if the run kept an average")


def parse_steps(text: str) -> list[int]:
  """The step counts of `--steps 4,8,16`, refused in one line unless integers."""
  from jaxdl.schema import ConfigError
  try:
    return [int(n) for n in text.split(",") if n.strip()]
  except ValueError:
    raise ConfigError(f"--steps {text}: expected integers like 4,8,16") from None


def main(args) -> None:
  from jaxdl.course import sampler_table
  from jaxdl.generative import nfe_sweep
  from jaxdl.schema import ConfigError
  out_dir = args.out or args.workdir
  steps = parse_steps(args.steps)
  names = ([n.strip() for n in args.samplers.split(",") if n.strip()] if args.samplers
           else nfe_sweep.DEFAULT_SAMPLERS)
  if not os.path.isdir(out_dir):
    raise ConfigError(f"--out {out_dir}: not a folder")
  if not os.access(out_dir, os.W_OK):
    raise ConfigError(f"--out {out_dir}: folder is not writable")
  try:
    table = sampler_table.sampler_table(
        args.workdir, steps, samplers=names, judge=args.judge, per_class=args.per_class,
        seed=args.seed, ema=args.ema, out_dir=out_dir)
  except ConfigError:
    raise
  except (ValueError, FileNotFoundError) as e:
    raise ConfigError(str(e).splitlines()[0]) from None
  print(nfe_sweep.markdown(table))
  print(f"wrote {os.path.join(out_dir, 'nfe_sweep.json')} and nfe_sweep.png")
