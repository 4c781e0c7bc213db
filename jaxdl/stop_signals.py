"""Stop signals, SIGTERM (a scheduler's preemption) and SIGINT (Ctrl-C), as a flag or an exception.

`Preemption` is installed by `jaxdl train` before anything heavy is imported, and by
`jaxdl.train.run` when called from Python, so a signal at any moment stops a run cleanly: where
the code polls for it (startup, the loop) the run stops at the next milestone, during training
saving the current step (`preempted` in its summary); in code that never polls (an experiment's
own loop) the handler raises `Interrupted`, and the run unwinds with its workdir lock released.
A light module (no jax), like `jaxdl.disk_errors`, because the CLI needs it before jax loads.
"""

from __future__ import annotations

import contextlib
import signal
import threading


class Interrupted(BaseException):
  """A stop signal (SIGTERM, SIGINT) met where nothing polls for it: raised from the signal
  handler so the run unwinds at once, every `with` releasing what it holds (the workdir lock).
  A BaseException, like KeyboardInterrupt, so no `except Exception` swallows it."""

  def __init__(self, signal_name: str):
    self.signal_name = signal_name
    super().__init__(f"stopped by {signal_name}")


class Preemption:
  """Turns SIGTERM and SIGINT (Ctrl-C) into a flag, `requested` (the signal's name, else None).

  While `polled` (`jaxdl train` while it starts; the training loop at its setup milestones and
  every step) the first signal only sets the flag, so the loop saves the current step and
  returns. Outside it (an experiment's own loop, `after_training`), or at a second signal, the
  handler raises `Interrupted`: nothing polls there, and unwinding releases the lock. (Raised
  inside a callback whose exceptions Python ignores, e.g. a gc callback, it is lost: the flag
  stays set, and the next signal raises again.) Installed only from the main thread (signals are
  delivered there); the previous handlers come back on exit.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.requested: str | None = None
    self.polling = False
    self._old: dict = {}

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      # A signal the parent ignores stays ignored (as Python does for SIGINT): a shell script's
      # background job is not meant to stop on the terminal's Ctrl-C.
      self._old = {s: signal.signal(s, self._handle) for s in self.SIGNALS
                   if signal.getsignal(s) is not signal.SIG_IGN}
      # A handler never runs for a blocked signal, and a blocked mask is inherited from the
      # parent (a thread that blocked it while starting us): unblock the ones handled here.
      signal.pthread_sigmask(signal.SIG_UNBLOCK, set(self._old))
    return self

  def _handle(self, signum, frame):
    del frame
    name = signal.Signals(signum).name
    if self.requested is not None or not self.polling:
      self.requested = self.requested or name
      raise Interrupted(name)
    self.requested = name

  @contextlib.contextmanager
  def polled(self, polling: bool = True):
    """The block polls `requested` itself (`polling`): a first signal sets it instead of
    raising; `polled(False)` inside such a block hands a stretch of code that never polls
    (an experiment's own loop) back to raising."""
    before, self.polling = self.polling, polling
    try:
      yield self
    finally:
      self.polling = before

  def __exit__(self, *exc):
    for s, old in self._old.items():
      if old is not None:  # None: a handler not set from Python, which cannot be put back
        signal.signal(s, old)
    self._old = {}
