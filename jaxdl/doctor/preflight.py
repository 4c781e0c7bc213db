"""Preflight: the checks to run before a long training run, on the experiment's own pieces.

`run_preflight(config) -> Report` builds the run exactly as `jaxdl.train.run` does (same data
stream, init key, base key, model with the precision policy's dtype) and measures:

  first_loss     L0 = task loss on the first batch at init vs ln K (K classes; V for a language
                 model; 2 for a binary head). pass |L0 - ln K| <= 0.25 ln K + 0.1, fail beyond
                 ln K (i.e. L0 > 2 ln K); skipped, with the reason, without such a head.
  init_stats     per-module E[h^2] of the outputs at init (variance propagation) and per-array
                 gradient norms ||dL/dW||; warns when the signal ratio last/first hidden layer is
                 outside [1e-3, 1e3] or some arrays get exactly zero gradient; fails on non-finite.
  dtypes         parameter and activation dtypes (params and logits should be fp32).
  weight_decay   `jaxdl.optim.decay_table`; warns when norms/biases are decayed.
  first_steps    S steps of the real train step (experiment optimizer and schedule): fails on a
                 non-finite loss or gradient norm; also the recompilation count (traces of the
                 step over S different batches must be 1) and the unit-symmetry check (kernels
                 whose units are identical at init and still identical after S steps).
  overfit        one small batch (<= 32 rows; <= 8 sequences), Adam 3e-3, up to `overfit_steps`:
                 pass when the loss falls below 0.1 x ln K (0.1 x L0 without K; 0.7 x L0 for
                 generative losses, which keep a noise floor).
  learnable      `learn_steps` Adam 3e-3 steps on the stream, then the eval-mode loss on held-out
                 data: fails when it stays above 0.9 x ln K (x L0 without K): no signal from the
                 inputs to the labels.
  eval_mode      eval-mode outputs of the same 8 examples computed in a batch of 8 and of 16 must
                 agree (|diff| <= 1e-4 (1 + max|y|)); a difference means batch statistics (or
                 randomness) in evaluation.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from jaxdl import optim as joptim
from jaxdl.doctor import fitting, probes
from jaxdl.doctor.context import Context, loss as _loss, prepare
from jaxdl.doctor.report import Finding, Report
from jaxdl.train.tasks import Family

def init_outputs(ctx: Context):
  """(loss, [(module, output)]) of the first batch at init in training mode, computed once."""
  if ctx.cache.get("init") is None:
    def run(apply_fn, params, model_state, batch):
      return _loss(ctx, params, model_state, batch, True, apply_fn=apply_fn)[0]
    ctx.cache["init"] = probes.captured(ctx.model, run, ctx.state.params, ctx.state.model_state,
                                        ctx.batches[0])
  return ctx.cache["init"]


def check_first_loss(ctx: Context) -> Finding:
  batch = ctx.batches[0]
  if ctx.ln_k is None:
    return Finding("first_loss", "skip", f"task {ctx.config.task!r} "
                   f"(family {ctx.task.kind.family.value!r}) has "
                 "no classification or language-model head, so no ln K to compare with")
  loss, outs = init_outputs(ctx)
  loss, k, ln_k = float(loss), ctx.num_classes, ctx.ln_k
  logits = np.asarray(outs[-1][1], np.float32)
  x, y = np.asarray(batch["x"]), np.asarray(batch["y"])
  values = dict(loss=loss, ln_k=ln_k, k=k, logit_std=float(logits.std()))
  summary = f"first loss {loss:.4g} vs ln K = {ln_k:.4g} (K = {k}, logit std {logits.std():.3g})"
  if math.isfinite(loss) and abs(loss - ln_k) <= 0.25 * ln_k + 0.1:
    return Finding("first_loss", "pass", summary, values=values)
  causes, cause = [], ""
  # A mean does not depend on the batch size; a sum doubles with twice the rows.
  half = {k: np.asarray(v)[: len(y) // 2] for k, v in batch.items()}
  ratio = loss / float(jax.jit(lambda b: _loss(ctx, ctx.state.params, ctx.state.model_state, b,
                                               True)[0])(half))
  values["full_over_half"] = ratio
  if math.isfinite(ratio) and ratio > 1.6:
    cause = "wrong_reduction"
    causes.append(f"loss(B) / loss(B/2) = {ratio:.2f}: the loss grows with the batch (a sum)")
  if ctx.task.kind.family in (Family.CLASSIFICATION, Family.LM) and (y.min() < 0 or y.max() >= k):
    cause = cause or "wrong_labels"
    causes.append(f"labels span {y.min()} .. {y.max()}, expected 0 .. {k - 1}")
  if np.issubdtype(x.dtype, np.floating) and (abs(x.mean()) > 3 or x.std() > 10):
    cause = cause or "unnormalized_inputs"
    causes.append(f"inputs have mean {x.mean():.3g} and std {x.std():.3g}")
  if logits.ndim >= 2 and logits.min() >= 0 and np.allclose(logits.sum(-1), 1, atol=1e-3):
    cause = cause or "softmax_twice"
    causes.append("model outputs are nonnegative rows summing to 1: probabilities, not logits")
  if logits.std() > 2.0:
    cause = cause or "last_layer_too_large"
    causes.append(f"logits have std {logits.std():.3g} at init (about 1 or less is usual): "
                  "scale the last layer's init down")
  status = "warn" if math.isfinite(loss) and loss <= 2 * ln_k else "fail"
  return Finding("first_loss", status, summary, symptom="first_loss", cause=cause,
               causes=tuple(causes), values=values)


def check_init_stats(ctx: Context) -> Finding:
  _, outs = init_outputs(ctx)
  grads = jax.jit(jax.grad(lambda p, b: _loss(ctx, p, ctx.state.model_state, b, True)[0]))(
      ctx.state.params, ctx.batches[0])
  rows = [(name, probes.second_moment(x), str(x.dtype)) for name, x in outs]
  norms = probes.leaf_norms(grads)
  lines = ["module outputs at init: E[h^2]"] + [f"  {n:<32} {m:10.4g}" for n, m, _ in rows]
  lines += ["gradient norms at init: ||dL/dW||"] + [f"  {n:<32} {g:10.4g}" for n, g in norms]
  values = {"second_moments": {n: m for n, m, _ in rows}, "grad_norms": dict(norms)}
  nonfinite = [n for n, x in outs if not probes.is_finite(x)]
  bad_grads = [n for n, g in norms if not math.isfinite(g)]
  if nonfinite or bad_grads:
    return Finding("init_stats", "fail", f"non-finite at init: {(nonfinite + bad_grads)[0]}",
                 symptom="nonfinite", cause="nonfinite_op", details="\n".join(lines),
                 values=values)
  hidden = [m for n, m, _ in rows[:-2] if m == m]  # not the head, nor the model output
  problems, cause = [], ""
  if len(hidden) >= 2 and hidden[0] > 0:
    ratio = hidden[-1] / hidden[0]
    values["depth_ratio"] = ratio
    if ratio < 1e-3 or ratio > 1e3:
      cause = "vanishing_signal" if ratio < 1e-3 else "exploding_signal"
      problems.append(f"E[h^2] last/first module = {ratio:.3g}")
  dead = [n for n, m, _ in rows[:-1] if m == 0.0]
  if dead:
    cause = cause or "vanishing_signal"
    problems.append(f"outputs exactly 0: {', '.join(dead[:4])}")
  zero = [n for n, g in norms if g == 0.0]
  if zero:
    cause = cause or "frozen_params"
    problems.append(f"{len(zero)} of {len(norms)} arrays get zero gradient "
                    f"({', '.join(zero[:4])})")
  summary = (f"{len(rows)} module outputs, {len(norms)} parameter arrays"
             + ("; " + "; ".join(problems) if problems else ": signal and gradients healthy"))
  return Finding("init_stats", "warn" if problems else "pass", summary,
               symptom="flat" if problems else "", cause=cause, details="\n".join(lines),
               values=values)


def check_dtypes(ctx: Context) -> Finding:
  _, outs = init_outputs(ctx)
  params = probes.dtype_counts(ctx.state.params)
  acts: dict[str, list[str]] = {}
  for name, x in outs:
    acts.setdefault(str(x.dtype), []).append(name)
  low = {d: names for d, names in acts.items() if d in ("bfloat16", "float16")}
  logits_dtype = str(outs[-1][1].dtype) if outs else "?"
  summary = (f"policy {ctx.config.train.precision}: params " +
             ", ".join(f"{n} {d}" for d, n in params.items()) + "; activations " +
             ", ".join(f"{len(v)} {d}" for d, v in acts.items()) + f"; output {logits_dtype}")
  details = "\n".join(f"{d}: {', '.join(v[:8])}{' ...' if len(v) > 8 else ''}"
                      for d, v in low.items())
  bad = [d for d in params if d != "float32"] + ([logits_dtype]
                                                   if logits_dtype != "float32" else [])
  return Finding("dtypes", "warn" if bad else "pass", summary, cause="bad_dtype" if bad else "",
               causes=("master params and logits should stay fp32",) if bad else (),
               details=details, values={"params": params,
                                        "activations": {d: len(v) for d, v in acts.items()}})


def check_weight_decay(ctx: Context) -> Finding:
  table = joptim.decay_table(ctx.state.params, ctx.optim)
  pred = joptim.masks.path_predicate(ctx.optim.decay_mask, ctx.optim.decay_embeddings)
  paths = [probes.path_str(p) for p, _ in jax.tree_util.tree_leaves_with_path(ctx.state.params)]
  odd = [p for p in paths if pred(p) and p.rsplit("/", 1)[-1] in ("bias", "scale")]
  wd = ctx.optim.weight_decay
  summary = table.splitlines()[-1]
  if wd > 0 and odd:
    return Finding("weight_decay", "warn", summary + f"; biases/norm scales decayed: {odd[:3]}",
                 details=table)
  return Finding("weight_decay", "pass", summary, details=table)


def run_preflight(config, *, steps: int = 20, overfit_steps: int = 200,
                  learn_steps: int = 100) -> Report:
  """Runs every check on `config`; see the module docstring for what each measures.

  Args:
    config: a loaded experiment config (`jaxdl.config.load_config`).
    steps: S, real train steps for the stability / recompilation / symmetry checks.
    overfit_steps: the step budget to overfit one small batch.
    learn_steps: reference-optimizer steps on the stream before the held-out loss is measured.
  """
  ctx = prepare(config, steps)
  report = Report(config.name)
  report.add(check_first_loss(ctx))
  report.add(check_init_stats(ctx))
  report.add(check_dtypes(ctx))
  report.add(check_weight_decay(ctx))
  for check in fitting.check_first_steps(ctx):
    report.add(check)
  overfit = report.add(fitting.check_overfit(ctx, overfit_steps))
  learn, params, model_state = fitting.check_learnable(ctx, learn_steps, overfit)
  report.add(learn)
  report.add(fitting.check_eval_mode(ctx, params, model_state))
  return report
