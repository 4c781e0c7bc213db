"""Run artifacts: metrics.jsonl, TensorBoard events and the progress display (plots:
`jaxdl.train.plots`).

Named `writers` rather than `logging` so it never shadows the standard library module. Only
process 0 writes; the other processes get a writer that does nothing.

metrics.jsonl is valid JSON Lines: a non-finite number is written as `null` (JSON has no NaN or
Infinity). Each record is one `write(2)` on a file opened for appending, so a crash (or a full
disk) leaves at most one partial last line; the next writer starts a fresh line after it, and
readers skip such a torn line with one warning naming the file and line. No fsync per line: a
killed process loses nothing the kernel already holds, and only a machine crash could lose the
last lines, which the checkpoints (not the logs) are the record of.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pathlib
import sys
import time


log = logging.getLogger("jaxdl")


def json_safe(x):
  """`x` with every non-finite float replaced by None (JSON `null`), recursively."""
  if isinstance(x, dict):
    return {k: json_safe(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [json_safe(v) for v in x]
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x


def _append(path: pathlib.Path, text: str) -> None:
  """Appends `text` in one write call (looping only on a short write, which a full disk makes)."""
  data = text.encode()
  try:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
      while data:
        data = data[os.write(fd, data):]
    finally:
      os.close(fd)
  except OSError as e:  # os.write names no file; the user needs to know which one
    raise OSError(e.errno, e.strerror, str(path)) from e


class MetricsWriter:
  """Appends one JSON line per (step, split) to workdir/metrics.jsonl and mirrors it to
  TensorBoard and the started `jaxdl.train.trackers` (`train.loggers`)."""

  def __init__(self, workdir, enabled: bool = True, tensorboard: bool = True, trackers=()):
    self.enabled = enabled
    self.path = pathlib.Path(workdir) / "metrics.jsonl"
    self._tb = None
    self._tail_checked = False
    self.trackers = list(trackers)
    if enabled and tensorboard:
      from tensorboardX import SummaryWriter  # imported lazily: it is slow to import
      self._tb = SummaryWriter(str(pathlib.Path(workdir) / "tensorboard"))

  def _write_record(self, record: dict) -> None:
    line = json.dumps(json_safe(record), allow_nan=False) + "\n"
    if not self._tail_checked:
      # A torn last line (a crash mid-write) must not swallow this run's first record.
      if self.path.exists() and self.path.stat().st_size:
        with self.path.open("rb") as f:
          f.seek(-1, os.SEEK_END)
          if f.read(1) != b"\n":
            line = "\n" + line
      self._tail_checked = True
    _append(self.path, line)

  def write(self, step: int, split: str, metrics: dict) -> None:
    if not self.enabled:
      return
    self._write_record({"step": int(step), "split": split,
                        **{k: float(v) for k, v in metrics.items()}})
    for k, v in metrics.items():
      if self._tb is not None and math.isfinite(float(v)):  # a NaN: tensorboardX warns
        self._tb.add_scalar(f"{split}/{k}", float(v), int(step))
    for tracker in list(self.trackers):
      try:
        tracker.log(int(step), split, metrics)
      except Exception as e:  # noqa: BLE001 -- a tracker failing mid-run must not stop it
        # One line: a tracker's errors (MLflow's, often) can run to many.
        log.warning("logger %s failed (%s: %s); dropped for the rest of the run",
                    type(tracker).__name__, type(e).__name__, _first_line(e))
        self.trackers.remove(tracker)

  def finish(self, summary: dict) -> None:
    """Hands the run's summary to the trackers and ends their runs."""
    for tracker in self.trackers:
      try:
        tracker.finish(summary)
      except Exception as e:  # noqa: BLE001
        log.warning("logger %s did not finish (%s: %s)", type(tracker).__name__,
                    type(e).__name__, _first_line(e))
    self.trackers = []

  def write_event(self, step: int, event: str, **info) -> None:
    """A non-metric event (resume, preemption, rewind) in metrics.jsonl."""
    if not self.enabled:
      return
    self._write_record({"step": int(step), "event": event, **info})

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def _first_line(e: Exception) -> str:
  return (str(e).strip().splitlines() or [""])[0]


_warned: set[tuple[str, int]] = set()


def read_records(path) -> list[dict]:
  """Every record of a metrics.jsonl file, in file order; [] when there is none.

  A line that is not a JSON object (torn by a crash or a full disk) is skipped with a warning
  naming the file and line, once per process. `null` values read back as None (non-finite).
  """
  path = pathlib.Path(path)
  if not path.exists():
    return []
  records = []
  for n, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      record = None
    if isinstance(record, dict):
      records.append(record)
    elif (str(path), n) not in _warned:
      _warned.add((str(path), n))
      log.warning("%s:%d is not a complete JSON record (a torn write?); skipped", path, n)
  return records


def read_metrics(workdir, split: str = "train") -> list[dict]:
  """The metrics.jsonl records of one split, in file order (torn lines skipped)."""
  records = read_records(pathlib.Path(workdir) / "metrics.jsonl")
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
