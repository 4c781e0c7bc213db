"""`jaxdl sweep EXPERIMENT[:ARG] --grid KEY=V1,V2,... [--seeds N] [--jobs J] [--out DIR]`: run
every point of a grid over seeds, each run a `jaxdl train` subprocess in its own workdir under
DIR (`jaxdl.sweep`); rerunning the command resumes it. `jaxdl sweep report DIR`: the
table of a metric per point (mean and 95% t interval over seeds), CSV / JSON, figures.

`jaxdl sweep EXPERIMENT[:ARG] --search random|tpe[:STARTUP] --space KEY=DIST ... --trials N
[--metric SPLIT/KEY] [--mode min|max] [--prune none|median[:STARTUP[:WARMUP]]|percentile:P[:...]]
[--sampler-seed S]`: a hyper-parameter search through Optuna (needs the `sweep` extra), one run
per trial, its study in DIR/study.log (default DIR runs/<experiment>[-<arg>]-search); rerunning
the command resumes it, and a larger --trials extends it. DIST is uniform:LOW:HIGH,
loguniform:LOW:HIGH, int:LOW:HIGH, logint:LOW:HIGH or choice:V1,V2,...
(`jaxdl.sweep.space`; running and pruning: `jaxdl.sweep.search`).

`jaxdl sweep ... --executor slurm [--partition P] [--time T] [--gpus-per-run G] [--cpus-per-run
C] [--account A] [--nodes N] [--tasks-per-run K] [--sbatch KEY=VALUE ...] [--executor-config
FILE] [--no-wait]`: the grid's runs as a SLURM job array through submitit (needs the `slurm`
extra), each the same `jaxdl train` in its workdir; a run of several processes is started by
`srun` with `--distributed`. It waits for the jobs unless --no-wait; rerunning the command waits
for the queued ones and submits again the cancelled or unfinished ones, which resume
(`jaxdl.sweep.slurm`; a one-node cluster for trying it: scripts/slurm_cluster.sh).

Exit codes, for each way a run can end (`jaxdl.sweep.scheduler`):
  0    every run finished (a search: every trial ended, complete, pruned or failed, and one or
       more finished); also after SIGTERM to the sweep, which stops each run once, cleanly
       (rerun to resume); with --executor slurm also once --no-wait submitted the runs;
  1    a run failed (exit 1 or 2 of its own: the table and DIR/sweep.json hold its error), or a
       run was left unfinished: stopped by a signal from elsewhere (a SLURM job cancelled, timed
       out or preempted), or vanished (killed by SIGKILL, e.g. the OOM killer) twice, being
       started again once at once; one line names them; a rerun resumes the unfinished ones
       (a search: also when no trial finished);
  2    bad input before anything started (a bad grid, space, flag, count, experiment or
       directory, a missing sbatch: one line, nothing written);
  130  stopped by SIGINT (its runs stopped cleanly; rerun to resume).
A run that ended by a signal is never `failed`: a rerun resumes it.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

from jaxdl import disk_errors, stop_signals
from jaxdl.stop_signals import Stopped

HELP = "run a grid of an experiment over seeds (resumable); `sweep report DIR`: its statistics"
_REPORT_ONLY = ("csv", "json", "figures")
_SEARCH_ONLY = ("space", "trials", "prune", "sampler_seed")
_SLURM_ONLY = ("partition", "time", "gpus_per_run", "cpus_per_run", "account", "nodes",
               "tasks_per_run", "sbatch", "executor_config", "no_wait")


def add_arguments(p) -> None:
  p.add_argument("experiment", metavar="EXPERIMENT[:ARG] | report",
                 help="the experiment to sweep (e.g. moons_mlp:smoke), or `report`")
  p.add_argument("dir", nargs="?", metavar="DIR", help="with `report`: the sweep directory")
  run = p.add_argument_group("running a sweep")
  run.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="a swept key and its values (repeatable; points are the product), e.g. "
                        "--grid optim.lr=1e-3,1e-2")
  run.add_argument("--seeds", type=int, metavar="N",
                   help="runs per point, seeds s0..s0+N-1 from the config's seed (default 1)")
  run.add_argument("--seed-key", default="seed", help="the config key of the seed (default seed)")
  run.add_argument("--jobs", type=int, metavar="J",
                   help="runs at once, CPUs split between them and one GPU each (default 1); "
                        "with --executor slurm the array's limit (default all)")
  run.add_argument("--out", metavar="DIR",
                   help="the sweep directory (default runs/<experiment>[-<arg>]-sweep)")
  run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key in every run (repeatable), e.g. --set train.steps=50")
  run.add_argument("--retry-failed", action="store_true",
                   help="rerun the runs that failed before (exit 1 or 2); by default skipped")
  slurm = p.add_argument_group(
      "on a SLURM cluster (--executor slurm; a grid)",
      "Counts are per run: a run's GPUs are split evenly over its nodes, its CPUs over its "
      "processes. --executor-config FILE: a JSON (or YAML) object of these flags' names, e.g. "
      '{"partition": "gpu", "time": "4:00:00", "sbatch": {"qos": "high"}}; flags override it.')
  slurm.add_argument("--executor", choices=("local", "slurm"), default="local",
                     help="where the runs go: this machine (default) or SLURM through submitit")
  slurm.add_argument("--partition", help="sbatch --partition (default the cluster's)")
  slurm.add_argument("--time", metavar="MINUTES|[D-]HH:MM:SS",
                     help="each run's time limit (default the partition's); SIGTERM 90 s before "
                          "it saves the run, and a rerun resumes it")
  slurm.add_argument("--gpus-per-run", type=int, metavar="G", help="GPUs of one run")
  slurm.add_argument("--cpus-per-run", type=int, metavar="C", help="CPUs of one run")
  slurm.add_argument("--account", help="sbatch --account")
  slurm.add_argument("--nodes", type=int, metavar="N", help="nodes of one run (default 1)")
  slurm.add_argument("--tasks-per-run", type=int, metavar="K",
                     help="processes of one run (default one per node); more than one: "
                          "started by srun, `jaxdl train --distributed`")
  slurm.add_argument("--sbatch", action="append", metavar="KEY=VALUE",
                     help="another sbatch option (repeatable), e.g. --sbatch qos=high, "
                          "--sbatch exclusive")
  slurm.add_argument("--executor-config", metavar="FILE",
                     help="the flags above from a file (the flags given override it)")
  slurm.add_argument("--no-wait", action="store_true",
                     help="submit and return; rerun the same command to wait and collect")
  find = p.add_argument_group(
      "searching (Optuna; instead of --grid)",
      "DIST: uniform:LOW:HIGH | loguniform:LOW:HIGH | int:LOW:HIGH | logint:LOW:HIGH | "
      "choice:V1,V2,... A rerun of the same command resumes the study in DIR/study.log.")
  find.add_argument("--search", metavar="random|tpe[:STARTUP]",
                    help="the sampler: random, or TPE after STARTUP random trials (default 5)")
  find.add_argument("--space", action="append", default=[], metavar="KEY=DIST",
                    help="a searched key and its distribution (repeatable), e.g. "
                         "--space optim.lr=loguniform:1e-4:1e-1")
  find.add_argument("--trials", type=int, metavar="N",
                    help="trials in the study (a rerun with a larger N adds trials)")
  find.add_argument("--prune", metavar="none|median[:STARTUP[:WARMUP]]|percentile:P[:...]",
                    help="stop a trial worse than the median (or P-th percentile) of the "
                         "finished trials at the same step, once STARTUP trials (default 3) "
                         "finished, from step WARMUP (default 0) on; default none")
  find.add_argument("--sampler-seed", type=int, metavar="S",
                    help="the sampler's seed (default 0; trial k's draws are seeded by (S, k)); "
                         "the runs keep the config's seed")
  rep = p.add_argument_group("a search, and sweep report DIR")
  rep.add_argument("--metric", metavar="SPLIT/KEY",
                   help="a key of the runs' metrics.jsonl records, e.g. eval/accuracy (default "
                        "a search's: eval/loss when the config evaluates during training, else "
                        "train/loss)")
  rep.add_argument("--mode", metavar="min|max",
                   help="which is best (default max for accuracies, else min)")
  rep.add_argument("--csv", metavar="FILE", help="write the table as CSV")
  rep.add_argument("--json", metavar="FILE", help="write the table and every run as JSON")
  rep.add_argument("--figures", metavar="DIR",
                   help="where the figures go (default DIR/report; 'none' for none)")


def _echo(line: str) -> None:
  print(line, file=sys.stderr, flush=True)



def _base(args):
  """The swept experiment's config without overrides: the sweep applies the shared `--set` and
  each point's values to copies of it (`jaxdl.config.with_overrides`)."""
  from jaxdl.config import load_config
  return load_config(args.experiment)[0]

def main(args) -> None:
  """The command; it raises what ends it (`jaxdl.cli.main` gives the exit code): ConfigError,
  bad input (2); RunError, runs failed or left unfinished (1); Stopped, a stop signal (0, 130)."""
  from jaxdl.schema import ConfigError
  # As `jaxdl train` does: an experiment may name the planted-bug and generative models and
  # tasks, which the grid's and the search's checks build.
  import jaxdl.course.planted  # noqa: F401
  import jaxdl.generative  # noqa: F401
  if args.experiment == "report":
    if args.dir is None:
      raise ConfigError("sweep report: give the sweep directory (jaxdl sweep report DIR)")
    if args.grid or args.overrides:
      raise ConfigError("sweep report: --grid and --set belong to running a sweep")
    given = _slurm_flags(args) + (["--executor"] if args.executor != "local" else [])
    if given:
      raise ConfigError(f"sweep report: {given[0]} belongs to running a sweep")
    given = [f"--{k.replace('_', '-')}" for k in ("search", *_SEARCH_ONLY) if getattr(args, k)]
    if given:
      raise ConfigError(f"sweep report: {given[0]} belongs to running a search")
    if args.mode not in (None, "min", "max"):
      raise ConfigError(f"--mode {args.mode!r}: expected min or max")
    return _report(args)
  if args.dir is not None:
    raise ConfigError(f"sweep: unexpected argument {args.dir!r} (`jaxdl sweep report DIR` "
                      f"reports)")
  given = [f"--{k}" for k in _REPORT_ONLY if getattr(args, k) is not None]
  if given:
    raise ConfigError(f"sweep: {given[0]} belongs to `jaxdl sweep report DIR`")
  for flag, count in (("--jobs", args.jobs), ("--seeds", args.seeds), ("--trials", args.trials)):
    if count is not None and count < 1:
      raise ConfigError(f"{flag}: expected a count >= 1, got {count}")
  given = _slurm_flags(args)
  if given and args.executor != "slurm":
    raise ConfigError(f"sweep: {given[0]} belongs to --executor slurm")
  if args.search is not None:
    if args.executor == "slurm":
      raise ConfigError("sweep: --executor slurm runs a grid; a search runs on this machine "
                        "(--executor local)")
    return _search(args)
  given = [f"--{k.replace('_', '-')}" for k in (*_SEARCH_ONLY, "metric", "mode")
           if getattr(args, k) not in (None, [])]
  if given:
    raise ConfigError(f"sweep: {given[0]} belongs to a search (--search random|tpe)")
  from jaxdl.sweep import grid, runner, scheduler

  def run(out):
    plan = grid.plan(args.experiment, _base(args), args.grid, args.overrides, args.seeds or 1,
                     args.seed_key)
    if args.executor == "slurm":
      from jaxdl.sweep import resources, slurm
      res = resources.parse({k: getattr(args, k) for k in resources.FIELDS},
                            args.executor_config)
      slurm.check_cluster(res.partition)
      return plan, lambda: slurm.run(out, plan, res, jobs=args.jobs,
                                     retry_failed=args.retry_failed, wait=not args.no_wait,
                                     echo=_echo)
    return plan, lambda: runner.run(out, plan, jobs=args.jobs or 1,
                                    retry_failed=args.retry_failed, echo=_echo)

  def judge(plan, index):
    names = [r.name for r in plan.runs]
    failed = [n for n in names if index["runs"][n]["status"] == "failed"]
    return _name_runs(failed, "failed") or _name_runs(
        scheduler.unfinished(index, names), "left unfinished (rerun the same command to resume)")

  if args.executor == "slurm":
    def hint(ended):
      del ended
      return ("its SLURM jobs keep running (rerun the same command to wait for them; scancel "
              "stops them)")
  else:
    def hint(ended):
      del ended
      return "the runs it started saved their current step (rerun the same command to resume)"
  return _launch(args, "-sweep", run, judge, "sweep", hint)


def _search(args) -> None:
  """`jaxdl sweep EXPERIMENT --search ...`: every flag checked, then the study run."""
  from jaxdl.schema import ConfigError
  for bad, why in ((args.grid, "--grid and --search exclude each other (a search samples "
                               "--space)"),
                   (args.seeds is not None, "--seeds does not apply to a search (one run per "
                                            "trial, at the config's seed)"),
                   (args.retry_failed, "--retry-failed does not apply to a search (a failed "
                                       "trial is final in its study)")):
    if bad:
      raise ConfigError(f"sweep: {why}")
  from jaxdl.sweep import index, scheduler, search, space

  def run(out):
    plan = space.plan(args.experiment, _base(args), args.space, search=args.search,
                      trials=args.trials,
                      shared=args.overrides, seed_key=args.seed_key,
                      sampler_seed=args.sampler_seed or 0, metric=args.metric, mode=args.mode,
                      prune=args.prune or "none")
    space.import_optuna()
    return plan, lambda: search.run(out, plan, args.trials, jobs=args.jobs or 1, echo=_echo)

  def judge(plan, idx):
    if not any(r["status"] == index.FINISHED for r in idx["runs"].values()):
      return "no trial finished (the errors are in the table and in sweep.json)"
    return _name_runs(scheduler.unfinished(idx, idx["runs"]),
                      "left unfinished (rerun the same command to resume)")

  return _launch(args, "-search", run, judge, "search", lambda ended: "its running trials "
                 "saved their current step (rerun the same command to resume them)")


def _launch(args, suffix, prepare, judge, what, resume_hint) -> None:
  """The grid's and the search's common course: `prepare(out) -> (plan, start)` checks every
  flag (ConfigError: one line, exit 2), the output folder is checked before anything starts,
  `start()` runs it (a ValueError: another sweep's folder or one in use), then the table. After
  a stop signal: `Stopped` (exit 130 after SIGINT, 0 after SIGTERM; what to do next:
  `resume_hint(ended)`); nothing once --no-wait submitted the runs. Else `judge(plan, index)`
  names what broke the promise of exit 0 (runs failed or left unfinished), raised as a RunError
  (exit 1)."""
  from jaxdl.config import ConfigError, default_workdir, load_config
  from jaxdl.sweep import report
  out = args.out or default_workdir(args.experiment,
                                     load_config(args.experiment, args.overrides)[0]) + suffix
  plan, start = prepare(out)
  problem = disk_errors.unwritable_dir(out, "--out")
  if problem:
    raise ConfigError(problem)
  stop_signals.reached("config")
  if args.preempt.requested:  # while the experiment loaded: nothing started or written yet
    raise Stopped(args.preempt.requested, f"{what} stopped by {args.preempt.requested} before "
                                          "it started; nothing written")
  existed = os.path.exists(out)
  index, ended = start()
  if (ended not in ("done", "submitted") and not existed
      and getattr(args, "executor", None) != "slurm" and not _worth_keeping(out)):
    # Stopped before any run saved a step (a run stopped while it starts writes nothing) or
    # reported an error: the folder this invocation made holds nothing, so nothing is left.
    shutil.rmtree(out, ignore_errors=True)
    raise Stopped(ended, f"{what} stopped by {ended} before any run saved a step; nothing "
                         "written")
  print(report.format_table(report.summarize(out)))
  if ended == "submitted":  # --no-wait: the jobs are queued; a rerun waits for them
    return
  if ended != "done":
    raise Stopped(ended, f"{what} stopped by {ended}; {resume_hint(ended)}")
  problem = judge(plan, index)
  if problem:
    from jaxdl.train import RunError
    raise RunError(f"{what} {out}: {problem}")


def _worth_keeping(out: str) -> bool:
  """Whether a run of the sweep folder `out` saved a checkpoint or left a traceback in its log."""
  return (any(pathlib.Path(out, "runs").glob("*/checkpoints/*"))
          or any("Traceback" in log.read_text(errors="replace")
                 for log in pathlib.Path(out, "logs").glob("*.log")))


def _name_runs(names: list[str], how: str) -> str | None:
  """'N run(s) HOW: a, b, ...' (five names at most), or None for none."""
  if not names:
    return None
  more = f" and {len(names) - 5} more" if len(names) > 5 else ""
  return f"{len(names)} run{'s' * (len(names) != 1)} {how}: {', '.join(names[:5])}{more}"


def _slurm_flags(args) -> list[str]:
  """The --executor slurm flags given, as flags."""
  return [f"--{k.replace('_', '-')}" for k in _SLURM_ONLY if getattr(args, k) not in (None, False)]


def _report(args) -> None:
  from jaxdl.sweep import report
  table = report.summarize(args.dir, args.metric, args.mode)  # no sweep.json: FileNotFoundError
  print(report.format_table(table))
  if args.csv:
    print(f"csv: {report.write_csv(table, args.csv)}")
  if args.json:
    print(f"json: {report.write_json(table, args.json)}")
  if args.figures != "none":
    import pathlib
    for path in report.plot_figures(table, args.figures or pathlib.Path(args.dir) / "report"):
      print(f"figure: {path}")
