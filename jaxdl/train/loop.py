"""`run(config, workdir)`: the training loop, the timeline of one run.

  1. setup    (`run`) parse every section once and build data, task, model, optimizer and
              strategy (`jaxdl.train.assembly.build`): every config error is raised here, before
              the workdir is touched or anything compiles; check the workdir against the run it
              holds (`resume`: a different config is refused; `force` resumes a state that fits,
              else moves the old run aside) and lock it (`workdir`); a complete run returns its
              stored summary (one killed before storing it is restored, and its final
              checkpoint evaluated for the summary); the hooks' `before_training` (e.g. the
              doctor's preflight) may refuse too;
  2. restore  (`_train`) the latest verified checkpoint (state + data iterator), else the seeded
              initial state; a new run length must keep the lrs already taken;
  3. compile  the pure train and eval steps (`jaxdl.train.step`) under the strategy;
  4. steps    (`_Loop.train`, `_Loop.advance`) dispatch step s, then read step s-1's metrics
              back (no per-step host sync): stop on a non-finite loss (raise, nothing saved),
              rewind on a spike, log on cadence;
  5. eval     on cadence and at the last step (`_Loop.evaluate`), early stopping;
  6. ckpt     on cadence, at the last step, on SIGTERM / SIGINT (save and return)
              (`_Loop.save`);
  7. close    profiler, checkpoints (wait for async saves), progress bar and writers; draw
              loss.png; store summary.json; `on_train_end`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
from typing import Any, Sequence

import jax

from jaxdl import optim as joptim
from jaxdl import stop_signals
from jaxdl.schema import ConfigError
from jaxdl.train import checkpoint as jckpt
from jaxdl.train import guards, plots, profiling, resume, step as jstep, throughput, trackers
from jaxdl.train import watch, workdir as jworkdir, writers, xla_cpu
from jaxdl.train.accumulation import compiler_options
from jaxdl.train.assembly import Run, build
from jaxdl.train.errors import NonFiniteLossError, SpikeError, disk_failures_fail_the_run
from jaxdl.train.step import evaluate
from jaxdl.train.hooks import Hook, Hooks

log = logging.getLogger("jaxdl")

def every(step: int, n: int) -> bool:
  return n > 0 and step % n == 0


def run(config, workdir, *, force: bool = False, progress: bool = True,
        hooks: Sequence[Hook] = (), preempt: stop_signals.Preemption | None = None,
        overrides: Sequence[str] = ()) -> dict:
  """Trains `config` in `workdir`, resuming from its latest checkpoint; returns a summary.

  The workdir is locked for the run (a second run there raises `WorkdirLockedError`); a run
  already complete (`jaxdl.train.workdir.completed_summary`) returns its stored summary.

  Args:
    config: the experiment config (`jaxdl.config.load_config`).
    workdir: the run directory; a run of the same config there is resumed.
    force: run even when the workdir holds a different config: resume its state if it fits the
      new config, else move the old run to `workdir/previous-<time>/` and start fresh.
    progress: show a progress bar and log lines (process 0 only).
    hooks: `jaxdl.train.hooks.Hook`s called before training, per logged step, per evaluation,
      per checkpoint and at the end (`train.doctor=True` needs the doctor's preflight hook,
      `jaxdl.doctor.PreflightHook`, which the CLI passes).
    preempt: the `jaxdl.stop_signals.Preemption` catching SIGTERM / SIGINT (the CLI's,
      installed before its imports); None installs one for the call. A signal at any moment
      stops the run cleanly: during training the current step is saved; during setup or compile
      nothing new exists to save and the run returns at the next milestone. Either way the
      summary says `preempted` and the lock is released.
    overrides: the `key=value` items `config` was loaded with, checked against what they may set
      (`jaxdl.train.init_from.check_overrides`: the base decides the architecture).
  """
  if preempt is None:
    with stop_signals.Preemption() as preempt:
      return run(config, workdir, force=force, progress=progress, hooks=hooks, preempt=preempt,
                 overrides=overrides)
  with preempt.polled():
    return _setup(config, workdir, force, progress, hooks, preempt, overrides)


def _setup(config, workdir, force: bool, progress: bool, hooks: Sequence[Hook],
           preempt: stop_signals.Preemption, overrides: Sequence[str] = ()) -> dict:
  """Step 1 of the module docstring, then `_train` with the workdir locked."""
  # 1. setup
  workdir = pathlib.Path(workdir)
  jworkdir.check_unlocked(workdir)  # name a run in progress before building anything
  previous = resume.read_previous(workdir)
  r = resume.pin_wsd_warmup(build(config, overrides), previous)
  config_json = json.loads(r.config.to_json_best_effort())
  differs = resume.check_same_run(workdir, previous, config_json, force, optim=r.optim)
  hooks = Hooks(hooks)
  if r.train.doctor and not hooks.preflight:
    raise ConfigError("train.doctor: the preflight lives in jaxdl.doctor; pass "
                     "hooks=[jaxdl.doctor.PreflightHook()] to jaxdl.train.run (the CLI does)")
  abstract = r.abstract_state()
  with jworkdir.lock(workdir, expect_config=previous):
    if differs and not jckpt.restorable(workdir / "checkpoints", abstract):
      previous = jworkdir.move_aside(workdir)  # never mix two runs: resume only a state that fits
    stored = jworkdir.completed_summary(workdir, r.train.steps)
    if stored is not None:
      return stored
    stop_signals.reached("locked")
    if preempt.requested:  # nothing built, loaded or written yet
      return _stopped(jckpt.latest_saved_step(workdir / "checkpoints") or 0)
    hooks.before_training(r)
    return _train(r, workdir, config_json, abstract, hooks,
                  None if force else previous, progress, preempt)


def _stopped(step: int) -> dict:
  """The summary of a run stopped by a signal before its first step (nothing new to save)."""
  return {"start_step": step, "preempted": True, "early_stopped": False, "rewinds": 0,
          "step": step, "train": {}, "eval": {}}


def _train(r: Run, workdir: pathlib.Path, config_json: dict, abstract, hooks: Hooks,
           previous: dict | None, progress: bool, preempt: stop_signals.Preemption) -> dict:
  """Steps 2-7 of the module docstring, with the workdir locked."""
  workdir.mkdir(parents=True, exist_ok=True)
  loop = _Loop(r, workdir, config_json, abstract, hooks)
  # 2. restore
  try:
    if loop.restore() is None:
      # Created where it lives (replicated under jit, sharded under fsdp, on every process of a
      # multi-host run), never whole on one device first; pmap stacks a copy per device later.
      loop.state = r.init_state(r.strategy.state_shardings(abstract))
    if preempt.requested:  # the restored (or initial) state is already all there is to keep
      guards.close_all((loop.ckpt.close, loop.writer.close), failed=None)
      return _stopped(loop.start)
  except BaseException as e:
    guards.close_all((loop.ckpt.close, loop.writer.close), failed=e)
    raise
  resume.check_run_length(previous, r, loop.start)
  if loop.is_main:
    (workdir / "config.json").write_text(json.dumps(config_json, indent=2))
    if progress:
      log.info("weight decay (optim.weight_decay=%g):\n%s", r.optim.weight_decay,
               joptim.decay_table(loop.state.params, r.optim))
  # 3. compile
  train_step = jstep.make_train_step(r.model.apply, r.task.loss_fn, r.tx, r.schedule,
                                     r.base_key, axis_name=r.strategy.axis_name,
                                     grad_accum=r.train.grad_accum,
                                     watch=loop.watcher.health,
                                     loss_weight=r.task.loss_weight)
  eval_step = jstep.make_eval_step(r.model.apply, r.task.loss_fn, axis_name=r.strategy.axis_name)
  loop.state = r.strategy.place_state(loop.state)
  # The one call site of the compiler workarounds (`jaxdl.train.xla_cpu`: a CPU only).
  train_step = xla_cpu.train_program(train_step, r.train.xla_cpu_workarounds,
                                     r.train.grad_accum)
  train_fn = r.strategy.compile_train(train_step, loop.state,
                                      compiler_options(r.train.grad_accum))
  eval_fn = r.strategy.compile_eval(eval_step, loop.state)
  loop.watcher.compile(r.strategy, loop.state)
  # 4-7. steps, eval, checkpoints, close
  with disk_failures_fail_the_run(workdir):  # a full disk from here on fails the run (exit 1)
    summary = loop.train(train_fn, eval_fn, progress, preempt)
  loop.writer.finish(summary)
  if loop.is_main and summary["step"] >= r.train.steps:
    jworkdir.write_summary(workdir, summary)
  hooks.on_train_end(summary)
  return summary


class SpikeRewind(Exception):
  """Raised by the metrics check to rewind the loop: (step, spike info, batch position)."""


@dataclasses.dataclass(frozen=True)
class _Dispatched:
  """A step whose metrics are still on the device (read back one step late)."""
  step: int
  metrics: Any
  position: int   # the data position of its batch (skipped after a spike rewind)


class _Loop:
  """The mutable side of a run: current state, data position, writers, checkpoints."""

  def __init__(self, r: Run, workdir: pathlib.Path, config_json: dict, abstract, hooks: Hooks):
    config, train = r.config, r.train
    self.config, self.workdir, self.ds, self.strategy = config, workdir, r.ds, r.strategy
    self.settings = train
    self.config_json, self.abstract, self.hooks = config_json, abstract, hooks
    self.is_main = jax.process_index() == 0
    self.train_it = r.ds.train_iter(process_index=jax.process_index(),
                                    process_count=jax.process_count())
    self.ckpt = jckpt.Checkpointer(workdir / "checkpoints", keep=train.keep_ckpts,
                                   best_metric=train.best_metric, best_mode=train.best_mode,
                                   async_save=train.async_checkpoint)
    self.meta = jckpt.manifest(r.strategy, config)
    self.writer = writers.MetricsWriter(
        workdir, enabled=self.is_main, tensorboard="tensorboard" in train.loggers,
        trackers=trackers.start(train.loggers, workdir, config.name, config_json, self.meta)
        if self.is_main else ())
    self.guard = (guards.SpikeDetector(train.spike_factor, train.spike_window, train.spike_watch)
                  if train.spike_guard else None)
    self.early = guards.EarlyStopping(train.best_metric, train.best_mode, train.patience)
    self.meter = throughput.Meter(r, log_info=self.is_main)
    self.profiler = profiling.Profiler(workdir, train.profile_steps)
    self.watcher = watch.Watcher(r, abstract)
    self.state, self.start = None, 0
    self.pending: _Dispatched | None = None
    self.last_eval: dict = {}
    self.last_train: dict = {}
    self.skip_batches: set[int] = set()   # data positions dropped after a spike rewind
    self.rewinds = 0
    self.bar = None

  def restore(self):
    """Loads the newest readable checkpoint into (state, data position); None if there is none."""
    target = self.strategy.state_shardings(self.abstract)  # straight to where it lives
    restored = self.ckpt.restore(jckpt.abstract_like(self.abstract, target))
    if restored is None:
      return None
    self.start, self.state, data_state = restored
    data_state = dict(data_state)
    self.skip_batches |= set(data_state.pop("skip_batches", []))
    self.train_it.set_state(data_state)
    self.writer.write_event(self.start, "resume")
    return self.start

  def save(self, step: int) -> None:
    data_state = {**self.train_it.get_state(), "skip_batches": sorted(self.skip_batches)}
    metrics = {f"eval/{k}": v for k, v in self.last_eval.items()} or None
    with self.meter.paused():
      self.ckpt.save(step, self.strategy.single_copy(self.state), data_state=data_state,
                     config=self.config_json, manifest=self.meta, metrics=metrics)
    self.hooks.on_checkpoint(step)

  def next_batch(self):
    while self.train_it.step in self.skip_batches:
      next(self.train_it)
    return self.strategy.shard_batch(next(self.train_it))

  def check(self, d: _Dispatched, guard) -> dict:
    """Host-side metrics of a step: stop on non-finite, rewind on a spike, log on cadence."""
    host = jax.device_get(self.strategy.first(d.metrics))
    watched = self.watcher.take(d.step, host, self.strategy.first)  # pops the health vector
    metrics = {k: float(v) for k, v in host.items()}
    what = NonFiniteLossError.find(metrics)
    metrics.pop("state_finite", None)  # always 1 past this point: not worth a column in the logs
    if what is not None:
      raise NonFiniteLossError(d.step, metrics, what)
    spike = guard.check(metrics) if guard is not None else None
    if spike is not None:
      raise SpikeRewind(d.step, spike, d.position)
    if watched:
      self.writer.write(d.step, "watch", watched)
    # Step 1 is always logged: the first loss is the doctor's first check (ln K).
    if (every(d.step, self.settings.log_every) or d.step == 1 or
        d.step == self.settings.steps):
      self.writer.write(d.step, "train", metrics)
      # Timings differ run to run: their own split keeps the train records reproducible.
      if rates := self.meter.tick(d.step):
        self.writer.write(d.step, "throughput", rates)
      self.bar.update(d.step, metrics)
      self.hooks.on_step_end(d.step, {**metrics, **rates})
    return metrics

  def read_back(self, dispatched: _Dispatched, boundary: bool) -> None:
    """Checks the previous step's metrics, and this step's too at a boundary (eval, save):
    nothing is evaluated or saved before its step is known to be good."""
    previous, self.pending = self.pending, dispatched
    if previous is not None:
      self.last_train = self.check(previous, self.guard)
    if boundary:
      self.last_train = self.check(dispatched, self.guard)
      self.pending = None

  def train(self, train_fn, eval_fn, progress: bool, preempt: stop_signals.Preemption) -> dict:
    """Steps 4-7: advances until the last step (or a stop), then closes every resource.

    A signal met during compile stops here, before the first step, saving nothing: a restored
    state is a checkpoint already, and a fresh run's step 0 is not worth one."""
    self.bar = writers.Progress(self.settings.steps, self.start,
                                enabled=progress and self.is_main)
    self.meter.log_info = progress and self.is_main
    summary = {"start_step": self.start, "preempted": False, "early_stopped": False,
               "rewinds": 0}
    s = self.start
    closers = (self.profiler.close, self.ckpt.close, self.bar.close, self.writer.close)
    try:
      if preempt.requested and s < self.settings.steps:  # during compile
        summary["preempted"] = True
        self.writer.write_event(s, "preempted")
      while s < self.settings.steps and not summary["preempted"]:
        s, stop = self.advance(s, train_fn, eval_fn, preempt, summary)
        if stop:
          break
      if self.pending is not None:
        self.last_train = self.check(self.pending, None)
      if s == self.start >= self.settings.steps:  # complete, but killed before summary.json
        self.recover_final_metrics(eval_fn)
    except BaseException as e:
      guards.close_all(closers, failed=e)
      raise
    guards.close_all(closers, failed=None)  # 7. close
    if self.is_main and self.settings.plot:
      plots.plot_run(self.workdir, title=self.config.name)
    step = self.strategy.first(self.state.step)
    summary.update(step=int(jax.device_get(step)), train=self.last_train, eval=self.last_eval,
                   rewinds=self.rewinds)
    return summary

  def advance(self, s: int, train_fn, eval_fn, preempt, summary: dict) -> tuple[int, bool]:
    """Runs update s + 1 and what falls due after it; returns (steps done, whether to stop)."""
    train = self.settings
    # 4. steps: dispatch s + 1, then check s (or s + 1 itself before an eval or a save)
    batch = self.next_batch()
    position = self.train_it.step - 1
    if not self.meter.ready:  # once: FLOPs of the compiled step, the device peak
      self.meter.prepare(train_fn, self.state, batch)
    self.profiler.before(s + 1)
    self.state, metrics = train_fn(self.state, batch)
    done = s + 1
    if done == self.start + 1:
      stop_signals.reached("step")
    self.profiler.after(done, metrics)
    with self.meter.paused():  # the probe's first call compiles it
      self.watcher.after_dispatch(done, self.state, batch)
    evaluates = every(done, train.eval_every) or done == train.steps
    saves = every(done, train.ckpt_every) or done == train.steps
    try:
      self.read_back(_Dispatched(done, metrics, position),
                     boundary=evaluates or saves or preempt.requested)
    except SpikeRewind as e:
      self.pending = None
      return self._rewind_to(*e.args), False
    # 5. eval
    if evaluates:
      with self.meter.paused():
        self.last_eval = self.evaluate(done, eval_fn)
      self.bar.message(f"eval step {done}: " + " ".join(
          f"{k}={v:.4g}" for k, v in self.last_eval.items()))
      self.hooks.on_eval(done, self.last_eval)
      summary["early_stopped"] = self.early.update(self.last_eval)
    # 6. ckpt
    if preempt.requested:
      self.save(done)
      self.writer.write_event(done, "preempted")
      summary["preempted"] = True
      return done, True
    if saves or summary["early_stopped"]:
      self.save(done)
    if summary["early_stopped"]:
      self.writer.write_event(done, "early_stop", patience=train.patience)
    return done, summary["early_stopped"]

  def evaluate(self, step: int, eval_fn, *, log: bool = True) -> dict:
    """Logs eval/ metrics, and eval_ema/ of the parameter average under `train.eval_ema`;
    returns the ones the best checkpoint and early stopping judge (the average's, then).
    `log=False` only computes them (a step whose records metrics.jsonl already holds)."""
    metrics = evaluate(eval_fn, self.state, self.ds, self.strategy)
    if log:
      self.writer.write(step, "eval", metrics)
    if not self.settings.eval_ema:
      return metrics
    averaged = self.state.replace(params=joptim.find_ema(self.state.opt_state))
    ema_metrics = evaluate(eval_fn, averaged, self.ds, self.strategy)
    if log:
      self.writer.write(step, "eval_ema", ema_metrics)
    return ema_metrics

  def recover_final_metrics(self, eval_fn) -> None:
    """The summary's metrics of a run restored at its last step (a kill between the final
    checkpoint and summary.json): eval recomputed from the checkpoint (deterministic), train
    read back from metrics.jsonl's record of that step ({} when it is gone), nothing logged
    twice."""
    self.last_eval = self.evaluate(self.start, eval_fn, log=False)
    logged = [r for r in writers.read_metrics(self.workdir, "train")
              if r.get("step") == self.start]
    self.last_train = ({k: v for k, v in logged[-1].items() if k not in ("step", "split")}
                       if logged else {})

  def _rewind_to(self, step: int, spike: dict, bad_position: int) -> int:
    """Restores the last checkpoint and marks the spiking step's batch to be skipped."""
    self.ckpt.wait()
    latest = self.ckpt.latest_step()
    if latest is None or self.rewinds >= self.settings.max_rewinds:
      why = ("there is no checkpoint to rewind to yet" if latest is None
             else f"the run already rewound {self.rewinds} times (train.max_rewinds)")
      raise SpikeError(f"{spike['metric']} spike at step {step} ({spike['value']:.4g} vs "
                       f"rolling median {spike['median']:.4g}) and {why}; stopping")
    self.skip_batches.add(bad_position)
    self.restore()
    self.state = self.strategy.place_state(self.state)
    self.rewinds += 1
    self.writer.write_event(step, "rewind", to_step=self.start, skipped_batch=bad_position,
                            **spike)
    self.bar.message(f"{spike['metric']} spike at step {step} ({spike['value']:.4g} vs median "
                     f"{spike['median']:.4g}): rewound to step {self.start}, skipping batch "
                     f"{bad_position}")
    return self.start
