"""The debugging table as data, and a diagnosis of a run from its metrics history.

`SYMPTOMS[key]` holds the common causes and the first checks for each symptom of the course's
table; `CAUSES[key]` names the single causes the preflight can point at from evidence.
`diagnose_history(train, eval)` reads metrics.jsonl records (`jaxdl.train.writers.read_metrics`)
and returns the symptoms it sees, each with the numbers that triggered it.

Rules (L_s train loss at step s, E_s eval loss; thresholds are stated where used):
  first_loss      |L_first - ln K| > 0.5 ln K                      (only when K is known)
  nonfinite       some logged loss or grad norm is NaN or Inf
  flat            over the run, min L in the last quarter > 0.95 L_first
  spike           L_s > 5 x median m of the previous 10 logged losses and L_s - m > 0.1 L_first
                  (after the first 10% of the records)
  overfitting     E rose > 10% above its minimum at the last eval while L kept falling
  val_below_train E < 0.9 L at every eval in the second half of the run
  eval_mode       at every eval, from the first on: accuracy < train accuracy - 0.15 (without
                  accuracies: E > 2 L and E - L > 0.1 L_first)
  attn_logits     from the 'watch' records (train.watch='detailed'): the largest attention
                  logit a_s (max over layers) exceeds 50 and 5 x its first watched value; named
                  at the first such step, so it can come before a spike it leads to (a gap of
                  50 between logits makes softmax one-hot to e^-50: its gradient vanishes)
  dead_relus      from the 'watch' records: at the last watched step some layer's dead-ReLU
                  fraction (units zero for the whole batch) is >= 0.5; such units get no
                  gradient and do not come back
"""

from __future__ import annotations

import dataclasses
import math
import pathlib

import numpy as np


@dataclasses.dataclass(frozen=True)
class Symptom:
  title: str
  causes: str
  first_checks: str


SYMPTOMS: dict[str, Symptom] = {
    "first_loss": Symptom(
        "first loss far from ln K",
        "a last layer with too large weights at init; inputs not normalized; the loss summed "
        "instead of averaged; labels wrong or out of range",
        "shrink the last layer's init; look at input statistics, the loss reduction and a few "
        "(input, label) pairs"),
    "cannot_overfit": Symptom(
        "one small batch cannot be overfit",
        "inputs paired with the wrong targets; gradients not reaching or not updating some "
        "parameters (frozen, detached, symmetric); softmax applied before a cross-entropy that "
        "expects logits",
        "print shapes and a few labels; check which parameters change after a step"),
    "nonfinite": Symptom(
        "loss becomes NaN or Inf",
        "learning rate too high; fp16 overflow; log(0) or division by zero; one bad example",
        "locate the first non-finite tensor (jaxdl doctor --locate); try a 3x smaller learning "
        "rate; bf16 or loss scaling; add an epsilon"),
    "flat": Symptom(
        "loss flat from the start",
        "learning rate far off; dead ReLUs; bad (e.g. symmetric) init; unnormalized inputs; "
        "labels unrelated to the inputs",
        "LR range test (jaxdl doctor --lr-range); per-layer activation statistics"),
    "spike": Symptom(
        "loss spike in mid-training",
        "a bad batch; learning rate too high for the current curvature; a stale Adam second "
        "moment; output or attention logits growing",
        "gradient-norm history; rewind and skip the batch (train.spike_guard); clipping; "
        "beta2 = 0.95; qk-norm; z-loss"),
    "overfitting": Symptom(
        "training loss falls while validation loss rises",
        "overfitting",
        "regularize (weight decay, dropout), augment, stop early, more data"),
    "val_below_train": Symptom(
        "validation loss below training loss",
        "dropout or augmentation act only in training; the validation set is easier",
        "evaluate the training set in eval mode and compare"),
    "attn_logits": Symptom(
        "attention logits growing",
        "learning rate too high for the attention weights; q and k growing without a norm "
        "(no qk-norm), so softmax saturates and its gradient vanishes, then the loss spikes",
        "qk-norm (model.qk_norm=True); a lower peak learning rate or longer warmup; z-loss; "
        "softmax in fp32"),
    "dead_relus": Symptom(
        "dead ReLUs",
        "learning rate too high (a large update pushes the pre-activations negative for every "
        "input); a large negative bias; bad init; unnormalized inputs",
        "a lower learning rate or warmup; He init; normalize inputs; leaky ReLU / GELU"),
    "eval_mode": Symptom(
        "good in training, bad in evaluation",
        "eval mode forgotten (BatchNorm on batch statistics or dropout still on); different "
        "preprocessing in evaluation",
        "run the model on the same input in both modes and both pipelines"),
}

CAUSES: dict[str, str] = {
    "last_layer_too_large": "last layer too large at init (logits far from 0 at step 0)",
    "unnormalized_inputs": "inputs not normalized",
    "wrong_reduction": "loss summed over the batch instead of averaged",
    "wrong_labels": "labels outside 0 .. K-1",
    "labels_misaligned": "labels do not belong to their inputs (shuffled or misaligned targets)",
    "softmax_twice": "the model outputs probabilities, and the loss applies softmax again",
    "frozen_params": "some parameters never change (frozen, detached or zero gradients)",
    "symmetric_init": "symmetric init: every unit of a layer is identical and stays so "
                      "(e.g. all-zero init)",
    "lr_too_high": "learning rate too high (the loss diverges, then turns NaN/Inf)",
    "nonfinite_op": "a non-finite value at the very first step (log 0, division by 0, bad input)",
    "eval_mode_forgotten": "evaluation runs in training mode (batch statistics or dropout "
                           "in eval)",
    "recompiles": "the train step recompiles across batches (changing shapes or dtypes)",
    "vanishing_signal": "activations vanish with depth",
    "exploding_signal": "activations explode with depth",
    "bad_dtype": "parameters or logits not in fp32",
    "overfitting": "overfitting",
    "bad_batch": "a bad batch or too high a learning rate for the curvature",
    "flat_start": "learning rate far off, dead units or bad init",
}


@dataclasses.dataclass
class Diagnosis:
  symptom: str
  evidence: str
  step: int | None = None

  @property
  def title(self) -> str:
    return SYMPTOMS[self.symptom].title

  def text(self) -> str:
    s = SYMPTOMS[self.symptom]
    at = f" (step {self.step})" if self.step is not None else ""
    return (f"{s.title}{at}: {self.evidence}\n  common causes: {s.causes}\n"
            f"  first checks: {s.first_checks}")


def _finite(x) -> bool:
  return x is not None and math.isfinite(float(x))


def _near(records: list[dict], step: int, key: str, window: int = 3) -> float | None:
  """Mean of `key` over the `window` logged train records closest to `step`."""
  rows = sorted((r for r in records if key in r and _finite(r[key])),
                key=lambda r: abs(r["step"] - step))[:window]
  return float(np.mean([r[key] for r in rows])) if rows else None


def diagnose_history(train: list[dict], evals: list[dict] = (), *, ln_k: float | None = None,
                     events: list[dict] = (), watch: list[dict] = ()) -> list[Diagnosis]:
  """Symptoms visible in a run's metrics history (rules in the module docstring)."""
  out: list[Diagnosis] = _diagnose_watch(watch)
  train = sorted(train, key=lambda r: r["step"])
  evals = sorted(evals, key=lambda r: r["step"])
  bad = [r for r in train if not _finite(r.get("loss")) or
         ("grad_norm" in r and not _finite(r["grad_norm"]))]
  if bad or any(e.get("event") == "nonfinite" for e in events):
    step = bad[0]["step"] if bad else None
    out.append(Diagnosis("nonfinite", "a logged loss or gradient norm is not finite", step))
  train = [r for r in train if _finite(r.get("loss"))]
  if not train:
    return out
  losses = np.array([r["loss"] for r in train])
  first = losses[0]
  if ln_k is not None and train[0]["step"] <= 1 and abs(first - ln_k) > 0.5 * ln_k:
    out.append(Diagnosis("first_loss", f"first loss {first:.3g} vs ln K = {ln_k:.3g}",
                         train[0]["step"]))
  n = len(losses)
  if n >= 8 and losses[-max(2, n // 4):].min() > 0.95 * first:
    out.append(Diagnosis("flat", f"loss {first:.3g} -> {losses[-1]:.3g}: no real decrease"))
  start = max(10, n // 10)
  for i in range(start, n):
    med = float(np.median(losses[i - 10:i]))
    # Relative to the run's scale too: near a zero loss, small-batch noise is many x the median.
    if losses[i] > 5.0 * med and losses[i] - med > 0.1 * first:
      out.append(Diagnosis("spike", f"loss {losses[i]:.3g} > 5 x the running median "
                           f"{med:.3g}", train[i]["step"]))
      break
  rewinds = [e for e in events if e.get("event") == "rewind"]
  if rewinds and not any(d.symptom == "spike" for d in out):
    out.append(Diagnosis("spike", f"{len(rewinds)} rewind event(s) in metrics.jsonl",
                         rewinds[0].get("step")))
  evals = [r for r in evals if _finite(r.get("loss"))]
  if evals:
    out += _diagnose_eval(train, evals)
  return out


def _diagnose_watch(watch: list[dict]) -> list[Diagnosis]:
  """The attn_logits and dead_relus rules over the watch records (`jaxdl.train.watch`)."""
  return _diagnose_attention(watch) + _diagnose_dead_relus(watch)


def _diagnose_dead_relus(watch: list[dict]) -> list[Diagnosis]:
  probed = [r for r in sorted(watch, key=lambda r: r["step"])
            if any(k.startswith("dead_relu/") for k in r)]
  if not probed:
    return []
  last = probed[-1]
  dead = {k.removeprefix("dead_relu/"): v for k, v in last.items()
          if k.startswith("dead_relu/") and _finite(v) and v >= 0.5}
  if not dead:
    return []
  shown = ", ".join(f"{k} {v:.0%}" for k, v in sorted(dead.items(), key=lambda kv: -kv[1]))
  return [Diagnosis("dead_relus", f"dead ReLU units at step {last['step']}: {shown}",
                    last["step"])]


def _diagnose_attention(watch: list[dict]) -> list[Diagnosis]:
  series = []   # (step, the largest attention logit over the layers)
  for r in sorted(watch, key=lambda r: r["step"]):
    logits = [v for k, v in r.items() if k.startswith("attn_max_logit/") and _finite(v)]
    if logits:
      series.append((r["step"], max(logits)))
  if not series:
    return []
  first = series[0][1]
  for step, a in series:
    if a > 50.0 and a > 5.0 * max(first, 1e-3):
      return [Diagnosis("attn_logits", f"largest attention logit {a:.3g} at step {step}, "
                        f"{first:.3g} at step {series[0][0]}", step)]
  return []


def _diagnose_eval(train: list[dict], evals: list[dict]) -> list[Diagnosis]:
  out = []
  pairs = [(e, _near(train, e["step"], "loss"), _near(train, e["step"], "accuracy"))
           for e in evals]
  pairs = [p for p in pairs if p[1] is not None]
  if not pairs:
    return out
  gap_acc = [t_acc - e["accuracy"] for e, _, t_acc in pairs
             if t_acc is not None and "accuracy" in e]
  gap_loss = [e["loss"] / max(t_loss, 1e-8) for e, t_loss, _ in pairs]
  first = train[0]["loss"]
  # With accuracies, their gap decides (a memorized training set makes any loss ratio large);
  # without, the eval loss must exceed twice the training loss by a visible margin.
  if (gap_acc and min(gap_acc) > 0.15) or (not gap_acc and min(gap_loss) > 2.0 and min(
      e["loss"] - t for e, t, _ in pairs) > 0.1 * first):
    e, t_loss, t_acc = pairs[-1]
    acc = (f", accuracy train {t_acc:.3f} vs eval {e['accuracy']:.3f}"
           if t_acc is not None and "accuracy" in e else "")
    out.append(Diagnosis("eval_mode", f"eval loss {e['loss']:.3g} vs train {t_loss:.3g}{acc}, "
                         f"from the first eval on", e["step"]))
    return out
  eval_losses = np.array([e["loss"] for e, _, _ in pairs])
  best = int(np.argmin(eval_losses))
  if (len(pairs) >= 3 and best < len(pairs) - 1 and eval_losses[-1] > 1.1 * eval_losses[best]
      and pairs[-1][1] < pairs[best][1]):
    out.append(Diagnosis("overfitting", f"eval loss {eval_losses[best]:.3g} at step "
                         f"{pairs[best][0]['step']} -> {eval_losses[-1]:.3g}; train loss "
                         f"{pairs[best][1]:.3g} -> {pairs[-1][1]:.3g}", pairs[-1][0]["step"]))
  second_half = pairs[len(pairs) // 2:]
  if len(pairs) >= 2 and all(e["loss"] < 0.9 * t for e, t, _ in second_half):
    e, t, _ = pairs[-1]
    out.append(Diagnosis("val_below_train", f"eval loss {e['loss']:.3g} < train {t:.3g}",
                         e["step"]))
  return out


def diagnose_workdir(workdir, ln_k: float | None = None) -> list[Diagnosis]:
  """`diagnose_history` on workdir/metrics.jsonl (train and eval records, events; a torn line
  is skipped with one warning, a `null` value counts as non-finite)."""
  from jaxdl.train.writers import read_records
  path = pathlib.Path(workdir) / "metrics.jsonl"
  if not path.exists():
    raise FileNotFoundError(f"workdir: {workdir} has no metrics.jsonl; run `jaxdl train` first")
  records = read_records(path)
  train = [r for r in records if r.get("split") == "train"]
  evals = [r for r in records if r.get("split") == "eval"]
  events = [r for r in records if "event" in r]
  watch = [r for r in records if r.get("split") == "watch"]
  return diagnose_history(train, evals, ln_k=ln_k, events=events, watch=watch)
