"""`jaxdl plot WORKDIR...`: overlay runs' loss curves against the step and the training time,
or `--profile` draw one run's profiler trace; the figures are `jaxdl.train.plots`'."""

from __future__ import annotations

import pathlib

HELP = "plot runs' loss curves over each other, against the step and the training time"


def add_arguments(parser) -> None:
  parser.add_argument("workdirs", nargs="+", metavar="WORKDIR", help="run directories")
  parser.add_argument("--out", default=None,
                      help="the figure (default runs.png, or profile.png with --profile)")
  parser.add_argument("--profile", action="store_true",
                      help="draw WORKDIR's profiler trace (train.profile_steps / --profile)")


def main(args) -> None:
  from jaxdl.schema import ConfigError
  from jaxdl.train.plots import plot_profile, plot_runs
  from jaxdl.train.writers import read_metrics
  out = pathlib.Path(args.out or ("profile.png" if args.profile else "runs.png"))
  if not out.parent.is_dir():
    raise ConfigError(f"--out: folder {out.parent} does not exist")
  if args.profile:
    if len(args.workdirs) != 1:
      raise ConfigError("--profile draws one run's trace; give one WORKDIR")
    print(plot_profile(args.workdirs[0], out))
    return
  missing = [w for w in args.workdirs if not read_metrics(w, "train")]
  if missing:
    raise ConfigError(f"{missing[0]}: no train records in metrics.jsonl (not a run "
                      f"directory, or nothing logged yet)")
  print(plot_runs(args.workdirs, out))
