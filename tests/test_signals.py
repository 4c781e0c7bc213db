"""SIGTERM and SIGINT stop `jaxdl train` cleanly at any moment (issue 26, item 1c).

During startup (jax loading, the lock just taken, compiling) there is nothing new to save: the
run stops with one line, exit 0 after SIGTERM and 130 after SIGINT, its lock released. During
training the current step is saved (tests/test_resume.py covers SIGTERM there; here SIGINT).
Real subprocesses, one CPU device; each test is one short run.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from jaxdl.train.checkpoint import load_state

pytestmark = pytest.mark.skipif(not pathlib.Path("/proc/self/status").exists(),
                                reason="reads a process's caught signals from /proc")

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _env() -> dict:
  """The suite's environment with one CPU device (a user's machine), for a faster start."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  # PYTHONFAULTHANDLER: a run that does not stop is sent SIGABRT (`_stop`), which then prints
  # every thread's stack, so a hang names where it waits.
  return {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(flags),
          "PYTHONFAULTHANDLER": "1"}


# A foreground run, as a terminal starts one: SIGINT and SIGTERM at their default disposition,
# whatever this test worker inherited or was left with by the tests before it (an ignored SIGINT
# is inherited, and jaxdl leaves it ignored on purpose: a shell's background job).
FOREGROUND = ("import runpy, signal, sys; "
              "[signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)]; "
              "sys.argv[0] = 'jaxdl'; runpy.run_module('jaxdl', run_name='__main__')")


def _train(workdir, *extra) -> subprocess.Popen:
  return subprocess.Popen(
      [sys.executable, "-c", FOREGROUND, "train", "moons_mlp", "--workdir", str(workdir),
       "--no-progress", "--set", "train.plot=False", "--set", "train.steps=100000",
       "--set", "train.ckpt_every=0", *extra],
      env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _signal_state(pid: int) -> str:
  """Process `pid`'s blocked, ignored and caught signal masks (/proc), for failure messages."""
  lines = pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
  return " ".join(line for line in lines if line.startswith(("SigBlk", "SigIgn", "SigCgt")))


def _catches(pid: int, signum: int) -> bool:
  """Whether process `pid` has a handler for `signum` (its SigCgt mask in /proc)."""
  for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
    if line.startswith("SigCgt:"):
      return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
  return False


def _wait_for(condition, proc, what: str, timeout: float = 60.0) -> None:
  deadline = time.time() + timeout
  while not condition():
    assert proc.poll() is None, f"exited before {what}: {proc.communicate()}"
    assert time.time() < deadline, f"no {what} within {timeout} s"
    time.sleep(0.02)


def _stop(proc, signum, timeout: float = 120.0) -> tuple[int, str, str]:
  proc.send_signal(signum)
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.send_signal(signal.SIGABRT)  # the faulthandler's stacks of every thread (`_env`)
    _, err = proc.communicate()
    raise AssertionError(f"still running {timeout:.0f} s after {signal.Signals(signum).name}; "
                         f"its threads:\n{err[-6000:]}") from None
  return proc.returncode, out, err


def test_sigterm_while_jax_loads_stops_in_one_line_and_exits_0(tmp_path):
  """The handler is the CLI's first act; a SIGTERM from then on (here: while jax and the
  experiment load) stops before anything is written."""
  workdir = tmp_path / "w"
  proc = _train(workdir)
  _wait_for(lambda: _catches(proc.pid, signal.SIGTERM), proc, "SIGTERM handler")
  code, out, err = _stop(proc, signal.SIGTERM)
  assert code == 0 and out == "", err
  lines = err.strip().splitlines()
  assert len(lines) == 1 and "stopped by SIGTERM before training started" in lines[0], err
  assert not workdir.exists()


def test_sigterm_once_the_lock_is_taken_releases_it_and_exits_0(tmp_path):
  """Between taking the lock and the first step (restore, compile) a SIGTERM used to kill the
  process (exit 143) with the lock left behind."""
  workdir = tmp_path / "w"
  proc = _train(workdir)
  _wait_for((workdir / ".lock").exists, proc, "lock")
  code, out, err = _stop(proc, signal.SIGTERM)
  assert code == 0, err
  assert "stopped by SIGTERM" in err and "Traceback" not in err, err
  assert json.loads(out)["preempted"]
  assert not (workdir / ".lock").exists()


def test_sigint_during_training_saves_the_step_and_exits_130(tmp_path):
  """Ctrl-C saves the current step like a preemption, in one line, no KeyboardInterrupt
  traceback; exit 130 (128 + SIGINT), so a script that was interrupted does not go on."""
  workdir = tmp_path / "w"
  proc = _train(workdir, "--set", "train.log_every=1")
  metrics = workdir / "metrics.jsonl"
  _wait_for(lambda: metrics.exists() and metrics.read_text().count('"train"') >= 3, proc,
            "third step")
  assert _catches(proc.pid, signal.SIGINT), _signal_state(proc.pid)
  code, out, err = _stop(proc, signal.SIGINT)
  assert code == 130, err
  assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
  lines = [line for line in err.splitlines() if "stopped" in line]
  assert len(lines) == 1 and "stopped by SIGINT" in lines[0] and "saved" in lines[0], err
  summary = json.loads(out)
  assert summary["preempted"] and summary["step"] >= 3
  assert load_state(workdir)[0] == summary["step"]
  assert not (workdir / ".lock").exists()
