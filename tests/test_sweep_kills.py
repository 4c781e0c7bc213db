"""One real `jaxdl sweep` killed every way (a run SIGKILLed under a live sweep, SIGTERM to the
sweep's process group, the sweep SIGKILLed) and rerun: every run ends bit-identical to its
logged `jaxdl train` command run alone, with no traceback in any log (slow)."""

import contextlib
import json
import os
import pathlib
import shlex
import signal
import sys
import time

import pytest

from jaxdl.config import load_config
from jaxdl.sweep import grid, scheduler

import warm_python

EXP = "moons_mlp:smoke"
BASE = load_config(EXP)[0]  # the config the CLI hands a sweep (`jaxdl.cli.sweep`)

# 100 steps, a checkpoint every 20: each stop below is forced at a checkpoint, and 40 or more
# steps still to go leave the test's poll (10 ms) a wide margin on a loaded machine (0.7 CPU-s a
# run more than 40 steps with a checkpoint every 10).
SHARED = ["train.steps=100", "train.ckpt_every=20", "train.eval_every=10", "train.plot=False",
          "train.loggers=()", "train.count_flops=False"]
SEEDS = (0, 1)


def _sweep_cmd(out):
  sets = [a for s in SHARED for a in ("--set", s)]
  return [sys.executable, "-m", "jaxdl", "sweep", EXP, "--grid", "optim.lr=1e-2", "--seeds", "2",
          "--jobs", "2", "--out", str(out), *sets]


def _wait_for(condition, timeout=240.0):
  t0 = time.monotonic()
  while not condition():
    assert time.monotonic() - t0 < timeout, "timed out"
    time.sleep(0.01)


def _final(workdir):
  """What a run ends with: its summary's metrics, its eval curve (a step once), its params."""
  import numpy as np
  from jaxdl.train import load_state
  summary = json.loads((workdir / "summary.json").read_text())
  evals = {r["step"]: r["loss"] for r in map(json.loads, (workdir / "metrics.jsonl").open())
           if r.get("split") == "eval"}
  step, state = load_state(workdir)
  params = {"/".join(map(str, k)): np.asarray(v).tobytes()
            for k, v in _flat(state["params"]).items()}
  return summary["train"], summary["eval"], evals, step, params


def _flat(tree, prefix=()):
  if isinstance(tree, dict):
    return {k: v for key, sub in tree.items() for k, v in _flat(sub, (*prefix, key)).items()}
  return {prefix: tree}


def _runs(out):
  return [out / "runs" / f"optim.lr=0.01,seed={s}" for s in SEEDS]


def _logged_command(sweep, run):
  """The `jaxdl train` command line the sweep's log says it ran for `run` (its first attempt)."""
  header = next(ln for ln in (sweep / "logs" / f"{run}.log").open()
                if ln.startswith(scheduler.HEADER))
  return shlex.split(header.split(": ", 2)[2])


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
  """Each run of the sweep trained by its own `jaxdl train` command, run alone (the command the
  sweep's log records, another workdir): {seed: what it ended with}."""
  root = tmp_path_factory.mktemp("alone")
  plan = grid.plan(EXP, BASE, ["optim.lr=1e-2"], shared=SHARED, seeds=len(SEEDS))
  finals = {}
  for r in plan.runs:
    command = scheduler.train_command(plan, {"overrides": r.overrides}, root / r.name)
    done = warm_python.run(command, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    finals[r.seed] = _final(root / r.name)
  return finals


def _assert_as_alone(out, alone):
  """Every run of the sweep in `out` finished, bit-identical to its command run alone, the
  command its log records being that command; no attempt's log holds a traceback."""
  idx = json.loads((out / "sweep.json").read_text())
  assert all(r["status"] == "finished" for r in idx["runs"].values())
  plan = grid.plan(EXP, BASE, ["optim.lr=1e-2"], shared=SHARED, seeds=len(SEEDS))
  for r, w in zip(plan.runs, _runs(out)):
    assert _logged_command(out, w.name) == scheduler.train_command(plan, idx["runs"][w.name], w)
    assert _final(w) == alone[r.seed], w.name
    log = (out / "logs" / f"{w.name}.log").read_text()
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]


def _pending_signals(pid: int) -> int:
  """The process's pending-signal mask (its own and its thread group's), from /proc."""
  fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
  return int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)


def _holder(workdir, other_than=None, checkpoint=None):
  """The pid holding `workdir`'s lock once it is not `other_than` and the run has saved
  `checkpoint` (None: any time), else None."""
  try:
    pid = json.loads((workdir / ".lock").read_text())["pid"]
  except (OSError, ValueError, KeyError):
    return None
  if pid == other_than or (checkpoint and not (workdir / "checkpoints" / checkpoint).is_dir()):
    return None
  return pid if scheduler.lock_holder(workdir) else None


def _gone(pid: int) -> bool:
  """Whether the process has exited (a zombie awaiting its reaper included)."""
  try:
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX"
  except OSError:
    return True


def _held(pid: int) -> bool:
  """Whether every thread of the process is stopped (a group stop completes thread by thread: a
  signal sent before it has may be taken by a thread still running)."""
  states = []
  for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
    with contextlib.suppress(OSError):  # a thread that has just exited
      states.append(next(ln for ln in (task / "status").read_text().splitlines()
                         if ln.startswith("State:")).split()[1])
  return bool(states) and all(s in "Tt" for s in states)


def _stop_once(pid, stop):
  """Holds run `pid` (SIGSTOP: before its last step, the moment forced), calls `stop()`, waits
  until the run has SIGTERM pending (sent to it once, while it was held), then lets it go."""
  os.kill(pid, signal.SIGSTOP)
  try:
    _wait_for(lambda: _held(pid))
    stop()
    _wait_for(lambda: _pending_signals(pid) & (1 << (signal.SIGTERM - 1)), timeout=60)
  finally:
    os.kill(pid, signal.SIGCONT)  # never leave it held


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, sessions: Linux")
def test_a_sweep_killed_every_way_reruns_to_the_results_of_its_runs_alone(tmp_path, alone):
  """One sweep directory through three invocations, each stop forced at a checkpoint:
  1. a run is SIGKILLed (the OOM killer): the sweep starts it again at once and it resumes;
     then the sweep's whole process group gets SIGTERM (systemd's stop, `kill -TERM -PGID`):
     each run, in a session of its own, gets it once, from the sweep, saves and says so, and
     the sweep exits 0;
  2. the rerun resumes them, and the sweep is SIGKILLed: its runs get SIGTERM from the kernel
     (PR_SET_PDEATHSIG), once, and save;
  3. the rerun finishes them: bit-identical to each run's command run alone, and no attempt's
     log holds a traceback."""
  out = tmp_path / "sweep"
  runs = _runs(out)
  own_group = ("import os, runpy, sys\nos.setpgid(0, 0)\n"
               "runpy.run_module('jaxdl', run_name='__main__', alter_sys=True)\n")
  sweep = warm_python.Popen([sys.executable, "-c", own_group, *_sweep_cmd(out)[3:]])
  _wait_for(lambda: any(_holder(w, checkpoint="20") for w in runs))
  victim = next(w for w in runs if _holder(w, checkpoint="20"))
  first = _holder(victim)
  os.kill(first, signal.SIGKILL)
  _wait_for(lambda: _holder(victim, other_than=first, checkpoint="40"))
  pid = _holder(victim)
  assert os.getpgid(pid) != os.getpgid(sweep.pid) == sweep.pid
  _stop_once(pid, lambda: os.killpg(sweep.pid, signal.SIGTERM))
  _, stderr = sweep.communicate(timeout=600)
  assert sweep.returncode == 0, stderr[-2000:]
  assert "jaxdl: sweep stopped by SIGTERM" in stderr
  assert f"retry    {victim.name}: vanished (killed by SIGKILL)" in stderr
  log = (out / "logs" / f"{victim.name}.log").read_text()
  assert log.count("jaxdl: stopped by SIGTERM") == 1, log[-3000:]
  assert not (victim / "summary.json").exists()

  sweep = warm_python.Popen(_sweep_cmd(out))
  _wait_for(lambda: _holder(victim, other_than=pid, checkpoint="60"))
  pid = _holder(victim)
  _stop_once(pid, lambda: (sweep.kill(), sweep.wait()))
  _wait_for(lambda: all(scheduler.lock_holder(w) is None for w in runs))
  # The orphaned run releases its lock before it prints its last lines: wait for its exit (no
  # one reaps it here, so a zombie counts as gone).
  _wait_for(lambda: _gone(pid))
  assert not (victim / "summary.json").exists()
  log = (out / "logs" / f"{victim.name}.log").read_text()
  assert log.count("jaxdl: stopped by SIGTERM") == 2, log[-3000:]  # once per stopped attempt

  rerun = warm_python.run(_sweep_cmd(out), timeout=600)
  assert rerun.returncode == 0, rerun.stderr[-2000:]
  assert "2/0/0/0" in rerun.stdout
  _assert_as_alone(out, alone)
  assert json.loads((out / "sweep.json").read_text())["runs"][victim.name]["attempts"] == 4
