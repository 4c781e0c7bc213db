"""Gradient accumulation: one update from N microbatches of a batch (`train.grad_accum`).

Shapes: B the rows of the batch a step sees, N = train.grad_accum microbatches of M = B / N rows
each, D devices.

Microbatch i holds rows i, i + N, i + 2N, ... of the batch (a strided split). A batch sharded
over devices in contiguous blocks of B / D rows then gives every microbatch B / (N D) rows of
each device's block, so no row moves between devices; this needs N to divide B / D
(`check_grad_accum`, before anything compiles). A loop over the N microbatches carries

    g_sum <- g_sum + grad L_i(theta)                     (float32, shape of theta)
    model_state <- the state after microbatch i          (e.g. BatchNorm running averages)

and returns g = g_sum / N. The loop is a `lax.scan`, chosen by measurement (`jaxdl bench
accum`, N = 4, this 2-core CPU, jax 0.10.2), which keeps one microbatch's activations alive
(compiled temporary memory 1.02-1.03x one microbatch step's for the CNN, GPT and U-Net). On a CPU
the loop compiles its step with the scan body's convolutions in XLA:CPU's fast layout
(`jaxdl.train.xla_cpu`, the one seam for that compiler; this module is backend-agnostic).
Measured and not chosen: a Python-unrolled loop (CNN 1.3-1.7x wall, U-Net 1.0x, but 3.6-3.9x the
memory: XLA:CPU expands max-pool gradients into scatters whose activation-sized index iotas,
which depend on no data, it schedules at the start, N copies alive at once; an
`optimization_barrier` chaining microbatch i + 1 on microbatch i's sum cannot order ops that
have no inputs, and changed nothing); a `lax.cond` around each unrolled microbatch (1.06x
memory, but its branch is a nested computation: 6.3x time); `lax.scan(unroll=N)` (3.58x memory
for the CNN, as unrolled) and unroll=2 (1.95x memory for the GPT).
A step with the loop compiles with XLA's while-loop
invariant code motion off (`compiler_options`): that pass moves what the body computes from no
loop-carried value out of the loop and carries the result through all N iterations, and what it
finds there is mostly the random-number counters of each dropout mask (two iotas of its shape,
which depend on nothing), cheaper to rebuild per microbatch than to keep. For the digits MLP
with BatchNorm and dropout (two 128 x 256 masks, 0.5 MB of hoisted counters) the temporary
memory went from 1.57x one microbatch step's to 1.28x; the CNN 1.04 -> 1.01x, the GPT 1.03 ->
1.02x, time within the noise (`jaxdl.bench.cnn`).

A task loss that is a mean over its rows gives, with equal microbatches,

    g = (1/N) sum_i grad L_i = grad of the mean over all B rows = the step's gradient at N = 1,

and the metrics are the mean of the N microbatch values, which equals the full-batch value for
every per-example mean (up to the order of floating-point sums). A loss L_i = S_i / W_i that
divides by what its microbatch scores (`Task.loss_weight`: response tokens, labelled nodes) is no
such mean; there microbatch i is weighted by its share W_i / W of the batch's W = sum_j W_j,

    g = sum_i (W_i / W) grad L_i = grad (sum_i S_i) / W,

the whole batch's gradient again, and so are the loss and metrics (`accumulate_gradients`);
pmap's devices are weighted the same way (`weighted_pmean`). BatchNorm normalizes each
microbatch with its own statistics (M rows) and its running averages take N momentum updates a
step, so a BatchNorm model differs from N = 1 (under pmap the statistics are still averaged over
devices per microbatch). Microbatch i uses the step's keys folded with i (`fold_in(key, i)`); at
N = 1 the step's keys are used as they are. Under fp16 each microbatch differentiates S * L_i and
the sum is unscaled once; an overflow in any microbatch skips the whole step.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxdl.schema import ConfigError


def check_grad_accum(grad_accum: int, global_batch: int, num_devices: int) -> None:
  """Refuses an N that does not split each device's rows into equal microbatches."""
  per_device = global_batch // num_devices
  if grad_accum < 1 or per_device % grad_accum:
    raise ConfigError(f"train.grad_accum: {grad_accum} does not divide the per-device batch "
                     f"{per_device} (data.batch_size {global_batch} over {num_devices} devices); "
                     f"use a divisor of {per_device}")


def split_microbatches(batch: dict, n: int) -> dict:
  """(B, ...) leaves -> (N, B / N, ...), microbatch i = rows i, i + N, ... (see the module)."""

  def split(x):
    x_MxNx = x.reshape(x.shape[0] // n, n, *x.shape[1:])
    return jnp.moveaxis(x_MxNx, 1, 0)

  return jax.tree.map(split, batch)


# The XLA pass a step with a microbatch loop compiles without (see the module docstring).
LOOP_COMPILER_OPTIONS = {"xla_disable_hlo_passes": "while-loop-invariant-code-motion"}


def compiler_options(grad_accum: int) -> dict | None:
  """The `jax.jit(compiler_options=...)` for a train step at N = grad_accum: None (XLA's
  defaults) at N = 1, where there is no microbatch loop, else `LOOP_COMPILER_OPTIONS`."""
  return dict(LOOP_COMPILER_OPTIONS) if grad_accum > 1 else None


def _share(weight_fn: Callable | None, part: dict, w_whole):
  """W(part) / W(whole) for a task whose loss divides by W (`Task.loss_weight`), else None
  (every row weighs the same). A whole with W = 0 (nothing scored) gives every part share 0:
  its loss and gradient are 0, as a single step's would be."""
  if w_whole is None:
    return None
  return weight_fn(part) / jnp.maximum(w_whole, 1e-12)


def accumulate_gradients(grad_fn: Callable, params, model_state, batch: dict, rngs: dict,
                         n: int, *, loop: str = "scan", weight_fn: Callable | None = None):
  """`grad_fn(params, model_state, batch, rngs) -> (grads, (loss, metrics, model_state))` over
  N microbatches (2.): the mean gradient (summed in float32), the mean loss and metrics, and the
  model state after the last microbatch. N = 1 calls `grad_fn` once on the whole batch.

  loop: 'scan' (a `lax.scan`: one microbatch's activations alive at a time) or 'unroll' (N
  copies of the microbatch step in the program, run in order; kept as the reference the bench
  compares with).

  weight_fn: `Task.loss_weight`. For a loss L_i = S_i / W_i that divides a sum S_i by the
  microbatch's own weight W_i (its scored tokens), the mean of the L_i is not the whole batch's
  S / W: a microbatch with few scored tokens would count as much as one with many. With it the
  means are weighted, g = sum_i (W_i / W) grad L_i = grad S / W, and so are the loss and metrics:
  the whole batch's numbers.
  """
  if n == 1:
    return grad_fn(params, model_state, batch, rngs)
  micro_rngs = lambda i: {k: jax.random.fold_in(key, i) for k, key in rngs.items()}  # noqa: E731

  def add(g_sum, grads, share):
    if share is None:
      return jax.tree.map(lambda s, g: s + g.astype(jnp.float32), g_sum, grads)
    return jax.tree.map(lambda s, g: s + share * g.astype(jnp.float32), g_sum, grads)

  w_whole = weight_fn(batch) if weight_fn is not None else None
  g_sum = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
  if loop == "unroll":
    values, shares = [], []
    for i in range(n):
      micro = jax.tree.map(lambda x, i=i: x[i::n], batch)
      grads, (loss, metrics, model_state) = grad_fn(params, model_state, micro, micro_rngs(i))
      shares.append(_share(weight_fn, micro, w_whole))
      g_sum = add(g_sum, grads, shares[-1])
      values.append((loss, metrics))
    loss_N, metrics_N = jax.tree.map(lambda *v: jnp.stack(v), *values)
    share_N = None if shares[0] is None else jnp.stack(shares)
  elif loop == "scan":
    rows_M = jnp.arange(jax.tree.leaves(batch)[0].shape[0] // n) * n

    def body(carry, i):
      g_sum, state = carry
      # Rows i, i + N, ... gathered in the body: one microbatch is copied at a time, where a
      # split before the loop would copy (transpose) the whole batch.
      micro = jax.tree.map(lambda x: jnp.take(x, rows_M + i, axis=0), batch)
      grads, (loss, metrics, state) = grad_fn(params, state, micro, micro_rngs(i))
      share = _share(weight_fn, micro, w_whole)
      return (add(g_sum, grads, share), state), (loss, metrics, share)

    (g_sum, model_state), (loss_N, metrics_N, share_N) = jax.lax.scan(
        body, (g_sum, model_state), jnp.arange(n))
  else:
    raise ValueError(f"accumulate_gradients: loop {loop!r}; expected 'scan' or 'unroll'")
  if share_N is None:
    grads = jax.tree.map(lambda s, p: (s / n).astype(p.dtype), g_sum, params)
    loss, metrics = jax.tree.map(lambda v_N: jnp.mean(v_N.astype(jnp.float32), axis=0),
                                 (loss_N, metrics_N))
  else:
    grads = jax.tree.map(lambda s, p: s.astype(p.dtype), g_sum, params)
    loss, metrics = jax.tree.map(lambda v_N: jnp.tensordot(share_N, v_N.astype(jnp.float32), 1),
                                 (loss_N, metrics_N))
  return grads, (loss, metrics, model_state)


def weighted_pmean(tree, weight, axis_name: str):
  """The mean of `tree` over the devices of `axis_name`, each device's weighted by its `weight`
  (its batch's `Task.loss_weight`): sum_d W_d x_d / sum_d W_d; the plain `lax.pmean` when the
  weight is None."""
  if weight is None:
    return jax.lax.pmean(tree, axis_name)
  share = weight / jnp.maximum(jax.lax.psum(weight, axis_name), 1e-12)
  return jax.lax.psum(jax.tree.map(lambda x: share * x, tree), axis_name)
