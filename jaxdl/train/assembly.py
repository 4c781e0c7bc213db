"""`build(config) -> Run`: every piece of a run, built and validated before any side effect.

The loop, the doctor's preflight and its NaN locator all start here, so they train the same
model on the same data with the same keys:

  init_key, base_key = split(PRNGKey(config.seed))
  state_0            = create_train_state(model, tx, init_key, x_example[:1])
  step s randomness  = fold_in(base_key, s)         (`jaxdl.train.step.step_rngs`)

Master parameters stay fp32; the model computes in the precision policy's dtype. A model that
cannot (it has no `dtype` field) is refused under bf16/fp16 instead of silently training in fp32.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import optax

from jaxdl import data as jdata
from jaxdl import models as jmodels
from jaxdl import optim as joptim
from jaxdl.config import TrainSettings, parse_parallel, parse_train
from jaxdl.optim import precision
from jaxdl.train import accumulate, step, strategies, tasks, trackers
from jaxdl.train.state import TrainState, create_train_state


@dataclasses.dataclass(frozen=True)
class Run:
  """The built pieces of one experiment config."""
  config: Any
  ds: Any                                  # jaxdl.data dataset (train_iter, eval_batches, info)
  task: tasks.Task
  strategy: Any                            # jit | pmap | fsdp (`jaxdl.train.strategies`)
  tx: optax.GradientTransformation
  schedule: Callable[[Any], Any]           # step -> lr
  policy: precision.Policy
  model: Any                               # flax module, cloned with the policy's dtype
  init_key: jax.Array
  base_key: jax.Array
  train: TrainSettings                     # the checked `train` section

  def init_fn(self) -> Callable[[jax.Array], TrainState]:
    """`key -> state_0` (pure; jit it with the shardings where the state should live)."""
    example_x = self.task.init_input(next(self.ds.train_iter(process_index=0, process_count=1)))
    scale = precision.DynamicLossScale.create() if self.policy.loss_scaling else None
    return lambda key: create_train_state(self.model, self.tx, key, example_x[:1],
                                          loss_scale=scale)

  def abstract_state(self) -> TrainState:
    """Shapes and dtypes of the state, without computing it."""
    return jax.eval_shape(self.init_fn(), self.init_key)

  def init_state(self, shardings=None) -> TrainState:
    """The seeded initial state, created where `shardings` put it (default device otherwise)."""
    return jax.jit(self.init_fn(), out_shardings=shardings)(self.init_key)


def apply_precision(model, policy: precision.Policy, overrides: dict):
  """Clones `model` with the compute dtype and the strategy's overrides it has fields for."""
  fields = {f.name for f in dataclasses.fields(model)}
  if "dtype" not in fields and policy.compute_dtype != jax.numpy.float32:
    raise ValueError(f"train.precision: model {type(model).__name__!r} has no `dtype` field, so "
                     f"it cannot compute in {jax.numpy.dtype(policy.compute_dtype).name}; use "
                     f"train.precision='fp32' or give the model a compute dtype")
  overrides = {**overrides, "dtype": policy.compute_dtype}
  return model.clone(**{k: v for k, v in overrides.items() if k in fields})


def build(config) -> Run:
  """Builds data, task, strategy, optimizer, precision policy and model; raises on bad config."""
  train, parallel = parse_train(config), parse_parallel(config)
  ds = jdata.make_dataset(config)
  task = tasks.make_task(config)
  strategies.check_experts(config.model, parallel.expert)
  strategy = strategies.make_strategy(parallel.strategy, parallel.devices, fsdp=parallel.fsdp,
                                      expert=parallel.expert)
  strategies.check_batch(config.data.batch_size, strategy.num_global_devices)
  accumulate.check_grad_accum(train.grad_accum, config.data.batch_size,
                              strategy.num_global_devices)
  optim = joptim.parse_optim(config.optim)
  if train.eval_ema and optim.ema_decay is None:
    raise ValueError("train.eval_ema: the run keeps no parameter average; set optim.ema_decay "
                     "(e.g. 0.999) or train.eval_ema=False")
  trackers.check(train.loggers)
  tx, schedule = (task.optimizer(optim, train.steps) if task.optimizer
                  else optim.build(train.steps))
  policy = precision.get_policy(train.precision)
  model = apply_precision(jmodels.build_model(config.model), policy, strategy.model_overrides)
  init_key, base_key = jax.random.split(jax.random.PRNGKey(config.seed))
  run = Run(config, ds, task, strategy, tx, schedule, policy, model, init_key, base_key, train)
  check_best_metric(run)
  check_batch_statistics(run)
  return run


def check_batch_statistics(run: Run) -> None:
  """Traces one training loss (`jax.eval_shape`: nothing computed or compiled) when the model
  normalizes with batch statistics, so a batch that BatchNorm cannot normalize (one value per
  feature: `jaxdl.models.layers.batch_stats_guard`) is refused here, before the workdir is
  written, rather than when the train step compiles."""
  if getattr(run.model, "norm", None) != "batch" or getattr(run.model, "bn_axis_name", None):
    return  # under pmap the statistics pool over devices (and the axis exists only there)
  batch = next(run.ds.train_iter(process_index=0, process_count=1))
  # What BatchNorm normalizes in one call: one microbatch (jit and fsdp reduce over the global
  # batch, so the devices' shares do not matter).
  batch = jax.tree.map(lambda x: x[:x.shape[0] // run.train.grad_accum], batch)
  rngs = step.step_rngs(run.base_key, 0)
  jax.eval_shape(lambda s, b: run.task.loss_fn(run.model.apply, s.params, s.model_state, b, rngs,
                                               True), run.abstract_state(), batch)


def eval_metric_names(run: Run) -> list[str]:
  """The keys an evaluation of `run` reports ('eval/loss', 'eval/<task metric>', ...).

  Read from `jax.eval_shape` of the eval step on the abstract state: traced, nothing computed
  or compiled, and always the metrics the loop will log, whatever the task.
  """
  eval_step = step.make_eval_step(run.model.apply, run.task.loss_fn)
  batch = next(run.ds.train_iter(process_index=0, process_count=1))
  sums = jax.eval_shape(eval_step, run.abstract_state(), batch)
  return sorted(f"eval/{k}" for k in sums if k != "count")


def check_best_metric(run: Run) -> None:
  """Refuses a `train.best_metric` the task does not report, before anything is trained (the
  checkpoint manager would otherwise fail on it at the first evaluation)."""
  metric = run.train.best_metric
  if metric in ("", "eval/loss"):  # every task reports its loss
    return
  names = eval_metric_names(run)
  if metric not in names:
    raise ValueError(f"train.best_metric: task {run.config.task!r} reports no metric "
                     f"{metric!r}; expected one of {', '.join(names)} (or '' for none)")
