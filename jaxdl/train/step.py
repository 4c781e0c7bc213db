"""Pure train and eval steps.

`train_step(state, batch) -> (state, metrics)`:
  key_s   = fold_in(base_key, s) (and fold_in(., device index) under pmap), split into the named
            streams dropout / noise / time / label_drop
  g       = grad of the task loss at params (averaged over devices under pmap); with
            grad_accum = N the mean of N microbatch gradients (`jaxdl.train.accumulate`)
  metrics = loss, grad_norm = ||g||_2 (before any clipping inside the optax chain), lr = eta(s),
            state_finite = 1.0 if every leaf of the updated params, optimizer and model state is
            finite else 0.0, and the task's metrics
  params  <- params + tx.update(g)

A non-finite g shows as a non-finite grad_norm (NaN and Inf propagate through the sum of squares;
so does an overflow of the sum itself, which would overflow Adam's second moment too). The loop
refuses to save a state after a step whose loss, grad_norm or state_finite says otherwise; the
check is one fused reduction inside the step, read back with the other metrics (no extra sync).

Under the fp16 policy the loss is multiplied by the dynamic scale S before differentiation and the
gradients divided by S; a step whose gradients are not finite is skipped and S adjusted
(`jaxdl.optim.precision`).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from jaxdl.optim import precision
from jaxdl.train import accumulate
from jaxdl.train.state import TrainState

RNG_STREAMS = ("dropout", "noise", "time", "label_drop")


def step_rngs(base_key: jax.Array, step: jax.Array, axis_name: str | None = None) -> dict:
  """The named PRNG streams of one step; nothing is carried between steps."""
  key = jax.random.fold_in(base_key, step)
  if axis_name is not None:
    key = jax.random.fold_in(key, jax.lax.axis_index(axis_name))
  return dict(zip(RNG_STREAMS, jax.random.split(key, len(RNG_STREAMS))))


def make_train_step(apply_fn: Callable, loss_fn: Callable, tx: optax.GradientTransformation,
                    schedule: Callable, base_key: jax.Array, *, axis_name: str | None = None,
                    jit: bool = False, grad_accum: int = 1,
                    watch: Callable | None = None) -> Callable:
  """Builds `train_step(state, batch) -> (state, metrics)`.

  Args:
    apply_fn: `model.apply`.
    loss_fn: the task loss, `loss_fn(apply_fn, params, model_state, batch, rngs, train)`.
    tx: the optax chain (clipping, weight decay and schedule included).
    schedule: `step -> lr`, reported as the `lr` metric.
    base_key: the run's base PRNG key; step s uses `fold_in(base_key, s)`.
    axis_name: the pmap axis to average gradients, metrics and randomness over; None under jit
      (the mesh makes every reduction global).
    jit: return the step jitted with the state donated (for single-device use); the parallel
      strategies wrap the un-jitted step themselves.
    grad_accum: N, the number of microbatches the batch is split into for one update (a
      `lax.scan`, gradients summed in float32; `jaxdl.train.accumulate`). 1: no accumulation.
    watch: `health(step, params, grads, new_params) -> vector`, the health signals of
      `jaxdl.train.watch.make_health`, returned as the metric 'watch'; None: not computed.

  Returns:
    The pure step function.
  """

  def train_step(state: TrainState, batch: dict):
    rngs = step_rngs(base_key, state.step, axis_name)
    scale = state.loss_scale

    def objective(params, model_state, batch, rngs):
      loss, (metrics, new_model_state) = loss_fn(apply_fn, params, model_state, batch, rngs, True)
      scaled = scale.scale_loss(loss) if scale is not None else loss
      return scaled, (loss, metrics, new_model_state)

    grads, (loss, metrics, new_model_state) = accumulate.accumulate_gradients(
        jax.grad(objective, has_aux=True), state.params, state.model_state, batch, rngs,
        grad_accum)
    if scale is not None:
      grads = scale.unscale(grads)
    if axis_name is not None:
      grads = jax.lax.pmean(grads, axis_name)
      loss, metrics = jax.lax.pmean((loss, metrics), axis_name)
    grad_norm = optax.tree.norm(grads)
    updates, new_opt_state = tx.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    new_state = state.replace(step=state.step + 1, params=new_params, opt_state=new_opt_state,
                              model_state=new_model_state)
    if scale is not None:
      # fp16: an overflowing step keeps the old params and optimizer state; only S changes.
      finite = precision.all_finite(grads)
      new_state = precision.select_tree(finite, new_state, state.replace(step=state.step + 1))
      new_state = new_state.replace(loss_scale=scale.adjust(finite))
      metrics = {**metrics, "loss_scale": scale.scale, "grads_finite": finite}
    # After the fp16 select: a skipped step keeps the old (finite) state, so it reads 1 there.
    state_finite = precision.all_finite((new_state.params, new_state.opt_state,
                                         new_state.model_state))
    metrics = {"loss": loss, "grad_norm": grad_norm, "lr": jnp.asarray(schedule(state.step)),
               "state_finite": state_finite, **metrics}
    if watch is not None:
      metrics["watch"] = watch(state.step, state.params, grads, new_state.params)
    return new_state, jax.tree.map(lambda m: jnp.asarray(m, jnp.float32), metrics)

  return jax.jit(train_step, donate_argnums=0) if jit else train_step


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
