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

import json
import logging
import math
import pathlib
import signal
import threading

import jax
import jax.numpy as jnp
import ml_collections
import orbax.checkpoint as ocp

from jaxdl import data as jdata
from jaxdl import models as jmodels
from jaxdl import optim as joptim
from jaxdl.config import diff_configs
from jaxdl.train import checkpoint as jckpt
from jaxdl.optim import precision
from jaxdl.train import parallel, step as jstep, tasks, writers
from jaxdl.train.state import create_train_state

log = logging.getLogger("jaxdl")

# Keys that may change when a run is resumed: cadences and the run length (the optimizer's
# schedule decides whether a new length keeps the learning rates already taken).
RESUMABLE_KEYS = ("train.steps", "train.eval_every", "train.log_every", "train.ckpt_every",
                  "train.keep_ckpts", "train.patience", "train.plot", "train.async_checkpoint",
                  "parallel.strategy", "parallel.devices", "description")


class NonFiniteLossError(RuntimeError):
  """The training loss became NaN or Inf; the non-finite state was not saved."""

  def __init__(self, step: int, metrics: dict):
    self.step, self.metrics = step, metrics
    super().__init__(f"loss became non-finite at step {step} ({metrics.get('loss')}); "
                     f"stopped without saving that state")


class WorkdirMismatchError(ValueError):
  """The workdir holds a run of a different experiment or config."""


def every(step: int, n: int) -> bool:
  return n > 0 and step % n == 0


def manifest(strategy, config) -> dict:
  import flax as _flax, optax as _optax  # noqa: E401
  return {"jax": jax.__version__, "flax": _flax.__version__, "optax": _optax.__version__,
          "orbax": ocp.__version__ if hasattr(ocp, "__version__") else "",
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
  if differing and not force:
    raise WorkdirMismatchError(
        f"workdir {workdir} holds a run with a different config ({'; '.join(differing)}); "
        f"use another --workdir or --force to resume anyway")
  return old


def _check_run_length(old_json: dict | None, config, start: int) -> None:
  """A changed train.steps must keep every learning rate already taken (WSD yes, cosine no)."""
  if old_json is None or start == 0 or old_json["train"]["steps"] == config.train.steps:
    return
  problem = joptim.extension_problem(ml_collections.ConfigDict(old_json), config, start)
  if problem is not None:
    raise WorkdirMismatchError(problem)


def evaluate(eval_fn, state, ds, strategy) -> dict:
  """Exact mean metrics over the eval split (padded batches weighted by their masks)."""
  totals = None
  for batch in ds.eval_batches(process_index=jax.process_index(),
                               process_count=jax.process_count()):
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
  strategy = parallel.make_strategy(config.parallel.strategy, config.parallel.get("devices", 0))
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
  ds, task, strategy, tx, schedule, policy, model = build(config)
  workdir = pathlib.Path(workdir)
  config_json = json.loads(config.to_json_best_effort())
  old_json = _check_workdir(workdir, config_json, force)
  is_main = jax.process_index() == 0

  init_key, base_key = jax.random.split(jax.random.PRNGKey(config.seed))
  train_it = ds.train_iter(process_index=jax.process_index(), process_count=jax.process_count())
  example_x = task.init_input(next(ds.train_iter(process_index=0, process_count=1)))
  initial_scale = precision.DynamicLossScale.create() if policy.loss_scaling else None
  init_fn = jax.jit(lambda k: create_train_state(model, tx, k, example_x[:1],
                                                 loss_scale=initial_scale))
  abstract = jax.eval_shape(init_fn, init_key)

  workdir.mkdir(parents=True, exist_ok=True)
  ckpt = jckpt.Checkpointer(workdir / "checkpoints", keep=config.train.keep_ckpts,
                            best_metric=config.train.best_metric,
                            best_mode=config.train.best_mode,
                            async_save=config.train.async_checkpoint)
  writer = writers.MetricsWriter(workdir, enabled=is_main)
  target = jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(jax.local_devices()[0]),
                        abstract)
  if strategy.name == "jit":
    target = strategy.state_shardings(abstract)
  restored = ckpt.restore(jckpt.abstract_like(abstract, target))
  if restored is None:
    state = init_fn(init_key)
    start = 0
  else:
    start, state, data_state = restored
    train_it.set_state(data_state)
    writer.write_event(start, "resume")
  _check_run_length(None if force else old_json, config, start)
  if is_main:
    (workdir / "config.json").write_text(json.dumps(config_json, indent=2))
  meta = manifest(strategy, config)

  train_step = jstep.make_train_step(model.apply, task.loss_fn, tx, schedule, base_key,
                                     axis_name=strategy.axis_name)
  eval_step = jstep.make_eval_step(model.apply, task.loss_fn, axis_name=strategy.axis_name)
  state = strategy.place_state(state)
  train_fn = strategy.compile_train(train_step, state)
  eval_fn = strategy.compile_eval(eval_step, state)

  total = config.train.steps
  bar = writers.Progress(total, start, enabled=progress and is_main)
  last_eval: dict = {}
  best, evals_since_best = None, 0
  summary = {"start_step": start, "preempted": False, "early_stopped": False}

  def save(step):
    ckpt.save(step, strategy.single_copy(state), data_state=train_it.get_state(),
              config=config_json, manifest=meta,
              metrics={f"eval/{k}": v for k, v in last_eval.items()} or None)

  def host_metrics(step, metrics):
    metrics = jax.device_get(strategy.first(metrics))
    metrics = {k: float(v) for k, v in metrics.items()}
    if not math.isfinite(metrics["loss"]):
      raise NonFiniteLossError(step, metrics)
    if every(step, config.train.log_every) or step == total:
      writer.write(step, "train", metrics)
      bar.update(step, metrics)
    return metrics

  pending = None
  last_train: dict = {}
  with _Preemption() as preempt:
    try:
      for s in range(start, total):
        batch = strategy.shard_batch(next(train_it))
        state, metrics = train_fn(state, batch)
        if pending is not None:
          last_train = host_metrics(*pending)
        pending = (s + 1, metrics)
        done = s + 1
        if every(done, config.train.eval_every) or done == total or every(
            done, config.train.ckpt_every) or preempt.requested:
          last_train = host_metrics(*pending)  # never save before this step is known finite
          pending = None
        if every(done, config.train.eval_every) or done == total:
          last_eval = evaluate(eval_fn, state, ds, strategy)
          writer.write(done, "eval", last_eval)
          bar.message(f"eval step {done}: " + " ".join(f"{k}={v:.4g}"
                                                      for k, v in last_eval.items()))
          key = config.train.best_metric.removeprefix("eval/")
          if config.train.patience > 0 and key in last_eval:
            better = best is None or (last_eval[key] > best if config.train.best_mode == "max"
                                      else last_eval[key] < best)
            best, evals_since_best = (last_eval[key], 0) if better else (best,
                                                                         evals_since_best + 1)
            if evals_since_best >= config.train.patience:
              summary["early_stopped"] = True
        if preempt.requested:
          save(done)
          writer.write_event(done, "preempted")
          summary["preempted"] = True
          break
        if every(done, config.train.ckpt_every) or done == total or summary["early_stopped"]:
          save(done)
        if summary["early_stopped"]:
          writer.write_event(done, "early_stop", patience=config.train.patience)
          break
      if pending is not None:
        last_train = host_metrics(*pending)
    finally:
      ckpt.close()
      bar.close()
      writer.close()
  if is_main and config.train.plot:
    writers.plot_losses(workdir, title=config.name)
  summary.update(step=int(jax.device_get(strategy.first(state.step))) if not isinstance(
      state.step, int) else state.step, train=last_train, eval=last_eval)
  return summary
