"""Plots of runs from their metrics.jsonl: a run's loss.png, and `jaxdl plot WORKDIR...`'s
figures (the command is `jaxdl.cli.plot`).

loss.png (written at the end of a run) has four panels over the step: train and eval loss, the
learning rate, the gradient norm (pre-clip) and the throughput (tokens/s for sequence tasks,
else examples/s). `jaxdl plot A B ...` overlays runs: loss against the step and against the
training time, t(s) = sum over logged intervals of (s_b - s_a) / steps_per_s (evaluation and
checkpoint time left out, as the throughput records measure it). `jaxdl plot --profile
WORKDIR` draws the run's profiler trace (`jaxdl.train.profiling.read_trace`): a timeline of the
profiled steps (host dispatch and device execution) and the time per op kind.
"""

from __future__ import annotations

import pathlib

import numpy as np

from jaxdl.train.writers import read_metrics

def _pyplot():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def _save(fig, out: pathlib.Path, plt) -> pathlib.Path:
  try:
    fig.tight_layout()
    fig.savefig(out, dpi=100)
  except OSError as e:  # name the file, whichever layer of matplotlib raised
    raise OSError(e.errno, e.strerror, str(out)) from e
  finally:
    plt.close(fig)
  return out


def _series(records: list[dict], key: str):
  rows = [r for r in records if r.get(key) is not None]   # null: non-finite, not drawn
  return [r["step"] for r in rows], [r[key] for r in rows]


def _loss_axis(ax, losses) -> None:
  losses = np.asarray(losses, float)
  if len(losses) and np.all(losses > 0) and losses.max() / max(losses.min(), 1e-12) > 50:
    ax.set_yscale("log")


def plot_run(workdir, title: str = "") -> pathlib.Path | None:
  """Writes workdir/loss.png (four panels); None when no finite train loss was logged."""
  workdir = pathlib.Path(workdir)
  train = read_metrics(workdir, "train")
  steps, losses = _series(train, "loss")
  if not steps:
    return None
  plt = _pyplot()
  fig, axes = plt.subplots(2, 2, figsize=(10, 6), sharex=True)
  ax = axes[0, 0]
  ax.plot(steps, losses, label="train")
  e_steps, e_losses = _series(read_metrics(workdir, "eval"), "loss")
  if e_steps:
    ax.plot(e_steps, e_losses, "o-", label="eval")
  _loss_axis(ax, losses)
  ax.set(ylabel="loss", title=title)
  ax.legend()
  for ax, key in ((axes[0, 1], "lr"), (axes[1, 0], "grad_norm")):
    ax.plot(*_series(train, key))
    ax.set(ylabel=key)
  rates = read_metrics(workdir, "throughput")
  key = "tokens_per_s" if any("tokens_per_s" in r for r in rates) else "examples_per_s"
  axes[1, 1].plot(*_series(rates, key))
  axes[1, 1].set(ylabel=key.replace("_per_s", "/s"))
  for ax in axes[1]:
    ax.set_xlabel("step")
  return _save(fig, workdir / "loss.png", plt)


def training_seconds(workdir) -> tuple[list[int], list[float]]:
  """(steps, cumulative training seconds) from the throughput records."""
  steps, seconds, t, last = [], [], 0.0, None
  for r in read_metrics(workdir, "throughput"):
    if last is not None and r["step"] > last and r.get("steps_per_s"):
      t += (r["step"] - last) / r["steps_per_s"]
      steps.append(r["step"])
      seconds.append(t)
    last = r["step"]
  return steps, seconds


def plot_runs(workdirs, out, labels=None, last_steps=None) -> pathlib.Path:
  """Overlays the train loss of several runs, against the step and the training time; each
  labelled by `labels` (default its workdir's name) and drawn up to its step in `last_steps`
  (None: all of it; a run stopped at a step it went on past, a pruned trial)."""
  plt = _pyplot()
  fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  all_losses = []
  for i, workdir in enumerate(workdirs):
    label = labels[i] if labels else pathlib.Path(workdir).name
    last = last_steps[i] if last_steps and last_steps[i] is not None else float("inf")
    steps, losses = _series([r for r in read_metrics(workdir, "train") if r["step"] <= last],
                            "loss")
    all_losses += losses
    by_step.plot(steps, losses, label=label)
    t_steps, seconds = training_seconds(workdir)
    at = dict(zip(steps, losses))
    by_time.plot([t for s, t in zip(t_steps, seconds) if s in at],
                 [at[s] for s in t_steps if s in at], label=label)
  _loss_axis(by_step, all_losses)
  by_step.set(xlabel="step", ylabel="train loss")
  by_time.set(xlabel="training seconds (eval and checkpoints excluded)")
  by_step.legend()
  return _save(fig, pathlib.Path(out), plt)


def plot_profile(workdir, out, top: int = 10) -> pathlib.Path:
  """The trace of workdir/profile/: per-step timeline and the `top` op kinds by time."""
  from jaxdl.train.profiling import read_trace
  trace = read_trace(workdir)
  plt = _pyplot()
  fig, (timeline, ops) = plt.subplots(2, 1, figsize=(10, 6),
                                      gridspec_kw={"height_ratios": [1, 1.6]})
  modules = sorted({m for m, _, _ in trace.executions})
  rows = ["host: dispatch"] + [f"device: {m}" for m in modules]
  timeline.broken_barh([(a, d) for _, a, d in trace.steps], (0.6, 0.8), color="tab:gray")
  for step, a, _ in trace.steps:
    timeline.annotate(f"step {step}", (a, 1.45), fontsize=8)
  colors = plt.get_cmap("tab10")
  for i, m in enumerate(modules, start=1):
    timeline.broken_barh([(a, d) for name, a, d in trace.executions if name == m],
                         (i + 0.6, 0.8), color=colors(i % 10))
  timeline.set(yticks=[i + 1 for i in range(len(rows))], yticklabels=rows, xlabel="ms",
               ylim=(0.4, len(rows) + 0.6), title=f"profile of {pathlib.Path(workdir).name}: "
               f"steps {trace.steps[0][0]}-{trace.steps[-1][0]}" if trace.steps else "profile")
  kinds = list(trace.op_ms.items())
  shown = kinds[:top] + ([("other", sum(v for _, v in kinds[top:]))] if kinds[top:] else [])
  per_step = max(len(trace.steps), 1)
  ops.barh([k for k, _ in shown][::-1], [v / per_step for _, v in shown][::-1])
  ops.set(xlabel="ms per profiled step (summed over op threads)", title="time by op kind")
  return _save(fig, pathlib.Path(out), plt)
