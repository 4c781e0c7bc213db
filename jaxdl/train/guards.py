"""In-run guards: loss / gradient-norm spike detection for rewinding, early stopping, and a
teardown that closes every resource of a run even when one fails.

A step is a spike when its value exceeds `factor` times the median of the previous `window`
finite values of the same metric (after at least `window // 2` of them have been seen). The median
is robust to the spikes themselves, and a factor well above 1 ignores ordinary step-to-step noise.
"""

from __future__ import annotations

import collections

import numpy as np

from jaxdl.schema import ConfigError

METRICS = {"loss": ("loss",), "grad_norm": ("grad_norm",), "either": ("loss", "grad_norm")}


class SpikeDetector:
  """Keeps a rolling history of the watched metrics and flags spikes."""

  def __init__(self, factor: float = 5.0, window: int = 20, watch: str = "loss"):
    if watch not in METRICS:
      raise ConfigError(f"train.spike_watch: expected one of {sorted(METRICS)}, got {watch!r}")
    if factor <= 1.0:
      raise ConfigError(f"train.spike_factor: must be > 1, got {factor}")
    if window < 2:
      raise ConfigError(f"train.spike_window: must be >= 2, got {window}")
    self.factor, self.window = factor, window
    self.names = METRICS[watch]
    self.history = {k: collections.deque(maxlen=window) for k in self.names}

  def check(self, metrics: dict) -> dict | None:
    """Returns {'metric', 'value', 'median'} for a spike (not added to the history), else None."""
    for k in self.names:
      past = self.history[k]
      if len(past) >= self.window // 2:
        median = float(np.median(past))
        if metrics[k] > self.factor * median:
          return {"metric": k, "value": float(metrics[k]), "median": median}
    for k in self.names:
      self.history[k].append(float(metrics[k]))
    return None


def close_all(closers, failed: BaseException | None) -> None:
  """Calls every closer, each even when an earlier one raised: a checkpoint manager or a log
  writer left open keeps writing from its threads while the interpreter shuts down. After the
  loop failed with `failed`, their errors become notes on it (a full disk fails the checkpoint
  and the log alike, and the loop's error is the one to report); otherwise the first is raised
  once all have run."""
  first = None
  for close in closers:
    try:
      close()
    except Exception as e:  # noqa: BLE001 -- the others must still close
      if failed is not None:
        failed.add_note(f"while stopping, {getattr(close, '__qualname__', close)} failed too "
                        f"({type(e).__name__}: {e})")
      first = first or e
  if first is not None and failed is None:
    raise first


class EarlyStopping:
  """Stops after `patience` evaluations without a better `metric` (patience 0: never)."""

  def __init__(self, metric: str, mode: str, patience: int):
    self.key, self.mode, self.patience = metric.removeprefix("eval/"), mode, patience
    self.best, self.since_best = None, 0

  def update(self, eval_metrics: dict) -> bool:
    if self.patience <= 0 or self.key not in eval_metrics:
      return False
    value = eval_metrics[self.key]
    better = self.best is None or (value > self.best if self.mode == "max" else value < self.best)
    self.best, self.since_best = (value, 0) if better else (self.best, self.since_best + 1)
    return self.since_best >= self.patience
