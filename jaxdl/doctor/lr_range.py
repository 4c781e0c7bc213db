"""LR range test: one short run with an exponentially increasing learning rate.

Step t of N uses eta_t = eta_min (eta_max / eta_min)^(t / (N - 1)), applied by scaling the
experiment's own optimizer built at lr 1 with a constant schedule (every jaxdl update rule is
linear in its learning rate, decoupled weight decay included). The loss is smoothed with a
bias-corrected EMA, l_t = (beta l_{t-1} + (1 - beta) L_t) / (1 - beta^(t+1)), beta = 0.9; the
sweep stops once l_t > 4 min l or L_t is not finite.

Suggested lr: one tenth of the lr at the minimum of the smoothed loss (the minimum sits at the
edge of divergence; a tenth of it is the usual safe choice). Also reported: the lr of the
steepest descent of l against log eta.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdl import optim as joptim
from jaxdl.doctor.context import prepare
from jaxdl.doctor.report import Finding
from jaxdl.train.accumulation import compiler_options
from jaxdl.train.step import make_train_step


@dataclasses.dataclass
class LRRange:
  lrs: np.ndarray           # eta_t of the steps taken
  losses: np.ndarray        # L_t (raw)
  smoothed: np.ndarray      # l_t
  suggested: float          # 0.1 x argmin_t l_t
  steepest: float           # eta at the most negative d l / d log eta
  diverged_at: float | None  # eta where the sweep stopped, None if it ran to eta_max
  current: float            # the experiment's optim.lr
  plot: str | None = None

  def check(self) -> Finding:
    ratio = self.current / self.suggested if self.suggested > 0 else float("inf")
    summary = (f"suggested lr {self.suggested:.3g} (min loss at {10 * self.suggested:.3g}, "
               f"steepest descent at {self.steepest:.3g}); experiment lr {self.current:.3g}"
               + (f"; plot {self.plot}" if self.plot else ""))
    values = dict(suggested=self.suggested, steepest=self.steepest, current=self.current,
                  diverged_at=self.diverged_at)
    if self.diverged_at is not None and self.current >= self.diverged_at:
      return Finding("lr_range", "warn", summary + f"; the loss diverged from lr "
                   f"{self.diverged_at:.3g} on", symptom="nonfinite", cause="lr_too_high",
                   values=values)
    if not 0.01 <= ratio <= 30:
      return Finding("lr_range", "warn", summary + f": the experiment's lr is {ratio:.3g}x the "
                   "suggestion", symptom="flat", cause="flat_start", values=values)
    return Finding("lr_range", "pass", summary, values=values)


def _smooth(losses: np.ndarray, beta: float = 0.9) -> np.ndarray:
  out, avg = [], 0.0
  for t, x in enumerate(losses):
    avg = beta * avg + (1 - beta) * x
    out.append(avg / (1 - beta ** (t + 1)))
  return np.array(out)


def lr_range_test(config, *, steps: int = 100, lr_min: float = 1e-6, lr_max: float = 10.0,
                  plot_path: str | None = None) -> LRRange:
  """Sweeps eta from `lr_min` to `lr_max` over `steps` steps of the experiment's training stream."""
  if not 0 < lr_min < lr_max:
    raise ValueError(f"lr range: need 0 < lr_min < lr_max, got {lr_min}, {lr_max}")
  ctx = prepare(config, steps=1)
  # The experiment's optimizer at a unit, constant lr; the sweep multiplies it by eta(t).
  unit = dataclasses.replace(ctx.optim, lr=1.0,
                             schedule=joptim.schedules.Constant(warmup_frac=0.0))
  unit_tx, _ = unit.build(steps)
  ratio = math.log(lr_max / lr_min)

  def lr_at(t):
    return lr_min * jnp.exp(ratio * t / max(steps - 1, 1))

  tx = optax.chain(unit_tx, optax.scale_by_schedule(lr_at))
  step_fn = jax.jit(make_train_step(ctx.model.apply, ctx.task.loss_fn, tx, lr_at, ctx.base_key,
                                    grad_accum=ctx.grad_accum,
                                    loss_weight=ctx.task.loss_weight),
                    compiler_options=compiler_options(ctx.grad_accum))
  state = ctx.state.replace(opt_state=tx.init(ctx.state.params))
  it = ctx.ds.train_iter()
  lrs, losses, best, diverged = [], [], math.inf, None
  for t in range(steps):
    state, metrics = step_fn(state, next(it))
    loss = float(metrics["loss"])
    lrs.append(float(metrics["lr"]))
    losses.append(loss)
    if not math.isfinite(loss):
      diverged = lrs[-1]
      break
    smooth = _smooth(np.array(losses))[-1]
    best = min(best, smooth)
    if t > 5 and smooth > 4 * best:
      diverged = lrs[-1]
      break
  lrs_a, losses_a = np.array(lrs), np.array(losses)
  finite = np.isfinite(losses_a)
  smoothed = _smooth(losses_a[finite])
  lr_f = lrs_a[finite]
  i_min = int(np.argmin(smoothed))
  slope = np.gradient(smoothed, np.log(lr_f)) if len(lr_f) > 2 else np.zeros_like(smoothed)
  result = LRRange(lrs_a, losses_a, smoothed, float(lr_f[i_min] / 10),
                   float(lr_f[int(np.argmin(slope[: i_min + 1]))]), diverged,
                   float(config.optim.lr))
  if plot_path:
    result.plot = _plot(result, plot_path, config.name)
  return result


def _plot(r: LRRange, path: str, title: str) -> str:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4))
  finite = np.isfinite(r.losses)
  ax.plot(r.lrs[finite], r.losses[finite], alpha=0.35, label="loss")
  ax.plot(r.lrs[finite], r.smoothed, label="smoothed loss")
  ax.axvline(r.suggested, color="g", ls="--", label=f"suggested {r.suggested:.2g}")
  ax.axvline(r.current, color="k", ls=":", label=f"experiment lr {r.current:.2g}")
  ax.set_xscale("log")
  top = np.nanmax(r.smoothed[: max(2, len(r.smoothed) // 2)]) * 2
  ax.set_ylim(min(np.nanmin(r.smoothed) * 0.9, top / 4), top)
  ax.set_xlabel("learning rate")
  ax.set_ylabel("training loss")
  ax.set_title(f"LR range test: {title}")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return str(path)
