"""`build(config) -> Run`: every piece of a run, built and validated before any side effect.

Each config section is parsed here, once, and the `Run` carries the parsed objects: `train`
(`TrainSettings`), `parallel` (`ParallelSettings`), `optim` (`OptimConfig`) and `data` (the
`DataSource`). Everything downstream (the loop, resume, the extension check, the tasks, the
doctor) reads them from the `Run` or receives them as arguments; nothing parses a section again.

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
from jaxdl.models.lora import trainable_predicate
from jaxdl.config import (ParallelSettings, TrainSettings, parse_parallel, parse_root,
                          parse_train)
from jaxdl.schema import ConfigError
from jaxdl.optim import masks, precision
from jaxdl.train import accumulation, init_from, step, strategies, tasks, trackers
from jaxdl.train.step import TrainState, create_train_state


@dataclasses.dataclass(frozen=True)
class Run:
  """The parsed sections and the built pieces of one experiment config."""
  config: Any
  # The sections, each parsed once by `build`.
  train: TrainSettings
  parallel: ParallelSettings
  optim: joptim.OptimConfig
  data: jdata.DataSource
  # What they build.
  ds: Any                                  # jaxdl.data dataset (train_iter, eval_batches, info)
  task: tasks.Task
  strategy: Any                            # jit | pmap | fsdp (`jaxdl.train.strategies`)
  tx: optax.GradientTransformation
  schedule: Callable[[Any], Any]           # step -> lr
  policy: precision.Policy
  model: Any                               # flax module, cloned with the policy's dtype
  init_key: jax.Array
  base_key: jax.Array
  # `abstract_state`'s and `example_batch`'s answers, once computed: the build's checks and the
  # loop each ask for them, and every trace of the model's and the optimizer's init costs as much
  # as the first. Not an init field, so a `dataclasses.replace`d run (another optimizer) traces
  # its own.
  _memo: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

  def example_batch(self) -> dict:
    """The stream's first batch as one process reads it (what init and the build's checks trace
    with), read once per run: each read starts the data pipeline."""
    if "batch" not in self._memo:
      self._memo["batch"] = next(self.ds.train_iter(process_index=0, process_count=1))
    return self._memo["batch"]

  def init_fn(self) -> Callable[[jax.Array], TrainState]:
    """`key -> state_0` (pure; jit it with the shardings where the state should live). The same
    function object on every call, so that jax traces it once per run whatever the shardings
    it is jitted with."""
    if "init_fn" not in self._memo:
      example_x = self.task.init_input(self.example_batch())
      scale = precision.DynamicLossScale.create() if self.policy.loss_scaling else None
      self._memo["init_fn"] = lambda key: create_train_state(self.model, self.tx, key,
                                                             example_x[:1], loss_scale=scale)
    return self._memo["init_fn"]

  def _init_traced(self) -> jax.stages.Traced:
    """The init function traced once per run: its jaxpr and its output's shapes."""
    if "init" not in self._memo:
      self._memo["init"] = jax.jit(self.init_fn()).trace(self.init_key)
    return self._memo["init"]

  def abstract_state(self) -> TrainState:
    """Shapes and dtypes of the state, without computing it (traced once per run)."""
    return self._init_traced().out_info

  def init_state(self, shardings=None) -> TrainState:
    """The seeded initial state, created where `shardings` put it (default device otherwise);
    with the config's `init_from`, its parameters are the base's, read into place without a
    random init of them (`jaxdl.train.init_from.init_state`: the adapters as this init draws
    them).

    Compiled from `abstract_state`'s trace, not a second one: the shardings depend on the
    shapes, and jax reuses the trace of the same function (`init_fn`) jitted with other
    shardings, where tracing the model's and the optimizer's init again through flax would cost
    as much as the first time."""
    base = parse_root(self.config).init_from
    if base:  # the base's leaves read into place, never drawn at random first
      return init_from.init_state(self.init_fn(), self.init_key, self.abstract_state(),
                                  shardings, self.tx, base, self.model)
    self._init_traced()
    init = (jax.jit(self.init_fn()) if shardings is None
            else jax.jit(self.init_fn(), out_shardings=shardings))
    return init(self.init_key)

  def with_optim(self, optim: joptim.OptimConfig, config) -> Run:
    """This run under another parsed `optim` section (`config`: the config recording it): the
    chain and schedule rebuilt from the parsed object (`jaxdl.train.resume.pin_wsd_warmup`)."""
    tx, schedule = build_optimizer(self.task, optim, self.train.steps, self.model)
    return dataclasses.replace(self, config=config, optim=optim, tx=tx, schedule=schedule)


def build_optimizer(task: tasks.Task, optim: joptim.OptimConfig, steps: int, model=None):
  """`(tx, schedule)` of the parsed `optim` section over T = `steps` updates (the task's own
  chains when it has them, e.g. the GAN's two players). A model that trains only some of its
  parameters (LoRA adapters: `jaxdl.models.lora.trainable_predicate`) freezes the others: no
  optimizer state, zero update (`jaxdl.optim.masks.freeze`)."""
  tx, schedule = task.optimizer(optim, steps) if task.optimizer else optim.build(steps)
  trainable = trainable_predicate(model)
  return (tx if trainable is None else masks.freeze(tx, trainable)), schedule


def apply_precision(model, policy: precision.Policy, overrides: dict):
  """Clones `model` with the compute dtype and the strategy's overrides it has fields for."""
  fields = {f.name for f in dataclasses.fields(model)}
  if "dtype" not in fields and policy.compute_dtype != jax.numpy.float32:
    raise ConfigError(f"train.precision: model {type(model).__name__!r} has no `dtype` field, so "
                     f"it cannot compute in {jax.numpy.dtype(policy.compute_dtype).name}; use "
                     f"train.precision='fp32' or give the model a compute dtype")
  overrides = {**overrides, "dtype": policy.compute_dtype}
  return model.clone(**{k: v for k, v in overrides.items() if k in fields})


def build(config, overrides=()) -> Run:
  """Parses every section once, then builds data, task, strategy, optimizer, precision policy
  and model from the parsed objects; raises on bad config. `overrides`: the `key=value` items
  `config` was loaded with (`jaxdl.config.load_config`), for the checks of what they may set
  (`jaxdl.train.init_from.check_overrides`)."""
  train, parallel = parse_train(config), parse_parallel(config)
  config = init_from.resolve(config, overrides)  # the base's architecture and checks first
  data = jdata.parse_data(config.data)
  ds = jdata.make_dataset(config, data)
  task = tasks.make_task(config, train)
  model = jmodels.build_model(config.model)
  strategies.check_experts(model, parallel.expert)
  strategy = strategies.make_strategy(parallel.strategy, parallel.devices, fsdp=parallel.fsdp,
                                      expert=parallel.expert, tensor=parallel.tensor,
                                      sequence=parallel.sequence,
                                      sequence_attention=parallel.sequence_attention)
  strategies.check_tensor(model, parallel.tensor)
  strategies.check_batch(data.batch_size, strategy.num_global_devices, parallel.tensor,
                         parallel.sequence)
  accumulation.check_grad_accum(train.grad_accum, data.batch_size, strategy.batch_shards)
  optim = joptim.parse_optim(config.optim)
  if train.eval_ema and optim.ema_decay is None:
    raise ConfigError("train.eval_ema: the run keeps no parameter average; set optim.ema_decay "
                     "(e.g. 0.999) or train.eval_ema=False")
  if train.eval_ema and trainable_predicate(model) is not None:
    raise ConfigError("train.eval_ema: a LoRA model (model.lora_rank > 0) averages only its "
                      "adapters, not a whole parameter set to evaluate; set train.eval_ema=False")
  trackers.check(train.loggers)
  tx, schedule = build_optimizer(task, optim, train.steps, model)
  policy = precision.get_policy(train.precision)
  model = apply_precision(model, policy, strategy.model_overrides)
  init_key, base_key = jax.random.split(jax.random.PRNGKey(config.seed))
  run = Run(config, train=train, parallel=parallel, optim=optim, data=data, ds=ds, task=task,
            strategy=strategy, tx=tx, schedule=schedule, policy=policy, model=model,
            init_key=init_key, base_key=base_key)
  if parallel.tensor > 1:  # a model the rules do not split is refused, not run replicated
    strategies.check_layout(run.abstract_state().params, parallel.tensor, config.model.name)
  if parallel.sequence > 1:
    strategies.check_sequence(model, config.model.name, task.kind,
                              lambda: run.task.init_input(run.example_batch()).shape[1],
                              parallel.sequence)
  check_data_fits(run)
  check_best_metric(run)
  check_batch_statistics(run)
  return run


# Tasks whose labels index the model's outputs: K classes need K outputs.
# The model fields that size its outputs, the first one a model has named in the refusal.
OUTPUT_KEYS = ("vocab_size", "out", "num_classes", "n_classes")


def check_data_fits(run: Run) -> None:
  """Refuses data the model cannot represent, before anything compiles: token ids of a V-id
  vocabulary into a model with fewer than V embeddings or outputs, labels of K classes into a
  head with fewer than K outputs. One line names both numbers and the key to set (indexing past
  a table does not fail in XLA: it reads garbage, and the loss turns NaN steps later)."""
  info = run.ds.info
  vocab = info.get("vocab_size") if run.task.kind.sequence_model else None
  classes = info.get("num_classes") if run.task.kind.labels else None
  if not (vocab or classes):
    return
  batch = run.example_batch()
  state = run.abstract_state()
  out = jax.eval_shape(lambda s, x: run.model.apply({"params": s.params, **s.model_state}, x,
                                                     train=False),
                       state, run.task.init_input(batch))
  width = jax.tree.leaves(out)[0].shape[-1]
  key = next((f"model.{k}" for k in OUTPUT_KEYS if getattr(run.model, k, None) == width),
             f"the {type(run.model).__name__} model's output size")
  if vocab and vocab > width:
    raise ConfigError(f"{key}: the data has {vocab} token ids (0..{vocab - 1}) but the model "
                      f"has {width}; set {key}={vocab}")
  model_vocab = getattr(run.model, "vocab_size", None)
  if vocab and model_vocab is not None and vocab > model_vocab:
    raise ConfigError(f"model.vocab_size: the data has {vocab} token ids (0..{vocab - 1}) but "
                      f"the model embeds {model_vocab}; set model.vocab_size={vocab}")
  if classes and classes > width:
    raise ConfigError(f"{key}: the data has {classes} classes (labels 0..{classes - 1}) but the "
                      f"model has {width} outputs; set {key}={classes}")


def check_batch_statistics(run: Run) -> None:
  """Traces one training loss (`jax.eval_shape`: nothing computed or compiled) when the model
  normalizes with batch statistics, so a batch that BatchNorm cannot normalize (one value per
  feature: `jaxdl.models.layers.batch_stats_guard`) is refused here, before the workdir is
  written, rather than when the train step compiles."""
  if getattr(run.model, "norm", None) != "batch" or getattr(run.model, "bn_axis_name", None):
    return  # under pmap the statistics pool over devices (and the axis exists only there)
  batch = run.example_batch()
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
  batch = run.example_batch()
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
    raise ConfigError(f"train.best_metric: task {run.config.task!r} reports no metric "
                     f"{metric!r}; expected one of {', '.join(names)} (or '' for none)")
