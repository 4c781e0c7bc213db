"""Gradient accumulation: one optimizer update from N microbatches, inside the jitted step.

Shapes: B the rows of the batch the step sees (global under jit/fsdp, per device under pmap),
N = train.grad_accum microbatches of M = B / N rows each, P the parameters.

Microbatch i holds rows i, i + N, i + 2N, ... of the batch (a strided split). A batch sharded
over devices in contiguous blocks of B / D rows then gives every microbatch B / (N D) rows of each
device's block, so no row moves between devices; this needs N to divide B / D (checked in
`check_grad_accum`, before anything compiles). A `lax.scan` over the N microbatches carries

    g_sum <- g_sum + grad L_i(theta)                     (float32, shape of theta)
    model_state <- the state after microbatch i          (e.g. BatchNorm running averages)

and returns g = g_sum / N, one gradient copy alive at a time, so activation memory is that of
one microbatch. Each task loss is a mean over its rows, so with equal microbatches

    g = (1/N) sum_i grad L_i = grad of the mean over all B rows = the step's gradient at N = 1,

and the metrics (loss, accuracy, ...) are the mean of the N microbatch values, which equals the
full-batch value for every per-example mean (up to the order of floating-point sums).

BatchNorm: each microbatch is normalized with its own statistics (M rows, not B), and the running
averages take N momentum updates per optimizer step, one per microbatch; the result therefore
differs from N = 1 for a model with BatchNorm (it equals training on M-row batches with the
gradients summed). Under pmap the statistics are still averaged over devices per microbatch.

Randomness: microbatch i uses the step's named keys folded with i (`fold_in(key, i)`), so
dropout masks and noise differ between microbatches; at N = 1 the step's keys are used as they
are, so a run without accumulation is unchanged.

fp16 loss scaling: each microbatch differentiates S * L_i; the sum is unscaled once. An overflow in
any microbatch makes g non-finite, and the step is skipped as without accumulation.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def check_grad_accum(grad_accum: int, global_batch: int, num_devices: int) -> None:
  """Refuses an N that does not split each device's rows into equal microbatches."""
  per_device = global_batch // num_devices
  if grad_accum < 1 or per_device % grad_accum:
    raise ValueError(f"train.grad_accum: {grad_accum} does not divide the per-device batch "
                     f"{per_device} (data.batch_size {global_batch} over {num_devices} devices); "
                     f"use a divisor of {per_device}")


def split_microbatches(batch: dict, n: int) -> dict:
  """(B, ...) leaves -> (N, B / N, ...), microbatch i = rows i, i + N, ... (see the module)."""

  def split(x):
    x_MxNx = x.reshape(x.shape[0] // n, n, *x.shape[1:])
    return jnp.moveaxis(x_MxNx, 1, 0)

  return jax.tree.map(split, batch)


def accumulate_gradients(grad_fn: Callable, params, model_state, batch: dict, rngs: dict,
                         n: int):
  """`grad_fn(params, model_state, batch, rngs) -> (grads, (loss, metrics, model_state))` over
  N microbatches: the mean gradient (summed in float32), the mean loss and metrics, and the model
  state after the last microbatch. N = 1 calls `grad_fn` once on the whole batch."""
  if n == 1:
    return grad_fn(params, model_state, batch, rngs)

  def body(carry, xs):
    g_sum, state = carry
    i, micro = xs
    micro_rngs = {k: jax.random.fold_in(key, i) for k, key in rngs.items()}
    grads, (loss, metrics, state) = grad_fn(params, state, micro, micro_rngs)
    g_sum = jax.tree.map(lambda s, g: s + g.astype(jnp.float32), g_sum, grads)
    return (g_sum, state), (loss, metrics)

  g_zero = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
  (g_sum, model_state), (loss_N, metrics_N) = jax.lax.scan(
      body, (g_zero, model_state), (jnp.arange(n), split_microbatches(batch, n)))
  grads = jax.tree.map(lambda s, p: (s / n).astype(p.dtype), g_sum, params)
  loss, metrics = jax.tree.map(lambda v_N: jnp.mean(v_N.astype(jnp.float32), axis=0),
                               (loss_N, metrics_N))
  return grads, (loss, metrics, model_state)
