"""`run(config, workdir)`: the training loop.

Order of a run:
  1. build data, task, model, optimizer and strategy -- every config error is raised here,
     before the workdir is touched or anything compiles;
  2. check the workdir: a different experiment or config there is refused (unless `force`);
  3. restore the latest readable checkpoint (state + data iterator), else start fresh;
  4. loop: dispatch step s, then read step s-1's metrics (no per-step host sync); log, evaluate,
     checkpoint on their cadences; stop on SIGTERM (save and return), a non-finite loss (raise,
     nothing saved) or early stopping;
  5. final eval and checkpoint, wait for async saves, draw loss.png.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import math
import pathlib
import signal
import threading

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxdl import data as jdata
from jaxdl import models as jmodels
from jaxdl import optim as joptim
from jaxdl.config import diff_configs
from jaxdl.train import checkpoint as jckpt
from jaxdl.optim import precision
from jaxdl.train import guards, parallel, step as jstep, tasks, writers
from jaxdl.train.state import create_train_state

log = logging.getLogger("jaxdl")

# Keys that may change when a run is resumed: cadences and the run length (the optimizer's
# schedule decides whether a new length keeps the learning rates already taken).
RESUMABLE_KEYS = ("train.steps", "train.eval_every", "train.log_every", "train.ckpt_every",
                  "train.keep_ckpts", "train.patience", "train.plot", "train.async_checkpoint",
                  "optim.schedule.warmup_steps",  # checked by value: see _check_run_length
                  "parallel.strategy", "parallel.devices", "parallel.fsdp", "description")


class NonFiniteLossError(RuntimeError):
  """The training loss became NaN or Inf; the non-finite state was not saved."""

  def __init__(self, step: int, metrics: dict):
    self.step, self.metrics = step, metrics
    super().__init__(f"loss became non-finite at step {step} ({metrics.get('loss')}); "
                     f"stopped without saving that state")


class SpikeError(RuntimeError):
  """A loss spike the guard could not rewind (no checkpoint yet, or too many rewinds)."""


class PreflightError(RuntimeError):
  """`train.doctor` is on and the preflight checks failed; nothing was written."""


class WorkdirMismatchError(ValueError):
  """The workdir holds a run of a different experiment or config."""


def every(step: int, n: int) -> bool:
  return n > 0 and step % n == 0


def manifest(strategy, config) -> dict:
  """What a checkpoint was written by: library versions, devices, processes, mesh, strategy."""
  versions = {name: importlib.metadata.version(dist) for name, dist in (
      ("jax", "jax"), ("flax", "flax"), ("optax", "optax"), ("orbax", "orbax-checkpoint"),
      ("grain", "grain"))}
  return {**versions,
          "backend": jax.default_backend(), "device_count": jax.device_count(),
          "local_device_count": jax.local_device_count(), "process_count": jax.process_count(),
          **strategy.describe(), "experiment": config.name}


class _Preemption:
  """Turns SIGTERM into a flag the loop polls, so the current step is saved before exit."""

  def __init__(self):
    self.requested = False
    self._old = None

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._old = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def __exit__(self, *exc):
    if self._old is not None:
      signal.signal(signal.SIGTERM, self._old)


def _check_workdir(workdir: pathlib.Path, config_json: dict, force: bool) -> dict | None:
  """Refuses a workdir of another experiment or config; returns its old config, if any."""
  path = workdir / "config.json"
  if not path.exists():
    return None
  old = json.loads(path.read_text())
  differing = [d for d in diff_configs(old, config_json)
               if not any(d.startswith(k + ":") for k in RESUMABLE_KEYS)]
  # Keys that did not exist when the old run started (a newer jaxdl) are not a different config.
  added = [d for d in differing if ": '<missing>' -> " in d]
  if added:
    log.warning("config keys new since this workdir's run (resuming with them): %s",
                "; ".join(added))
  differing = [d for d in differing if d not in added]
  if differing and not force:
    raise WorkdirMismatchError(
        f"workdir {workdir} holds a run with a different config ({'; '.join(differing)}); "
        f"use another --workdir or --force to resume anyway")
  return old


def _pin_wsd_warmup(config, workdir: pathlib.Path):
  """Extending a WSD run keeps the warmup it had: a `warmup_frac` would move with train.steps."""
  path = workdir / "config.json"
  if not path.exists() or "optim" not in config or "schedule" not in config.optim:
    return config
  old = json.loads(path.read_text())
  sched, old_sched = config.optim.schedule, old.get("optim", {}).get("schedule", {})
  if (sched.get("name") != "wsd" or old_sched.get("name") != "wsd" or
      sched.get("warmup_steps") is not None or old["train"]["steps"] == config.train.steps):
    return config
  warmup = joptim.schedules.resolve_warmup(ml_collections.ConfigDict(old_sched),
                                           old["train"]["steps"])
  config = config.copy_and_resolve_references()
  config.optim.schedule.warmup_steps = warmup
  log.info("optim.schedule.warmup_steps pinned to %d, the warmup of the run being extended",
           warmup)
  return config


def _check_run_length(old_json: dict | None, config, start: int) -> None:
  """A resumed run must keep every learning rate already taken (extending WSD yes, cosine no)."""
  if old_json is None or start == 0:
    return
  problem = joptim.extension_problem(ml_collections.ConfigDict(old_json), config, start)
  if problem is not None:
    raise WorkdirMismatchError(problem)


def _pad_to_multiple(batch: dict, multiple: int) -> dict:
  """Pads an eval batch with masked copies of its first row so it splits over the devices."""
  n = len(batch["mask"])
  extra = -n % multiple
  if not extra:
    return batch
  out = {k: np.concatenate([v, np.repeat(v[:1], extra, axis=0)]) for k, v in batch.items()}
  out["mask"][n:] = 0.0
  return out


def evaluate(eval_fn, state, ds, strategy) -> dict:
  """Exact mean metrics over the eval split (padded batches weighted by their masks)."""
  totals = None
  for batch in ds.eval_batches(process_index=jax.process_index(),
                               process_count=jax.process_count()):
    batch = _pad_to_multiple(batch, strategy.num_global_devices // jax.process_count())
    sums = strategy.first(eval_fn(state, strategy.shard_batch(batch)))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  if totals is None:
    return {}
  totals = jax.device_get(totals)
  count = max(float(totals.pop("count")), 1.0)
  return {k: float(v) / count for k, v in totals.items()}


def build(config):
  """Everything a run needs, built (and validated) before any side effect."""
  ds = jdata.make_dataset(config)
  task = tasks.make_task(config)
  strategy = parallel.make_strategy(config.parallel.strategy, config.parallel.get("devices", 0),
                                    fsdp=config.parallel.get("fsdp", 0))
  parallel.check_batch(config.data.batch_size, strategy.num_global_devices)
  tx, schedule = joptim.make_optimizer(config.optim, config.train.steps)
  policy = precision.get_policy(config.train.precision)
  model = jmodels.build_model(config.model)
  # Master params stay fp32; only the compute dtype follows the policy.
  overrides = {**strategy.model_overrides, "dtype": policy.compute_dtype}
  overrides = {k: v for k, v in overrides.items() if hasattr(model, k)}
  model = model.clone(**overrides)
  return ds, task, strategy, tx, schedule, policy, model


def run(config, workdir, *, force: bool = False, progress: bool = True) -> dict:
  """Trains `config` in `workdir`, resuming from its latest checkpoint; returns a summary."""
  workdir = pathlib.Path(workdir)
  config = _pin_wsd_warmup(config, workdir)
  ds, task, strategy, tx, schedule, policy, model = build(config)
  config_json = json.loads(config.to_json_best_effort())
  old_json = _check_workdir(workdir, config_json, force)
  if config.train.get("doctor", False):
    from jaxdl.doctor import run_preflight  # the doctor builds on the engine, not vice versa
    report = run_preflight(config)
    log.info("%s", report.text())
    if not report.ok:
      raise PreflightError(f"preflight failed for {config.name}: {report.causes()}; "
                           f"run `jaxdl doctor {config.name}` for details")
  guard = (guards.SpikeDetector(config.train.spike_factor, config.train.spike_window,
                                config.train.spike_watch) if config.train.spike_guard else None)

  init_key, base_key = jax.random.split(jax.random.PRNGKey(config.seed))
  example_x = task.init_input(next(ds.train_iter(process_index=0, process_count=1)))
  initial_scale = precision.DynamicLossScale.create() if policy.loss_scaling else None
  init_fn = lambda k: create_train_state(model, tx, k, example_x[:1],  # noqa: E731
                                         loss_scale=initial_scale)
  abstract = jax.eval_shape(init_fn, init_key)

  workdir.mkdir(parents=True, exist_ok=True)
  loop = _Loop(config, workdir, ds, strategy, config_json, abstract)
  if loop.restore() is None:
    # Created where it lives (replicated under jit, sharded under fsdp, on every process of a
    # multi-host run), never whole on one device first; pmap stacks a copy per device later.
    loop.state = jax.jit(init_fn, out_shardings=strategy.state_shardings(abstract))(init_key)
  _check_run_length(None if force else old_json, config, loop.start)
  if loop.is_main:
    (workdir / "config.json").write_text(json.dumps(config_json, indent=2))
    if progress:
      log.info("weight decay (optim.weight_decay=%g):\n%s", config.optim.weight_decay,
               joptim.decay_table(loop.state.params, config.optim))

  train_step = jstep.make_train_step(model.apply, task.loss_fn, tx, schedule, base_key,
                                     axis_name=strategy.axis_name)
  eval_step = jstep.make_eval_step(model.apply, task.loss_fn, axis_name=strategy.axis_name)
  loop.state = strategy.place_state(loop.state)
  train_fn = strategy.compile_train(train_step, loop.state)
  eval_fn = strategy.compile_eval(eval_step, loop.state)
  return loop.train(train_fn, eval_fn, guard, progress)


class SpikeRewind(Exception):
  """Raised by the metrics check to rewind the loop."""


class _Loop:
  """The mutable side of a run: current state, data position, writers, checkpoints."""

  def __init__(self, config, workdir, ds, strategy, config_json, abstract):
    self.config, self.workdir, self.ds, self.strategy = config, workdir, ds, strategy
    self.config_json = config_json
    self.abstract = abstract
    self.is_main = jax.process_index() == 0
    self.train_it = ds.train_iter(process_index=jax.process_index(),
                                  process_count=jax.process_count())
    self.ckpt = jckpt.Checkpointer(workdir / "checkpoints", keep=config.train.keep_ckpts,
                                   best_metric=config.train.best_metric,
                                   best_mode=config.train.best_mode,
                                   async_save=config.train.async_checkpoint)
    self.writer = writers.MetricsWriter(workdir, enabled=self.is_main)
    self.meta = manifest(strategy, config)
    self.state, self.start = None, 0
    self.last_eval: dict = {}
    self.last_train: dict = {}
    self.skip_batches: set[int] = set()   # data positions dropped after a spike rewind
    self.rewinds = 0

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
    self.ckpt.save(step, self.strategy.single_copy(self.state),
                   data_state={**self.train_it.get_state(),
                               "skip_batches": sorted(self.skip_batches)},
                   config=self.config_json,
                   manifest=self.meta,
                   metrics={f"eval/{k}": v for k, v in self.last_eval.items()} or None)

  def next_batch(self):
    while self.train_it.step in self.skip_batches:
      next(self.train_it)
    return self.strategy.shard_batch(next(self.train_it))

  def check(self, step: int, metrics, guard) -> dict:
    """Host-side metrics of `step`: stop on non-finite, rewind on a spike, log on cadence."""
    metrics = {k: float(v) for k, v in jax.device_get(self.strategy.first(metrics)).items()}
    if not math.isfinite(metrics["loss"]):
      raise NonFiniteLossError(step, metrics)
    spike = guard.check(metrics) if guard is not None else None
    if spike is not None:
      raise SpikeRewind(step, spike)
    # Step 1 is always logged: the first loss is the doctor's first check (ln K).
    if (every(step, self.config.train.log_every) or step == 1 or
        step == self.config.train.steps):
      self.writer.write(step, "train", metrics)
      self.bar.update(step, metrics)
    return metrics

  def train(self, train_fn, eval_fn, guard, progress: bool) -> dict:
    config = self.config
    total = config.train.steps
    self.bar = writers.Progress(total, self.start, enabled=progress and self.is_main)
    best, evals_since_best = None, 0
    summary = {"start_step": self.start, "preempted": False, "early_stopped": False,
               "rewinds": 0}
    pending = None  # (step, metrics, data position of its batch): read one step late
    s = self.start
    with _Preemption() as preempt:
      try:
        while s < total:
          batch = self.next_batch()
          position = self.train_it.step - 1
          self.state, metrics = train_fn(self.state, batch)
          done = s + 1
          try:
            if pending is not None:
              self.last_train = self.check(pending[0], pending[1], guard)
            pending = (done, metrics, position)
            boundary = (every(done, config.train.eval_every) or done == total or
                        every(done, config.train.ckpt_every) or preempt.requested)
            if boundary:  # never evaluate or save before this step is known to be good
              self.last_train = self.check(done, metrics, guard)
              pending = None
          except SpikeRewind as e:
            spike_step, spike = e.args
            bad = pending[2] if pending is not None and pending[0] == spike_step else position
            s = self._rewind_to(spike_step, spike, bad)
            pending = None
            summary["rewinds"] = self.rewinds
            continue
          s = done
          if every(done, config.train.eval_every) or done == total:
            self.last_eval = evaluate(eval_fn, self.state, self.ds, self.strategy)
            self.writer.write(done, "eval", self.last_eval)
            self.bar.message(f"eval step {done}: " + " ".join(
                f"{k}={v:.4g}" for k, v in self.last_eval.items()))
            key = config.train.best_metric.removeprefix("eval/")
            if config.train.patience > 0 and key in self.last_eval:
              value = self.last_eval[key]
              better = best is None or (value > best if config.train.best_mode == "max"
                                        else value < best)
              best, evals_since_best = (value, 0) if better else (best, evals_since_best + 1)
              summary["early_stopped"] = evals_since_best >= config.train.patience
          if preempt.requested:
            self.save(done)
            self.writer.write_event(done, "preempted")
            summary["preempted"] = True
            break
          if every(done, config.train.ckpt_every) or done == total or summary["early_stopped"]:
            self.save(done)
          if summary["early_stopped"]:
            self.writer.write_event(done, "early_stop", patience=config.train.patience)
            break
        if pending is not None:
          self.last_train = self.check(pending[0], pending[1], None)
      finally:
        self.ckpt.close()
        self.bar.close()
        self.writer.close()
    if self.is_main and config.train.plot:
      writers.plot_losses(self.workdir, title=config.name)
    step = self.strategy.first(self.state.step)
    summary.update(step=int(jax.device_get(step)), train=self.last_train, eval=self.last_eval)
    return summary

  def _rewind_to(self, step: int, spike: dict, bad_position: int) -> int:
    """Restores the last checkpoint and marks the spiking step's batch to be skipped."""
    self.ckpt.wait()
    latest = self.ckpt.latest_step()
    if latest is None or self.rewinds >= self.config.train.max_rewinds:
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
