"""Where a command's messages go: jaxdl's own log lines to stderr, the libraries' noise kept
quiet, and a full disk reported once (`jaxdl.disk_errors`) rather than by every library thread."""

from __future__ import annotations

import logging
import sys

from jaxdl import disk_errors


class _StderrHandler(logging.StreamHandler):
  """Writes to whatever `sys.stderr` is when a record is emitted, not the one at setup: a second
  in-process `main` call (tests, notebooks) may run after the first one's stream was closed."""

  @property
  def stream(self):
    return sys.stderr

  @stream.setter
  def stream(self, value):
    del value


def setup() -> None:
  """jaxdl's messages at INFO on stderr whatever absl did to the root logger on import; absl,
  orbax, jax and asyncio at WARNING, without their copies of a disk error."""
  logger = logging.getLogger("jaxdl")
  if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  logger.propagate = False
  if not isinstance(sys.unraisablehook, disk_errors.QuietClosedLoop):
    sys.unraisablehook = disk_errors.QuietClosedLoop(sys.unraisablehook)
  for noisy in ("absl", "orbax", "jax._src", "etils", "asyncio"):
    noisy = logging.getLogger(noisy)
    noisy.setLevel(logging.WARNING)
    if not any(isinstance(f, disk_errors.DiskErrorFilter) for f in noisy.filters):
      noisy.addFilter(disk_errors.DiskErrorFilter())
  try:
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)
  except ImportError:
    pass
