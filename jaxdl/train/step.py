"""One training step, from batch to update: the state, `make_train_step`, `make_eval_step`.

Shapes: B the rows of the batch the step sees (global under jit/fsdp, per device under pmap),
N = train.grad_accum microbatches of M = B / N rows each, P the parameters, S the fp16 loss scale.

`train_step(state, batch) -> (state, metrics)` does, in this order:

  1. keys     key_s = fold_in(base_key, s) (and fold_in(., device index) under pmap), split into
              the named streams dropout / noise / time / label_drop (`step_rngs`). No key is
              stored in the state, so a restored state continues bit-exactly.
  2. grads    g = grad of the task loss at params, the model in train mode. With N > 1 the mean
              of N microbatch gradients, summed in float32 (`jaxdl.train.accumulation`);
              weighted by what each microbatch scores when the task's loss divides by that
              (`Task.loss_weight`: masked tokens, labelled nodes), so g is the whole batch's.
              Under the fp16 policy the loss differentiated is S * L and g <- g / S.
  3. devices  under pmap, g, the loss and the metrics are averaged over devices (lax.pmean;
              weighted by `Task.loss_weight` alike, `weighted_pmean`); under jit and fsdp the
              mesh already makes every reduction global.
  4. norm     grad_norm = ||g||_2, before any clipping, in a few kernels rather than one per
              leaf (`jaxdl.optim.tree_reductions`; per leaf where the state is sharded).
  5. update   (u, opt_state) <- tx.update(g, opt_state, params), params <- params + u, step + 1.
              `tx` is the optax chain of `jaxdl.optim`: clip g to norm c (g min(1, c / ||g||)),
              then the rule with its lr schedule eta(s) and weight-decay mask, then the EMA.
  6. fp16     a step whose g is not finite keeps the old params, optimizer and model state
              (only the step count moves) and S is halved; S doubles after a run of finite
              steps (`jaxdl.optim.precision.DynamicLossScale`).
  7. metrics  loss, grad_norm, lr = eta(s), state_finite = 1.0 if every leaf of the new params,
              optimizer and model state is finite else 0.0 (`tree_reductions.all_finite`), the
              task's metrics, loss_scale and grads_finite under fp16, and the `watch` health
              vector when asked; all float32.

A non-finite g shows as a non-finite grad_norm (NaN and Inf propagate through the sum of squares;
so does an overflow of the sum itself, which would overflow Adam's second moment too). The loop
refuses to save a state after a step whose loss, grad_norm or state_finite says otherwise; the
check is a few reductions inside the step, read back with the other metrics (no extra sync).

Gradient accumulation (N > 1) is `jaxdl.train.accumulation`: the strided microbatches, the loop
form chosen by measurement, and the weighting of masked losses.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdl.optim import precision, tree_reductions
from jaxdl.train.accumulation import accumulate_gradients, compiler_options, weighted_pmean

RNG_STREAMS = ("dropout", "noise", "time", "label_drop")


@flax.struct.dataclass
class TrainState:
  """step, params, optimizer state, mutable model collections and the fp16 loss scale: a pytree
  of arrays, nothing else (no PRNG key), so a checkpoint of it is all a resumed run needs.

  Attributes:
    step: int32 scalar, the number of updates applied so far.
    params: the model parameters (fp32 master copy under every precision policy).
    opt_state: the optax state of the optimizer chain.
    model_state: mutable collections other than params, e.g. {'batch_stats': ...}.
    loss_scale: the dynamic loss scale under the fp16 policy, else None.
  """
  step: jax.Array
  params: Any
  opt_state: Any
  model_state: Any
  loss_scale: Any = None


def create_train_state(model, tx, init_rng, example_x, loss_scale=None) -> TrainState:
  """Initializes params and model state from one example input, and the optimizer state."""
  params_rng, dropout_rng = jax.random.split(init_rng)
  variables = model.init({"params": params_rng, "dropout": dropout_rng}, example_x, train=False)
  variables = dict(variables)
  params = variables.pop("params")
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    model_state=variables, loss_scale=loss_scale)


def step_rngs(base_key: jax.Array, step: jax.Array, axis_name: str | None = None) -> dict:
  """The named PRNG streams of one step (1.); nothing is carried between steps."""
  key = jax.random.fold_in(base_key, step)
  if axis_name is not None:
    key = jax.random.fold_in(key, jax.lax.axis_index(axis_name))
  return dict(zip(RNG_STREAMS, jax.random.split(key, len(RNG_STREAMS))))


def make_train_step(apply_fn: Callable, loss_fn: Callable, tx: optax.GradientTransformation,
                    schedule: Callable, base_key: jax.Array, *, axis_name: str | None = None,
                    jit: bool = False, grad_accum: int = 1,
                    watch: Callable | None = None,
                    loss_weight: Callable | None = None) -> Callable:
  """Builds `train_step(state, batch) -> (state, metrics)` (steps 1-7 of the module docstring).

  Args:
    apply_fn: `model.apply`.
    loss_fn: the task loss, `loss_fn(apply_fn, params, model_state, batch, rngs, train)`.
    tx: the optax chain (clipping, weight decay and schedule included).
    schedule: `step -> lr`, reported as the `lr` metric.
    base_key: the run's base PRNG key; step s uses `fold_in(base_key, s)`.
    axis_name: the pmap axis to average gradients, metrics and randomness over; None under jit
      (the mesh makes every reduction global).
    jit: return the step jitted with the state donated and `accumulation.compiler_options`
      (for single-device use); the parallel strategies wrap the un-jitted step themselves
      (`Strategy.compile_train`, given the same options).
    grad_accum: N, the number of microbatches the batch is split into for one update (a scan,
      `jaxdl.train.accumulation`; gradients summed in float32); 1: none.
    watch: `health(step, params, grads, new_params) -> vector`, the health signals of
      `jaxdl.train.watch.make_health`, returned as the metric 'watch'; None: not computed.
    loss_weight: `Task.loss_weight`, for a loss normalized by what the batch scores (tokens,
      nodes): microbatches (`accumulate_gradients`) and pmap's devices (`weighted_pmean`) are
      weighted by it, so the update is the whole batch's. None: all rows weigh alike.

  Returns:
    The pure step function.
  """

  def train_step(state: TrainState, batch: dict):
    # 1. keys
    rngs = step_rngs(base_key, state.step, axis_name)
    scale = state.loss_scale

    # 2. grads: of S * L under fp16 (the unscaled loss rides along as an output)
    def objective(params, model_state, batch, rngs):
      loss, (metrics, new_model_state) = loss_fn(apply_fn, params, model_state, batch, rngs, True)
      scaled = scale.scale_loss(loss) if scale is not None else loss
      return scaled, (loss, metrics, new_model_state)

    grads, (loss, metrics, new_model_state) = accumulate_gradients(
        jax.grad(objective, has_aux=True), state.params, state.model_state, batch, rngs,
        grad_accum, weight_fn=loss_weight)
    if scale is not None:
      grads = scale.unscale(grads)
    # 3. devices
    if axis_name is not None:
      weight = loss_weight(batch) if loss_weight is not None else None
      grads, loss, metrics = weighted_pmean((grads, loss, metrics), weight, axis_name)
    # 4. norm, before the chain clips
    grad_norm = tree_reductions.global_norm(grads)
    # 5. update
    updates, new_opt_state = tx.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    new_state = state.replace(step=state.step + 1, params=new_params, opt_state=new_opt_state,
                              model_state=new_model_state)
    # 6. fp16: an overflowing step keeps the old params and optimizer state; only S changes.
    if scale is not None:
      finite = precision.all_finite(grads)
      new_state = precision.select_tree(finite, new_state, state.replace(step=state.step + 1))
      new_state = new_state.replace(loss_scale=scale.adjust(finite))
      metrics = {**metrics, "loss_scale": scale.scale, "grads_finite": finite}
    # 7. metrics. After the fp16 select: a skipped step keeps the old (finite) state, so
    # state_finite reads 1 there.
    state_finite = precision.all_finite((new_state.params, new_state.opt_state,
                                         new_state.model_state))
    metrics = {"loss": loss, "grad_norm": grad_norm, "lr": jnp.asarray(schedule(state.step)),
               "state_finite": state_finite, **metrics}
    if watch is not None:
      metrics["watch"] = watch(state.step, state.params, grads, new_state.params)
    return new_state, jax.tree.map(lambda m: jnp.asarray(m, jnp.float32), metrics)

  if not jit:
    return train_step
  return jax.jit(train_step, donate_argnums=0, compiler_options=compiler_options(grad_accum))


def make_eval_step(apply_fn: Callable, loss_fn: Callable, *, axis_name: str | None = None,
                   jit: bool = False) -> Callable:
  """Builds `eval_step(state, batch) -> sums` in eval mode (running BatchNorm stats, no dropout).

  Returns weighted sums (`count` is the number of real examples) so a split evaluated in several
  padded batches averages exactly: mean = sum / count.
  """

  def eval_step(state: TrainState, batch: dict):
    loss, (metrics, _) = loss_fn(apply_fn, state.params, state.model_state, batch, {}, False)
    mask = batch.get("mask")
    count = (jnp.asarray(mask, jnp.float32).sum() if mask is not None
             else jnp.asarray(jax.tree.leaves(batch)[0].shape[0], jnp.float32))
    sums = {k: jnp.asarray(v, jnp.float32) * count for k, v in {"loss": loss, **metrics}.items()}
    sums["count"] = count
    if axis_name is not None:
      sums = jax.lax.psum(sums, axis_name)
    return sums

  return jax.jit(eval_step) if jit else eval_step


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
