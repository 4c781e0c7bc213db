"""One training step, from batch to update: the state, `make_train_step`, `make_eval_step`.

Shapes: B the rows of the batch the step sees (global under jit/fsdp, per device under pmap),
N = train.grad_accum microbatches of M = B / N rows each, P the parameters, S the fp16 loss scale.

`train_step(state, batch) -> (state, metrics)` does, in this order:

  1. keys     key_s = fold_in(base_key, s) (and fold_in(., device index) under pmap), split into
              the named streams dropout / noise / time / label_drop (`step_rngs`). No key is
              stored in the state, so a restored state continues bit-exactly.
  2. grads    g = grad of the task loss at params, the model in train mode. With N > 1 the mean
              of N microbatch gradients, summed in float32 (`accumulate_gradients`, below);
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

Gradient accumulation (N > 1). Microbatch i holds rows i, i + N, i + 2N, ... of the batch (a
strided split). A batch sharded over devices in contiguous blocks of B / D rows then gives every
microbatch B / (N D) rows of each device's block, so no row moves between devices; this needs N
to divide B / D (`check_grad_accum`, before anything compiles). A loop over the N microbatches
carries

    g_sum <- g_sum + grad L_i(theta)                     (float32, shape of theta)
    model_state <- the state after microbatch i          (e.g. BatchNorm running averages)

and returns g = g_sum / N. Its form (`accum_loop`) is chosen by measurement (`jaxdl bench
accum`, N = 4, this 2-core CPU, jax 0.10.2): a `lax.scan`, which keeps one microbatch's
activations alive (compiled temporary memory 1.02-1.03x one microbatch step's for the CNN, GPT
and U-Net). XLA:CPU rewrites convolutions into the layout its fast (YNNPACK) kernels take
(batch, spatial.., feature; kernel spatial.., in, out) only in the entry computation, so inside a
while body the weight- and input-gradient convolutions, which JAX emits in other layouts, fell to
slow kernels: 6-7x the time of N microbatch steps for the digits CNN, 9x for the U-Net. On a CPU
the scan body of a gradient holding a convolution therefore does that rewrite itself
(`canonical_convolutions`: transposes around each convolution, the same sums), which brings the
CNN and the U-Net under the 1.1 target (the numbers are `jaxdl.bench.cnn`'s). Measured and not
chosen: a Python-unrolled loop (CNN 1.3-1.7x wall, U-Net 1.0x, but 3.6-3.9x the memory: XLA:CPU
expands max-pool gradients into scatters whose activation-sized index iotas, which depend on no
data, it schedules at the start, N copies alive at once; an `optimization_barrier` chaining
microbatch i + 1 on microbatch i's sum cannot order ops that have no inputs, and changed nothing);
a `lax.cond` around each unrolled microbatch (1.06x memory, but its branch is a nested
computation: 6.3x time); `lax.scan(unroll=N)` (3.58x memory for the CNN, as unrolled) and unroll=2
(1.95x memory for the GPT).
Without convolutions the plain scan; the MLP with BatchNorm's memory stays above the 1.3x target
(why, and peeling the first microbatch or unrolling tried, in `jaxdl.bench.cnn`).

Each task loss is a mean over its rows, so with equal microbatches

    g = (1/N) sum_i grad L_i = grad of the mean over all B rows = the step's gradient at N = 1,

and the metrics are the mean of the N microbatch values, which equals the full-batch value for
every per-example mean (up to the order of floating-point sums). A loss that divides by what its
batch scores (`Task.loss_weight`: response tokens, labelled nodes) is no such mean; there the
microbatches are weighted by their share of it (`accumulate_gradients`). BatchNorm normalizes each
microbatch with its own statistics (M rows) and its running averages take N momentum updates a
step, so a BatchNorm model differs from N = 1 (under pmap the statistics are still averaged over
devices per microbatch). Microbatch i uses the step's keys folded with i (`fold_in(key, i)`); at
N = 1 the step's keys are used as they are. Under fp16 each microbatch differentiates S * L_i and
the sum is unscaled once; an overflow in any microbatch skips the whole step.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.extend import core as jcore

from jaxdl.optim import precision, tree_reductions

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


def _holds_convolution(jaxpr) -> bool:
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "conv_general_dilated":
      return True
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(sub, (jcore.Jaxpr, jcore.ClosedJaxpr)) and _holds_convolution(
            getattr(sub, "jaxpr", sub)):
          return True
  return False


def _canonical_conv(lhs, rhs, *, dimension_numbers, **params):
  """One convolution in the layout XLA:CPU's fast kernels take, lhs (B, S.., F), rhs (S.., I, O)
  -> out (B, S.., F), with transposes around it: what XLA:CPU's own canonicalization does, but
  only in the entry computation. The same sum, so the same result."""
  lhs_spec, rhs_spec, out_spec = dimension_numbers
  nd = lhs.ndim
  canon_io = (0, nd - 1, *range(1, nd - 1))  # (batch, feature, spatial..) of B S.. F
  canon_k = (nd - 1, nd - 2, *range(nd - 2))  # (out, in, spatial..) of S.. I O
  canon = jax.lax.ConvDimensionNumbers(canon_io, canon_k, canon_io)
  if (tuple(lhs_spec), tuple(rhs_spec), tuple(out_spec)) == tuple(canon):
    return jax.lax.conv_general_dilated_p.bind(lhs, rhs, dimension_numbers=canon, **params)
  lhs = jnp.transpose(lhs, (lhs_spec[0], *lhs_spec[2:], lhs_spec[1]))
  rhs = jnp.transpose(rhs, (*rhs_spec[2:], rhs_spec[1], rhs_spec[0]))
  out = jax.lax.conv_general_dilated_p.bind(lhs, rhs, dimension_numbers=canon, **params)
  perm = [0] * nd  # axis a of the wanted output is axis perm[a] of B S.. F
  perm[out_spec[0]], perm[out_spec[1]] = 0, nd - 1
  for k, a in enumerate(out_spec[2:]):
    perm[a] = 1 + k
  return jnp.transpose(out, perm)


def _eval_canonical(jaxpr, consts, *args) -> list:
  """`jax.core.eval_jaxpr` with every convolution through `_canonical_conv`; nested jit calls
  are inlined so their convolutions are reached too (other sub-jaxprs, e.g. a remat or an inner
  scan, are bound as they are)."""
  env = {}
  read = lambda v: v.val if isinstance(v, jcore.Literal) else env[v]  # noqa: E731
  env.update(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))
  for eqn in jaxpr.eqns:
    invals = [read(v) for v in eqn.invars]
    if eqn.primitive.name == "conv_general_dilated":
      outs = [_canonical_conv(*invals, **eqn.params)]
    elif eqn.primitive.name in ("jit", "pjit", "closed_call") and "jaxpr" in eqn.params:
      sub = eqn.params["jaxpr"]
      outs = _eval_canonical(sub.jaxpr, sub.consts, *invals)
    else:
      with eqn.ctx.manager:
        outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
      outs = outs if eqn.primitive.multiple_results else [outs]
    env.update(zip(eqn.outvars, outs))
  return [read(v) for v in jaxpr.outvars]


def canonical_convolutions(fn: Callable) -> Callable:
  """`fn` with every convolution of its program in XLA:CPU's fast layout (`_canonical_conv`):
  for a function that runs inside a loop body, where XLA:CPU does not canonicalize."""

  def wrapped(*args):
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    outs = _eval_canonical(closed.jaxpr, closed.consts, *jax.tree.leaves(args))
    return jax.tree.unflatten(jax.tree.structure(out_shape), outs)

  return wrapped


def accum_loop(grad_fn: Callable, params, model_state, micro: dict, rngs: dict) -> str:
  """The loop 'auto' runs: 'scan+canonical' where the scan body's convolutions are rewritten to
  the layout of XLA:CPU's fast kernels (on a CPU, for a gradient that holds a convolution), else
  'scan' (see the module docstring)."""
  if jax.default_backend() != "cpu":
    return "scan"
  jaxpr = jax.make_jaxpr(grad_fn)(params, model_state, micro, rngs).jaxpr
  return "scan+canonical" if _holds_convolution(jaxpr) else "scan"


def _share(weight_fn: Callable | None, part: dict, w_whole):
  """W(part) / W(whole) for a task whose loss divides by W (`Task.loss_weight`), else None
  (every row weighs the same). A whole with W = 0 (nothing scored) gives every part share 0:
  its loss and gradient are 0, as a single step's would be."""
  if w_whole is None:
    return None
  return weight_fn(part) / jnp.maximum(w_whole, 1e-12)


def accumulate_gradients(grad_fn: Callable, params, model_state, batch: dict, rngs: dict,
                         n: int, *, loop: str = "auto", weight_fn: Callable | None = None):
  """`grad_fn(params, model_state, batch, rngs) -> (grads, (loss, metrics, model_state))` over
  N microbatches (2.): the mean gradient (summed in float32), the mean loss and metrics, and the
  model state after the last microbatch. N = 1 calls `grad_fn` once on the whole batch.

  loop: 'scan' (a `lax.scan`: one microbatch's activations alive at a time), 'scan+canonical'
  (the same with `canonical_convolutions` in the body), 'unroll' (N copies of the microbatch
  step in the program, run in order; kept as the reference the bench compares with), or 'auto'
  (`accum_loop`).

  weight_fn: `Task.loss_weight`. For a loss L_i = S_i / W_i that divides a sum S_i by the
  microbatch's own weight W_i (its scored tokens), the mean of the L_i is not the whole batch's
  S / W: a microbatch with few scored tokens would count as much as one with many. With it the
  means are weighted, g = sum_i (W_i / W) grad L_i = grad S / W, and so are the loss and metrics:
  the whole batch's numbers.
  """
  if n == 1:
    return grad_fn(params, model_state, batch, rngs)
  micro_rngs = lambda i: {k: jax.random.fold_in(key, i) for k, key in rngs.items()}  # noqa: E731
  if loop == "auto":
    micro = jax.tree.map(lambda x: jax.ShapeDtypeStruct((x.shape[0] // n, *x.shape[1:]),
                                                        x.dtype), batch)
    loop = accum_loop(grad_fn, params, model_state, micro, micro_rngs(0))

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
  elif loop in ("scan", "scan+canonical"):
    rows_M = jnp.arange(jax.tree.leaves(batch)[0].shape[0] // n) * n
    micro_grad = canonical_convolutions(grad_fn) if loop == "scan+canonical" else grad_fn

    def body(carry, i):
      g_sum, state = carry
      # Rows i, i + N, ... gathered in the body: one microbatch is copied at a time, where a
      # split before the loop would copy (transpose) the whole batch.
      micro = jax.tree.map(lambda x: jnp.take(x, rows_M + i, axis=0), batch)
      grads, (loss, metrics, state) = micro_grad(params, state, micro, micro_rngs(i))
      share = _share(weight_fn, micro, w_whole)
      return (add(g_sum, grads, share), state), (loss, metrics, share)

    (g_sum, model_state), (loss_N, metrics_N, share_N) = jax.lax.scan(
        body, (g_sum, model_state), jnp.arange(n))
  else:
    raise ValueError(f"accumulate_gradients: loop {loop!r}; expected 'auto', 'scan', "
                     "'scan+canonical' or 'unroll'")
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
    jit: return the step jitted with the state donated (for single-device use); the parallel
      strategies wrap the un-jitted step themselves.
    grad_accum: N, the number of microbatches the batch is split into for one update (a scan,
      its convolutions canonicalized on a CPU, see `accum_loop`; gradients summed in float32).
      1: none.
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
