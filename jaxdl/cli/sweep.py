"""`jaxdl sweep EXPERIMENT[:ARG] --grid KEY=V1,V2,... [--seeds N] [--jobs J] [--out DIR]`: run
every point of a grid over seeds, each run a `jaxdl train` subprocess in its own workdir under
DIR (`jaxdl.course.sweeps`); rerunning the command resumes it. `jaxdl sweep report DIR`: the
table of a metric per point (mean and 95% t interval over seeds), CSV / JSON, figures.

Exit codes: 0 every run finished (also after SIGTERM, which stops the runs cleanly: rerun to
resume), 1 some run failed (its error is in the table and in DIR/sweep.json), 2 bad input before
anything started (a bad grid, experiment or directory: one line), 130 stopped by SIGINT.
"""

from __future__ import annotations

import sys

from jaxdl import disk_errors

HELP = "run a grid of an experiment over seeds (resumable); `sweep report DIR`: its statistics"
_REPORT_ONLY = ("csv", "json", "figures", "mode")


def add_arguments(p) -> None:
  p.add_argument("experiment", metavar="EXPERIMENT[:ARG] | report",
                 help="the experiment to sweep (e.g. moons_mlp:smoke), or `report`")
  p.add_argument("dir", nargs="?", metavar="DIR", help="with `report`: the sweep directory")
  run = p.add_argument_group("running a sweep")
  run.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="a swept key and its values (repeatable; points are the product), e.g. "
                        "--grid optim.lr=1e-3,1e-2")
  run.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="runs per point, seeds s0..s0+N-1 from the config's seed (default 1)")
  run.add_argument("--seed-key", default="seed", help="the config key of the seed (default seed)")
  run.add_argument("--jobs", type=int, default=1, metavar="J",
                   help="runs at once, CPUs split between them and one GPU each (default 1)")
  run.add_argument("--out", metavar="DIR",
                   help="the sweep directory (default runs/<experiment>[-<arg>]-sweep)")
  run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key in every run (repeatable), e.g. --set train.steps=50")
  run.add_argument("--retry-failed", action="store_true",
                   help="rerun the runs that failed before (exit 1 or 2); by default skipped")
  rep = p.add_argument_group("sweep report DIR")
  rep.add_argument("--metric", default="eval/loss",
                   help="SPLIT/KEY of metrics.jsonl (default eval/loss)")
  rep.add_argument("--mode", choices=("min", "max"),
                   help="which is best (default max for accuracies, else min)")
  rep.add_argument("--csv", metavar="FILE", help="write the table as CSV")
  rep.add_argument("--json", metavar="FILE", help="write the table and every run as JSON")
  rep.add_argument("--figures", metavar="DIR",
                   help="where the figures go (default DIR/report; 'none' for none)")


def _error(line: str) -> int:
  print(f"jaxdl: error: {line}", file=sys.stderr)
  return 2


def _echo(line: str) -> None:
  print(line, file=sys.stderr, flush=True)


def main(args) -> int:
  if args.experiment == "report":
    if args.dir is None:
      return _error("sweep report: give the sweep directory (jaxdl sweep report DIR)")
    if args.grid or args.overrides:
      return _error("sweep report: --grid and --set belong to running a sweep")
    return _report(args)
  if args.dir is not None:
    return _error(f"sweep: unexpected argument {args.dir!r} (`jaxdl sweep report DIR` reports)")
  given = [f"--{k}" for k in _REPORT_ONLY if getattr(args, k) is not None]
  if given:
    return _error(f"sweep: {given[0]} belongs to `jaxdl sweep report DIR`")
  if args.jobs < 1:
    return _error(f"--jobs: expected a count >= 1, got {args.jobs}")
  from jaxdl.config import ConfigError, default_workdir, load_config
  from jaxdl.course.sweeps import grid, report, runner
  try:
    plan = grid.plan(args.experiment, args.grid, args.overrides, args.seeds, args.seed_key)
    out = args.out or default_workdir(args.experiment,
                                       load_config(args.experiment, args.overrides)[0]) + "-sweep"
  except ConfigError as e:
    return _error(str(e).splitlines()[0])
  problem = disk_errors.unwritable_dir(out, "--out")
  if problem:
    return _error(problem)
  try:
    index, ended = runner.run(out, plan, jobs=args.jobs, retry_failed=args.retry_failed,
                              echo=_echo)
  except ValueError as e:  # another sweep's directory, or one in use
    return _error(str(e).splitlines()[0])
  print(report.format_table(report.summarize(out)))
  if ended != "done":
    _echo(f"jaxdl: sweep stopped by {ended}; its runs saved their current step (rerun the same "
          f"command to resume)")
    return 130 if ended == "SIGINT" else 0
  failed = [r.name for r in plan.runs if index["runs"][r.name]["status"] == "failed"]
  return 1 if failed else 0


def _report(args) -> int:
  from jaxdl.config import ConfigError
  from jaxdl.course.sweeps import report
  try:
    table = report.summarize(args.dir, args.metric, args.mode)
  except (FileNotFoundError, ConfigError) as e:
    return _error(str(e).splitlines()[0])
  print(report.format_table(table))
  if args.csv:
    print(f"csv: {report.write_csv(table, args.csv)}")
  if args.json:
    print(f"json: {report.write_json(table, args.json)}")
  if args.figures != "none":
    import pathlib
    for path in report.plot_figures(table, args.figures or pathlib.Path(args.dir) / "report"):
      print(f"figure: {path}")
  return 0
