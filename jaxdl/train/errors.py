"""How a run that started can fail: `RunError` and the disk failure of a training timeline.

A caller tells a failed run from bad input by type, never by where the error was raised: a
`RunError` (a non-finite loss, an unrecoverable spike, a failed preflight, a full disk while
training) means the run itself failed, and the `jaxdl` command exits 1; a `ValueError` raised
before training (`jaxdl.schema.ConfigError`, another run's workdir) is bad input, exit 2.
"""

from __future__ import annotations

import contextlib

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
