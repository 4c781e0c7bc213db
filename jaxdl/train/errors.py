"""How a run that started can fail: `RunError` and the disk failure of a training timeline.

A caller tells a failed run from bad input by type, never by where the error was raised: a
`RunError` (a non-finite loss, an unrecoverable spike, a failed preflight, a full disk while
training) means the run itself failed, and the `jaxdl` command exits 1; a `ValueError` raised
before training (`jaxdl.schema.ConfigError`, another run's workdir) is bad input, exit 2.
"""

from __future__ import annotations

import contextlib
import math

from jaxdl import disk_errors


class RunError(RuntimeError):
  """A run that started and then failed; the workdir keeps its last good checkpoint."""


class DiskFailure(RunError):
  """A full disk or a permission error while the run trained (steps, logs, checkpoints, the
  plot). The message is `jaxdl.disk_errors.disk_failure`'s one line; the original error is the
  `__cause__`, where `disk_failure` still finds it."""


@contextlib.contextmanager
def disk_failures_fail_the_run(workdir):
  """Turns a full disk or a permission error raised inside the block into a `DiskFailure`
  (chained `from` it), so the same error before training stays setup trouble (a ValueError or
  OSError) and inside the training timeline is a failed run. Other errors pass unchanged."""
  try:
    yield
  except (OSError, ValueError) as e:
    failure = disk_errors.disk_failure(e, str(workdir))
    if failure is None:
      raise
    raise DiskFailure(failure) from e


class NonFiniteLossError(RunError):
  """A step's loss, gradient norm or updated state became NaN or Inf; that state was not saved.

  `what` names the first non-finite part: 'loss', 'grad_norm' (some gradient, or the norm's sum
  of squares, is not finite) or 'state' (the updated params, optimizer or model state).
  """

  def __init__(self, step: int, metrics: dict, what: str = "loss"):
    self.step, self.metrics, self.what = step, metrics, what
    shown = ", ".join(f"{k} {metrics[k]:.4g}" for k in ("loss", "grad_norm") if k in metrics)
    part = {"state": "the updated parameters / optimizer state"}.get(what, what)
    super().__init__(f"{part} became non-finite at step {step} ({shown}); stopped without "
                     f"saving that state")

  @staticmethod
  def find(metrics: dict) -> str | None:
    """The first non-finite part of a step's host metrics, or None when the step is good.

    Under fp16 loss scaling (a `grads_finite` metric) a non-finite gradient is a skipped step,
    the designed behaviour, and the state is the previous one; only the loss and state count.
    """
    if not math.isfinite(metrics["loss"]):
      return "loss"
    if "grads_finite" not in metrics and not math.isfinite(metrics.get("grad_norm", 0.0)):
      return "grad_norm"
    if metrics.get("state_finite", 1.0) != 1.0:
      return "state"
    return None


class SpikeError(RunError):
  """A loss spike the guard could not rewind (no checkpoint yet, or too many rewinds)."""


class PreflightError(RunError):
  """`train.doctor` is on and the preflight checks failed; nothing was written."""
