"""Running a search (`jaxdl sweep --search`): an Optuna study whose trials are `jaxdl train` runs.

The sweep directory holds, beside what a grid's holds (`jaxdl.sweep`),

  study.log    the Optuna study, in Optuna's journal storage (an append-only file: a kill never
               tears it; no database server or SQLAlchemy needed);
  sweep.json   `search`, the settings a rerun must match, and one run per trial, `trial-NNN`,
               its sampled values canonical (`values`), its status one of a grid run's or
               `pruned` (and then `pruned_at`, the step its pruner stopped it at: the report's
             curves and values end there, though the run went on to save a later step).

A trial: the study is asked for one (its sampler seeded per trial, `space.seed_sampler`), every
searched key suggested, the combination's config checked in-process (one the engine refuses is a
failed trial, no run started), then `jaxdl train` runs in `runs/trial-NNN`, J at a time, through
the one scheduler a grid uses (`scheduler`: slots, logs, signals, how a run ended); the study is
its `Source`. While it runs its metrics.jsonl is read
as it grows: each record of the metric's split is reported to the trial at its step, once per
step, in file order (non-finite values are not: the run fails on them itself), and when the
pruner says so the run is stopped with SIGTERM (it saves its step and exits 0) and the trial is
pruned. Records read only after the run ended are judged the same way, so whether a trial is
pruned does not depend on how soon the sweep read them (such a trial is pruned though its run
completed); the run's last step (`train.steps`) is never judged.

How a trial ends:
  complete  the run finished (summary.json) with a finite final metric, summary.json's value,
            which the study gets;
  pruned    stopped by the pruner; its workdir (checkpoint included) stays, but no rerun
            resumes it: the study holds it as pruned;
  failed    exit 1 (a non-finite loss: Optuna's convention for a NaN objective is a failed
            trial, which its samplers leave out), exit 2 (bad input), a refused combination, or
            no finite final metric; the error is in sweep.json and the report.
A trial whose run was stopped (the sweep got SIGTERM or SIGINT, or was killed) stays running in
the study. A rerun with the same experiment, `--set`, `--space`, `--search`, `--sampler-seed`,
`--metric` and `--mode` (`--trials`, `--prune`, `--jobs` may change) keeps the ended trials,
resumes each running one from its workdir with its values (bit-exact, as `jaxdl train` resumes;
never resampled) and asks for new trials until the study holds `--trials`.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import pathlib

from jaxdl.config import ConfigError, with_overrides
from jaxdl.sweep import grid, report, runner, scheduler, space
from jaxdl.sweep import index as jindex
from jaxdl.sweep.slots import Slot, make_slots
from jaxdl.sweep.space import Search


def run_name(number: int) -> str:
  return f"trial-{number:03d}"


@dataclasses.dataclass
class _Trial:
  """A trial this invocation drives: its optuna Trial, how far its metrics were read, its run."""
  name: str
  trial: object
  reported: set
  offset: int = 0
  partial: bytes = b""
  pruned_at: tuple | None = None     # (step, value) the pruner stopped it at
  run: scheduler.Active | None = None


class _Driver:
  """One invocation's study, index and trials (`run`)."""

  def __init__(self, optuna, sweep_dir, search, study, index, echo):
    self.optuna, self.dir, self.search, self.study = optuna, sweep_dir, search, study
    self.index, self.echo = index, echo
    self.plan = grid.Plan(search.experiment, search.shared, {}, search.seed_key, (search.seed,),
                          ())
    self.resume: collections.deque = collections.deque()  # stopped trials to resume
    self.total = 0  # the trials the study is to hold
    self.trials: dict[str, _Trial] = {}  # the running ones, by run name
    self.exhausted = False

  def track(self, frozen) -> _Trial:
    return _Trial(run_name(frozen.number), self.optuna.trial.Trial(self.study, frozen._trial_id),
                  set(frozen.intermediate_values))

  def prepare(self, t: _Trial) -> bool:
    """Suggests `t`'s values (a stored value comes back as it was) and records its run; False
    when the config refuses the combination (the trial is then failed)."""
    space.seed_sampler(self.optuna, self.study, self.search, t.trial.number)
    texts = {k: space.suggest(t.trial, k, d) for k, d in self.search.space.items()}
    overrides = [f"{k}={v}" for k, v in texts.items()]
    record = {"point": t.name, "trial": t.trial.number, "seed": self.search.seed,
              "values": texts,
              "overrides": [*overrides, f"{self.search.seed_key}={self.search.seed}"],
              "workdir": f"runs/{t.name}", "log": f"logs/{t.name}.log", "status": jindex.PENDING,
              "returncode": None, "error": None, "attempts": 0, "seconds": 0.0, "git": None}
    self.index["runs"][t.name] = record
    try:
      config = with_overrides(self.search.base, overrides)
      record["values"] = {k: grid.value_text(grid._lookup(config, k)) for k in texts}
      grid.check_config(config)
    except ConfigError as e:
      self.conclude(t, jindex.FAILED, str(e).splitlines()[0], None)
      return False
    jindex.write(self.dir, self.index)
    return True

  # --- the scheduler's `Source` ---

  def take(self) -> str | None:
    if self.exhausted:
      return None
    t = self.next_trial(self.resume, self.total)
    if t is None:
      self.exhausted = not self.resume  # resume: a stopped run's workdir still held; wait
      return None
    self.trials[t.name] = t
    return t.name

  def done(self) -> bool:
    return self.exhausted

  def started(self, run: scheduler.Active) -> None:
    self.trials[run.name].run = run
    values = ",".join(f"{k}={v}" for k, v in self.index["runs"][run.name]["values"].items())
    self.echo(f"  start    {run.name} {values}")

  def watch(self, run: scheduler.Active) -> bool:
    t = self.trials[run.name]
    return t.pruned_at is None and self.judge(t)

  def retry(self, name: str) -> None:
    self.resume.appendleft(self.trials[name])
    self.exhausted = False

  def ended(self, run: scheduler.Active, status: str, error: str | None) -> None:
    """`run` exited: its last records judged, then concluded."""
    t = self.trials.pop(run.name)
    if t.pruned_at is None:
      self.judge(t)
    self.conclude(t, status, error, run.proc.returncode)

  def read(self, t: _Trial) -> list[tuple[int, float]]:
    """The metric's new (step, value) records in `t`'s metrics.jsonl since the last read."""
    path = self.dir / self.index["runs"][t.name]["workdir"] / "metrics.jsonl"
    try:
      with open(path, "rb") as f:
        if f.seek(0, 2) < t.offset:  # rewritten: read it again (reported steps are skipped)
          t.offset, t.partial = 0, b""
        f.seek(t.offset)
        data = f.read()
    except FileNotFoundError:
      return []
    t.offset += len(data)
    *lines, t.partial = (t.partial + data).split(b"\n")
    split, key = report.split_metric(self.search.metric)
    out = []
    for line in lines:
      try:
        r = json.loads(line)
      except ValueError:
        continue
      if isinstance(r, dict) and r.get("split") == split and isinstance(r.get(key), (int, float)):
        out.append((r["step"], float(r[key])))
    return out

  def judge(self, t: _Trial) -> bool:
    """Reports `t`'s new values; True when the pruner stops it (at the first step it rejects)."""
    for step, value in self.read(t):
      if step in t.reported or not math.isfinite(value):
        continue
      t.trial.report(value, step)
      t.reported.add(step)
      if (self.search.prune is not None and step != self.search.steps
          and t.trial.should_prune()):
        t.pruned_at = (step, value)
        record = self.index["runs"][t.name]  # written first: a rerun never resumes it
        record.update(status=jindex.PRUNED, pruned_at=step,
                      error=f"pruned at step {step} ({self.search.metric} {value:.4g})")
        jindex.write(self.dir, self.index)
        return True
    return False

  def conclude(self, t: _Trial, status: str, error: str | None, returncode) -> None:
    """Records how `t`'s run ended and tells the study (a stopped run: nothing, it stays
    running for a rerun to resume)."""
    record = self.index["runs"][t.name]
    value = None
    if t.pruned_at is not None or status == jindex.PRUNED:
      status, error = jindex.PRUNED, record["error"]
    elif status == jindex.FINISHED:
      value = report.run_result(self.dir, t.name, record, self.search.metric,
                                self.search.mode)["final"]
      if value is None or not math.isfinite(value):
        status, error = jindex.FAILED, f"no finite {self.search.metric} at the end of the run"
    record.update(status=status, error=error, returncode=returncode)
    jindex.write(self.dir, self.index)
    state = self.optuna.trial.TrialState
    if status == jindex.FINISHED:
      self.study.tell(t.trial, value)
      error = f"{self.search.metric} {value:.4g}"
    elif status in (jindex.PRUNED, jindex.FAILED):
      self.study.tell(t.trial, state=state.PRUNED if status == jindex.PRUNED else state.FAIL)
    self.echo(f"  {status:<8} {t.name}" + (f": {error}" if error else ""))

  def settle(self) -> collections.deque:
    """The trials a stopped sweep left running: those that ended meanwhile concluded, the rest
    returned to resume."""
    resume = collections.deque()
    running = self.study.get_trials(deepcopy=False,
                                    states=(self.optuna.trial.TrialState.RUNNING,))
    for frozen in running:
      t = self.track(frozen)
      record = self.index["runs"].get(t.name)
      if record is None:  # asked, but the sweep stopped before recording it
        resume.append(t)
      elif record["status"] == jindex.PRUNED:
        self.conclude(t, jindex.PRUNED, record["error"], record["returncode"])
      elif record["status"] == jindex.FAILED:
        self.conclude(t, jindex.FAILED, record["error"], record["returncode"])
      elif runner.is_finished(self.dir, record):  # it ended while no sweep watched
        self.judge(t)
        self.conclude(t, jindex.FINISHED, None, record["returncode"])
      else:
        resume.append(t)
    return resume

  def next_trial(self, resume: collections.deque, total: int) -> _Trial | None:
    """A trial to run now: a stopped one whose workdir no process holds, else a new one while
    the study holds fewer than `total`; None when there is none."""
    for _ in range(len(resume)):
      t = resume.popleft()
      record = self.index["runs"].get(t.name)
      if record is None or not scheduler.lock_holder(self.dir / record["workdir"]):
        return t if record is not None or self.prepare(t) else self.next_trial(resume, total)
      resume.append(t)
    while len(self.study.get_trials(deepcopy=False)) < total:
      space.seed_sampler(self.optuna, self.study, self.search,
                    len(self.study.get_trials(deepcopy=False)))
      trial = self.study.ask()
      t = _Trial(run_name(trial.number), trial, set())
      if self.prepare(t):
        return t
    return None


def run(sweep_dir, search: Search, trials: int, jobs: int = 1, echo=print,
        slots: list[Slot] | None = None) -> tuple[dict, str]:
  """Runs `search` in `sweep_dir` until its study holds `trials` ended trials; returns (the
  index, how it ended: 'done' or the name of the signal that stopped it)."""
  optuna = space.import_optuna()
  sweep_dir = pathlib.Path(sweep_dir)
  with scheduler.invocation(sweep_dir) as preempt:
    index = jindex.merge_search(jindex.read(sweep_dir), search)
    jindex.write(sweep_dir, index)
    study = space.open_study(optuna, sweep_dir, search)
    driver = _Driver(optuna, sweep_dir, search, study, index, echo)
    driver.resume, driver.total = driver.settle(), trials
    ended = collections.Counter(r["status"] for r in index["runs"].values())
    held = len(study.get_trials(deepcopy=False))
    plural = "s" * (trials != 1)
    echo(f"jaxdl sweep: {sweep_dir}: search {search.sampler}, {trials} trial{plural}: "
         f"{held - len(driver.resume)} ended ({ended[jindex.FINISHED]} finished, "
         f"{ended[jindex.FAILED]} failed, {ended[jindex.PRUNED]} pruned), "
         f"{len(driver.resume)} to resume, {max(0, trials - held)} to ask, {jobs} at a time")
    return index, scheduler.execute(sweep_dir, driver.plan, index, driver,
                                    slots or make_slots(jobs), preempt, echo)
