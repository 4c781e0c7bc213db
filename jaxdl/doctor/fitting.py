"""The preflight checks that train: first steps, one-batch overfit, learnability, eval mode.

Thresholds and what each measures are listed in `jaxdl.doctor.preflight`'s docstring. The
overfit and learnability fits use a reference optimizer (Adam, lr 3e-3, no decay, no clipping)
run inside one `lax.scan`, so their verdict is about the model, data and loss, not the
experiment's tuning; the first-steps check uses the experiment's own optimizer and schedule.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdl.doctor import probes
from jaxdl.doctor.context import Context, loss as _loss
from jaxdl.doctor.report import Finding
from jaxdl.train.accumulation import accumulate_gradients, compiler_options
from jaxdl.train.step import make_train_step, step_rngs

REF_LR = 3e-3


def check_first_steps(ctx: Context) -> list[Finding]:
  """S real train steps: stability, recompilation count, and units that stay identical."""
  traces = [0]
  step_fn = make_train_step(ctx.model.apply, ctx.task.loss_fn, ctx.tx, ctx.schedule, ctx.base_key,
                           grad_accum=ctx.grad_accum, loss_weight=ctx.task.loss_weight)

  def counted(state, batch):
    traces[0] += 1  # runs once per trace, never when a compiled version is reused
    return step_fn(state, batch)

  train_fn = jax.jit(counted, compiler_options=compiler_options(ctx.grad_accum))
  state, losses, norms, bad_at = ctx.state, [], [], None
  for i, batch in enumerate(ctx.batches):
    state, metrics = train_fn(state, batch)
    metrics = jax.device_get(metrics)
    losses.append(float(metrics["loss"]))
    norms.append(float(metrics["grad_norm"]))
    if not (math.isfinite(losses[-1]) and math.isfinite(norms[-1])):
      bad_at = i
      break
  n = len(losses)
  trace = " ".join(f"{x:.3g}" for x in losses[:: max(1, n // 10)])
  values = dict(losses=losses, grad_norms=norms, lr=float(ctx.schedule(0)))
  lr = float(ctx.schedule(max(n - 1, 0)))
  if bad_at is not None:
    finite = [g for g in norms if math.isfinite(g)]
    grew = len(finite) >= 2 and finite[-1] > 10 * finite[0]
    cause = "lr_too_high" if bad_at > 0 else "nonfinite_op"
    causes = [f"gradient norm {finite[0]:.3g} -> {finite[-1]:.3g} before that"] if grew else []
    if bad_at > 0:
      causes.append(f"learning rate {lr:.3g}: try 3x smaller, or clipping")
    if ctx.config.train.precision == "fp16":
      causes.append("fp16 overflow: use bf16 or loss scaling")
    stability = Finding("first_steps", "fail", f"loss/grad norm non-finite at step {bad_at} of "
                      f"{len(ctx.batches)} (losses {trace})", symptom="nonfinite", cause=cause,
                      causes=tuple(causes), values=values)
  elif n >= 4 and losses[-1] > 2 * losses[0]:
    stability = Finding("first_steps", "warn", f"loss rose {losses[0]:.3g} -> {losses[-1]:.3g} in "
                      f"{n} steps (lr {lr:.3g})", symptom="nonfinite", cause="lr_too_high",
                      values=values)
  else:
    stability = Finding("first_steps", "pass", f"{n} steps, loss {losses[0]:.4g} -> "
                      f"{losses[-1]:.4g}, grad norm {norms[0]:.3g} -> {norms[-1]:.3g}",
                      values=values)
  compiles = Finding("recompilation", "pass" if traces[0] == 1 else "fail",
                   f"the train step was traced {traces[0]} time(s) over {n} batches",
                   symptom="", cause="" if traces[0] == 1 else "recompiles",
                   values={"traces": traces[0]})
  same0 = probes.identical_units(ctx.state.params)
  same = [p for p in probes.identical_units(state.params) if p in same0] if bad_at is None else []
  if same:
    sym = Finding("symmetry", "fail", f"every unit of {', '.join(same)} is identical at init and "
                f"still after {n} steps", symptom="cannot_overfit", cause="symmetric_init",
                causes=("initialize kernels randomly (He/LeCun); zero init keeps units identical",),
                values={"identical": same})
  elif same0:
    sym = Finding("symmetry", "pass", f"identical units at init in {', '.join(same0)}, broken by "
                "training (e.g. a zero-initialized projection)", values={"identical": []})
  else:
    sym = Finding("symmetry", "pass", "all kernels have distinct units", values={"identical": []})
  return [stability, compiles, sym]


CHUNK = 20  # scan length per call: the overfit and learnability fits share one compiled chunk


def _fit_chunk(ctx: Context, grad_accum: int):
  """Jitted `(params, model_state, opt_state, batches, steps) -> (..., losses)`: Adam(REF_LR)
  over CHUNK stacked batches in one scan, each batch split into `grad_accum` microbatches (the
  experiment's train.grad_accum for its own batches, so a batch that only fits in memory that
  way fits here too); built once per context and split."""
  if ("fit", grad_accum) in ctx.cache:
    return ctx.cache["fit", grad_accum]
  tx = optax.adam(REF_LR)

  def objective(p, model_state, batch, rngs):
    loss, (metrics, new_state) = ctx.task.loss_fn(ctx.model.apply, p, model_state, batch, rngs,
                                                  True)
    return loss, (loss, metrics, new_state)

  def one(carry, xs):
    params, model_state, opt_state = carry
    batch, s = xs
    g, (loss, _, new_state) = accumulate_gradients(
        jax.grad(objective, has_aux=True), params, model_state, batch,
        step_rngs(ctx.base_key, s), grad_accum, weight_fn=ctx.task.loss_weight)
    updates, opt_state = tx.update(g, opt_state, params)
    return (optax.apply_updates(params, updates), new_state, opt_state), loss

  @functools.partial(jax.jit, compiler_options=compiler_options(grad_accum))
  def chunk(params, model_state, opt_state, batches, steps):
    (params, model_state, opt_state), losses = jax.lax.scan(
        one, (params, model_state, opt_state), (batches, steps))
    return params, model_state, opt_state, losses

  ctx.cache["fit", grad_accum] = (tx, chunk)
  return ctx.cache["fit", grad_accum]


def _fit(ctx: Context, params, model_state, batches, steps: int, stop_below: float = -1.0,
         grad_accum: int = 1):
  """Fits `batches(i) -> batch` for `steps` steps (whole chunks), stopping after the chunk in
  which the loss first falls to `stop_below`; returns (params, model_state, losses)."""
  tx, chunk = _fit_chunk(ctx, grad_accum)
  opt_state = tx.init(params)
  losses = []
  for c0 in range(0, steps, CHUNK):
    stacked = [batches(i) for i in range(c0, c0 + CHUNK)]
    stacked = {k: np.stack([b[k] for b in stacked]) for k in stacked[0]}
    params, model_state, opt_state, part = chunk(params, model_state, opt_state, stacked,
                                                 jnp.arange(c0, c0 + CHUNK))
    losses += list(np.asarray(part))
    if min(part) <= stop_below:
      break
  return params, model_state, np.asarray(losses)


def heldout_loss(ctx: Context, params, model_state) -> float:
  """Eval-mode task loss on the held-out batch (jitted once per context)."""
  if "heldout" not in ctx.cache:
    ctx.cache["heldout"] = jax.jit(lambda p, m, b: _loss(ctx, p, m, b, False)[0])
  return float(ctx.cache["heldout"](params, model_state, ctx.eval_batch))


def check_overfit(ctx: Context, steps: int = 200) -> Finding:
  first = ctx.batches[0]
  rows = 8 if ctx.task.kind.sequence_model else 32
  batch = {k: np.asarray(v)[:rows] for k, v in first.items()}
  ref = ctx.ln_k if ctx.ln_k is not None else float(
      _loss(ctx, ctx.state.params, ctx.state.model_state, batch, True)[0])
  # Denoising / flow-matching losses draw fresh noise every step and keep an irreducible floor,
  # so near 0 is out of reach even for a perfect fit: there, a 30% drop is what is asked.
  target = 0.1 * ref if ctx.task.kind.supervised else 0.7 * ref
  params, _, losses = _fit(ctx, ctx.state.params, ctx.state.model_state, lambda i: batch, steps,
                           stop_below=target)
  below = np.nonzero(losses <= target)[0]
  values = dict(first=float(losses[0]), last=float(losses[-1]), best=float(np.nanmin(losses)),
                target=target, steps=steps, rows=len(next(iter(batch.values()))))
  if below.size:
    values["steps_to_target"] = int(below[0] + 1)
    return Finding("overfit", "pass", f"{values['rows']} rows: loss {losses[0]:.3g} -> "
                 f"{target:.3g} in {below[0] + 1} of {steps} steps", values=values)
  frozen = probes.unchanged(ctx.state.params, params)
  total = len(jax.tree.leaves(params))
  causes = []
  cause = "labels_misaligned" if ctx.task.kind.supervised else ""
  if frozen:
    cause = "frozen_params"
    causes.append(f"{len(frozen)} of {total} arrays never changed: {', '.join(frozen[:4])}")
  same = probes.identical_units(params)
  if same:
    cause = "symmetric_init"
    causes.append(f"units still identical after fitting: {', '.join(same[:4])}")
  causes.append("check that inputs and targets are paired, and that the loss takes logits")
  return Finding("overfit", "fail", f"{values['rows']} rows, {steps} steps: loss {losses[0]:.3g} "
               f"-> {losses[-1]:.3g}, never below {target:.3g}", symptom="cannot_overfit",
               cause=cause, causes=tuple(causes), values=values)


def check_learnable(ctx: Context, steps: int = 100, overfit: Finding | None = None):
  """Fits the stream, then measures the held-out loss; returns (Finding, trained params, state)."""
  if ctx.eval_batch is None or not ctx.task.kind.supervised:
    return (Finding("learnable", "skip", f"no held-out split or task {ctx.task.kind.name!r} "
                    "(no targets to hold out)"),
            ctx.state.params, ctx.state.model_state)
  it = ctx.ds.train_iter()
  before = heldout_loss(ctx, ctx.state.params, ctx.state.model_state)
  params, model_state, losses = _fit(ctx, ctx.state.params, ctx.state.model_state,
                                     lambda i: next(it), steps,
                                     grad_accum=ctx.grad_accum)
  after = heldout_loss(ctx, params, model_state)
  base = ctx.ln_k if ctx.ln_k is not None else before
  tail = float(np.mean(losses[-10:]))
  values = dict(heldout_before=before, heldout_after=after, baseline=base, train_tail=tail)
  summary = (f"{steps} steps: held-out loss {before:.3g} -> {after:.3g} "
             f"(baseline {base:.3g}; train loss at the end {tail:.3g})")
  if math.isfinite(after) and after <= 0.9 * base:
    return Finding("learnable", "pass", summary, values=values), params, model_state
  if overfit is not None and overfit.status == "fail":
    # The model cannot even fit one batch: that failure's cause explains this one too.
    return (Finding("learnable", "fail", summary + "; see overfit", symptom="flat",
                  cause=overfit.cause, values=values), params, model_state)
  return (Finding("learnable", "fail", summary + ": the model fits one batch, yet nothing it "
                "learns carries over to new inputs", symptom="flat", cause="labels_misaligned",
                causes=("labels shuffled against the inputs, or targets from another example",
                        "print a few (input, label) pairs from the training stream"),
                values=values), params, model_state)


def check_eval_mode(ctx: Context, params, model_state) -> Finding:
  if ctx.eval_batch is None or not ctx.task.kind.supervised:
    return Finding("eval_mode", "skip", f"no held-out split or task {ctx.task.kind.name!r} "
                   "(no targets to hold out)")
  x = np.asarray(ctx.task.init_input(ctx.eval_batch))
  if len(x) < 16:
    return Finding("eval_mode", "skip", f"eval batch of {len(x)} rows; 16 needed")
  variables = {"params": params, **model_state}
  try:
    y16 = np.asarray(ctx.model.apply(variables, x[:16], train=False), np.float32)
    y8 = np.asarray(ctx.model.apply(variables, x[:8], train=False), np.float32)
  except Exception as e:  # noqa: BLE001 -- e.g. dropout asking for an rng in eval
    return Finding("eval_mode", "fail", f"eval-mode forward failed: {type(e).__name__}: "
                 f"{str(e).splitlines()[0][:160]}", symptom="eval_mode",
                 cause="eval_mode_forgotten")
  diff = float(np.max(np.abs(y16[:8] - y8)))
  tol = 1e-4 * (1.0 + float(np.max(np.abs(y16))))
  summary = (f"eval outputs of 8 examples in a batch of 8 vs 16 differ by {diff:.3g} "
             f"(tolerance {tol:.2g})")
  if diff <= tol:
    return Finding("eval_mode", "pass", summary, values={"diff": diff})
  return Finding("eval_mode", "fail", summary + ": predictions depend on the rest of the batch",
               symptom="eval_mode", cause="eval_mode_forgotten",
               causes=("BatchNorm uses batch statistics in eval: pass train=False down to it",),
               values={"diff": diff})
