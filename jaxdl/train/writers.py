"""Run artifacts: metrics.jsonl, TensorBoard events, the progress display and the loss plot.

Named `writers` rather than `logging` so it never shadows the standard library module. Only
process 0 writes; the other processes get a writer that does nothing.
"""

from __future__ import annotations

import json
import math
import pathlib
import sys
import time

import numpy as np


class MetricsWriter:
  """Appends one JSON line per (step, split) to workdir/metrics.jsonl and mirrors to TensorBoard."""

  def __init__(self, workdir, enabled: bool = True):
    self.enabled = enabled
    self.path = pathlib.Path(workdir) / "metrics.jsonl"
    self._tb = None
    if enabled:
      from tensorboardX import SummaryWriter  # imported lazily: it is slow to import
      self._tb = SummaryWriter(str(pathlib.Path(workdir) / "tensorboard"))

  def write(self, step: int, split: str, metrics: dict) -> None:
    if not self.enabled:
      return
    record = {"step": int(step), "split": split,
              **{k: float(v) for k, v in metrics.items()}}
    with self.path.open("a") as f:
      f.write(json.dumps(record) + "\n")
    for k, v in metrics.items():
      self._tb.add_scalar(f"{split}/{k}", float(v), int(step))

  def write_event(self, step: int, event: str, **info) -> None:
    """A non-metric event (resume, preemption, rewind) in metrics.jsonl."""
    if not self.enabled:
      return
    with self.path.open("a") as f:
      f.write(json.dumps({"step": int(step), "event": event, **info}) + "\n")

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def read_metrics(workdir, split: str = "train") -> list[dict]:
  """The metrics.jsonl records of one split, in file order."""
  path = pathlib.Path(workdir) / "metrics.jsonl"
  if not path.exists():
    return []
  records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  return [r for r in records if r.get("split") == split]


class Progress:
  """A tqdm bar on a terminal (step, loss, steps/s, ETA); plain log lines otherwise."""

  def __init__(self, total: int, start: int, enabled: bool = True, stream=None):
    self.stream = stream or sys.stderr
    self.enabled = enabled
    self.total, self.start = total, start
    self.t0 = time.perf_counter()
    self.bar = None
    # Without a terminal, print about 20 lines per run rather than one per step.
    self.plain_every = max(1, (total - start) // 20)
    if enabled and self.stream.isatty():
      from tqdm import tqdm
      self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True,
                      file=self.stream)

  def update(self, step: int, metrics: dict) -> None:
    if not self.enabled:
      return
    shown = {k: metrics[k] for k in ("loss", "accuracy", "grad_norm", "lr") if k in metrics}
    if self.bar is not None:
      self.bar.n = step
      self.bar.set_postfix({k: f"{v:.4g}" for k, v in shown.items()}, refresh=True)
      return
    if (step - self.start) % self.plain_every and step != self.total:
      return
    elapsed = time.perf_counter() - self.t0
    rate = (step - self.start) / elapsed if elapsed > 0 else float("nan")
    eta = (self.total - step) / rate if rate > 0 else float("nan")
    parts = " ".join(f"{k}={v:.4g}" for k, v in shown.items())
    eta_s = f"{eta:.0f}s" if math.isfinite(eta) else "?"
    print(f"step {step}/{self.total} {parts} {rate:.1f} steps/s eta {eta_s}",
          file=self.stream, flush=True)

  def message(self, text: str) -> None:
    if not self.enabled:
      return
    if self.bar is not None:
      self.bar.write(text, file=self.stream)
    else:
      print(text, file=self.stream, flush=True)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


def plot_losses(workdir, title: str = "") -> pathlib.Path | None:
  """Writes workdir/loss.png: training loss per step and eval loss where measured."""
  train = read_metrics(workdir, "train")
  if not train:
    return None
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4))
  ax.plot([r["step"] for r in train], [r["loss"] for r in train], label="train")
  evals = read_metrics(workdir, "eval")
  if evals:
    ax.plot([r["step"] for r in evals], [r["loss"] for r in evals], "o-", label="eval")
  ax.set_xlabel("step")
  ax.set_ylabel("loss")
  losses = np.array([r["loss"] for r in train])
  if np.all(losses > 0) and losses.max() / max(losses.min(), 1e-12) > 50:
    ax.set_yscale("log")
  ax.set_title(title)
  ax.legend()
  fig.tight_layout()
  out = pathlib.Path(workdir) / "loss.png"
  fig.savefig(out, dpi=100)
  plt.close(fig)
  return out
