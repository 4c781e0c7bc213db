"""Stop signals, SIGTERM (a scheduler's preemption) and SIGINT (Ctrl-C), as a flag or an exception.

The `jaxdl` command (`jaxdl.cli.main`) enters `Preemption` as its first act, before anything
heavy is imported, so a signal at any moment stops a command cleanly: where the code polls for it
(the CLI after its imports, `jaxdl train` after loading the config, the training loop at its
milestones and every step, a sweep's scheduler) the command stops at the next poll, during
training saving the current step (`preempted` in its summary); in code that never polls (an
experiment's own loop, the other commands' work) the handler raises `Interrupted`, and the
command unwinds with its locks released. Either way the command ends in `Stopped`, which the
CLI's handler reports in one line: exit 0 after SIGTERM, 130 after SIGINT (`exit_code`).
`jaxdl.train.run` called from Python enters its own. A light module (no jax), like
`jaxdl.disk_errors`, because the CLI needs it before jax loads.

A test forces the moment it stops a command at: `JAXDL_STOP_AT=<milestone>[:SIGINT]` makes the
process send itself the signal (default SIGTERM) when it reaches that milestone (`reached`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

# The test-only variable naming a milestone to signal this process at (`reached`).
STOP_AT_VAR = "JAXDL_STOP_AT"
# The milestones, in a `jaxdl train`'s order: the CLI's first act, the library about to be
# imported (the signal is met while jax loads), the experiment's config loaded, the workdir
# locked, the first step dispatched. (`jaxdl sweep`: start, importing, config.)
# A command's start: the CLI's first act, the library's import, its config read, its workdir (a
# sweep's directory) locked, then a run's first step or a sweep's first runs launched.
MILESTONES = ("start", "importing", "config", "locked", "step", "launched")


class Stopped(BaseException):
  """A command that a stop signal ended; `line` says when and what was kept.

  Raised by a command once it has stopped cleanly (what it saved is saved), and reported by the
  CLI in one line, `jaxdl: <line>`, exit `exit_code(signal_name)`. A BaseException, like
  KeyboardInterrupt, so no `except Exception` on the way out swallows it.
  """

  def __init__(self, signal_name: str, line: str | None = None):
    self.signal_name = signal_name
    self.line = line or f"stopped by {signal_name}"
    super().__init__(self.line)


class Interrupted(Stopped):
  """A stop signal met where nothing polls for it: raised from the signal handler so the command
  unwinds at once, every `with` releasing what it holds (the workdir lock)."""


def exit_code(signal_name: str) -> int:
  """0 after SIGTERM (a preemption: stopped as asked, and a rerun resumes), 130 (128 + 2, the
  shell's convention) after SIGINT, so a script interrupted by Ctrl-C does not go on."""
  return 130 if signal_name == "SIGINT" else 0


def stop_in(e: BaseException | None) -> Stopped | None:
  """The `Stopped` that `e` is or was raised from or during, else None. A signal raised inside
  an import of a C extension reaches the caller as an ImportError whose context is the stop."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, Stopped):
      return e
    e = e.__cause__ or e.__context__
  return None


def reached(milestone: str) -> None:
  """Marks a milestone (`MILESTONES`) of a command's start. When the test-only `JAXDL_STOP_AT`
  names it, the process sends itself that signal here, so a test stops the command at exactly
  this moment rather than after a sleep that races the machine. The variable is removed once
  used: a process this one starts (a sweep's run) does not act on it."""
  assert milestone in MILESTONES, milestone
  wanted = os.environ.get(STOP_AT_VAR)
  if not wanted or wanted.split(":")[0] != milestone:
    return
  del os.environ[STOP_AT_VAR]
  name = wanted.split(":")[1] if ":" in wanted else "SIGTERM"
  os.kill(os.getpid(), signal.Signals[name])


class Preemption:
  """Turns SIGTERM and SIGINT (Ctrl-C) into a flag, `requested` (the signal's name, else None).

  While `polled` (`jaxdl train` while it starts; the training loop at its setup milestones and
  every step) the first signal only sets the flag, so the loop saves the current step and
  returns; so does a repeated SIGTERM. Outside it (an experiment's own loop, `after_training`),
  or at a second SIGINT or a signal of the other kind, the handler raises `Interrupted`: nothing
  polls there, and unwinding releases the lock. (Raised inside a callback whose exceptions
  Python ignores, e.g. a gc callback, it is lost: the flag stays set, and the next signal raises
  again.) Installed only from the main thread (signals are
  delivered there); the previous handlers come back on exit.

  Entered inside another one (a sweep's scheduler inside the CLI's), it takes over a signal the
  outer one has recorded, and hands its own back on exit, so a signal is never lost between two.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.requested: str | None = None
    self.polling = False
    self._old: dict = {}
    self._outer: Preemption | None = None

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      outer = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
      if isinstance(outer, Preemption):
        self._outer, self.requested = outer, outer.requested
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
    # A repeated SIGTERM is the same stop delivered twice (by a parent and again to its process
    # group, as `timeout` and `kill -TERM -PGID` do): raising at it would skip the save the
    # first one asked for. A second Ctrl-C is a person insisting: it raises.
    if self.polling and self.requested in (None, "SIGTERM") and name == "SIGTERM":
      self.requested = name
      return
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
    if self._outer is not None:
      self._outer.requested = self._outer.requested or self.requested
      self._outer = None
