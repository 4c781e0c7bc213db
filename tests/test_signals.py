"""SIGTERM and SIGINT stop a command cleanly at any moment (issues 26 and 49, item 1).

The `jaxdl` command enters its stop handler as its first act (`jaxdl.cli.main`), so from then
on a signal stops it in one line: exit 0 after SIGTERM, 130 after SIGINT, its lock released,
nothing written before training, the current step saved during it. Each test forces its moment
rather than sleeping: `JAXDL_STOP_AT=<milestone>[:SIGINT]` makes the process signal itself when
it reaches that milestone (`jaxdl.stop_signals.reached`), so what is tested never depends on the
machine's speed (a fresh-clone run once had jax loaded before a timed signal arrived).

Real processes, one CPU device. The moments before jax loads start a fresh interpreter (what a
signal meets there is the interpreter's own import of the library); the later ones are forked
from the suite's warm interpreter (tests/warm_python.py), which has the library imported already.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from jaxdl.stop_signals import MILESTONES, STOP_AT_VAR
from jaxdl.train.checkpoint import load_state

import warm_python

ROOT = pathlib.Path(__file__).resolve().parent.parent

# A foreground run, as a terminal starts one: SIGINT and SIGTERM at their default disposition,
# whatever this test worker inherited or was left with by the tests before it (an ignored SIGINT
# is inherited, and jaxdl leaves it ignored on purpose: a shell's background job).
FOREGROUND = ("import runpy, signal, sys; "
              "[signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)]; "
              "sys.argv[0] = 'jaxdl'; runpy.run_module('jaxdl', run_name='__main__')")
# The moments before the library is imported: only a fresh interpreter has them.
FRESH = ("start", "importing")


def _env(stop_at: str) -> dict:
  """The suite's environment with one CPU device (a user's machine) and the moment to stop at
  (the same import-time variables, so a command can be forked from the warm interpreter)."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  return {**os.environ, "XLA_FLAGS": " ".join(flags), STOP_AT_VAR: stop_at}


def _jaxdl(milestone: str, signum: int, *argv: str) -> tuple[int, str, str]:
  """`jaxdl ARGV` run in the foreground until it stops itself with `signum` at `milestone`."""
  args = [sys.executable, "-c", FOREGROUND, *argv]
  env = _env(f"{milestone}:{signal.Signals(signum).name}")
  if milestone in FRESH:  # a fresh interpreter: the signal meets the library's import
    done = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
  else:
    assert warm_python.warmable(args, env) or os.environ.get(warm_python.FRESH)
    done = warm_python.run(args, env=env, cwd=ROOT, timeout=240)
  return done.returncode, done.stdout, done.stderr


def _one_stop_line(err: str, signum: int) -> str:
  lines = err.strip().splitlines()
  assert len(lines) == 1, err
  assert lines[0].startswith(f"jaxdl: stopped by {signal.Signals(signum).name}"), err
  return lines[0]


TRAIN = ["moons_mlp", "--no-progress", "--set", "train.plot=False", "--set",
         "train.steps=100000", "--set", "train.ckpt_every=0"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("milestone", [m for m in MILESTONES if m != "launched"])  # a sweep's
def test_train_stopped_at_each_moment_to_its_first_step_says_so_in_one_line(milestone, signum,
                                                                           tmp_path):
  """From the CLI's first act to the first step: exit 0 after SIGTERM, 130 after SIGINT, one
  line on stderr, no traceback, no lock. Before the first step nothing is written (no workdir);
  at the first step that step is saved, as at any step of training, and the run resumes."""
  workdir = tmp_path / "w"
  code, out, err = _jaxdl(milestone, signum, "train", *TRAIN, "--workdir", str(workdir))
  assert code == (130 if signum == signal.SIGINT else 0), err
  line = _one_stop_line(err, signum)
  if milestone == "step":
    assert "at step 1; its checkpoint is saved" in line, err
    summary = json.loads(out)
    assert summary["preempted"] and summary["step"] == 1
    assert load_state(workdir)[0] == 1
    assert not (workdir / ".lock").exists()
  else:
    assert "nothing" in line, err
    assert not workdir.exists(), list(workdir.iterdir())
    if milestone != "locked":  # once locked, the loop returns its (empty) summary
      assert out == ""


SWEEP = ["sweep", "moons_mlp", "--grid", "optim.lr=0.1,0.2", "--jobs", "2", "--set",
         "train.plot=False"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("milestone", ["start", "importing", "config", "locked", "launched"])
def test_sweep_stopped_at_each_moment_to_its_runs_start_says_so_in_one_line(milestone, signum,
                                                                           tmp_path):
  """`jaxdl sweep` goes through the same handler, at five moments: the CLI's first act, while
  jax loads, once the experiment and grid are read, once it holds its directory's lock, and
  once it has launched its first runs. SIGTERM exits 0, SIGINT 130, in one line, no traceback
  and no lock. Nothing is written (no sweep directory) unless a run saved a step before the
  stop reached it; then every run is recorded as stopped, resumable (never failed)."""
  out_dir = tmp_path / "s"
  code, out, err = _jaxdl(milestone, signum, *SWEEP, "--out", str(out_dir))
  assert code == (130 if signum == signal.SIGINT else 0), err
  if milestone in ("locked", "launched"):  # the sweep's own progress lines come first
    assert "Traceback" not in err, err
    err = err.strip().splitlines()[-1]
  line = _one_stop_line(err.replace("jaxdl: sweep ", "jaxdl: "), signum)
  if milestone in ("start", "importing", "config"):
    assert "nothing written" in line, err
    assert out == "" and not out_dir.exists()
    return
  if "nothing written" in line:  # no run saved a step (or left a traceback, which keeps the
    assert not out_dir.exists(), list(out_dir.rglob("*"))  # folder: the branch below fails)
    return
  # A run got as far as saving a step before the sweep's SIGTERM reached it: the folder stays,
  # resumable, with no lock, nothing failed and no traceback in any log.
  assert "rerun" in line and milestone == "launched", err
  assert not (out_dir / ".lock").exists()
  runs = json.loads((out_dir / "sweep.json").read_text())["runs"]
  assert len(runs) == 2 and all(r["status"] == "pending" for r in runs.values()), runs
  for name in runs:
    assert not (out_dir / "runs" / name / ".lock").exists()
    assert "Traceback" not in (out_dir / "logs" / f"{name}.log").read_text()


NESTED = """
import os, signal
from jaxdl.stop_signals import Preemption
[signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)]
with Preemption() as outer, outer.polled():
  os.kill(os.getpid(), signal.SIGINT)  # met by the outer one (the CLI's) while jax loads
  with Preemption() as inner, inner.polled():  # a sweep's scheduler, entered later
    taken = inner.requested
with Preemption() as outer, outer.polled():
  with Preemption() as inner, inner.polled():
    os.kill(os.getpid(), signal.SIGTERM)  # met by the scheduler
  handed = outer.requested
with Preemption() as p, p.polled():
  os.kill(os.getpid(), signal.SIGTERM)
  os.kill(os.getpid(), signal.SIGTERM)  # the same stop again (a parent's and a group's copy)
  try:
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C on top: insists
  except BaseException as e:
    insisted = type(e).__name__
print(taken, handed, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, p.requested, insisted)
"""


def test_a_preemption_inside_another_takes_over_its_signal_and_a_repeated_sigterm_is_one():
  """A signal the CLI's handler recorded before a sweep's scheduler entered its own is seen by
  the scheduler (it stops at its first poll), one met by the scheduler is handed back to the
  CLI's, and the handlers before both come back. A repeated SIGTERM changes nothing (it would
  otherwise skip the save the first asked for); a SIGINT on top raises."""
  done = subprocess.run([sys.executable, "-c", NESTED], capture_output=True, text=True,
                        timeout=60, cwd=ROOT)
  assert done.stdout.split() == ["SIGINT", "SIGTERM", "True", "SIGTERM", "Interrupted"], (
      done.stderr)
