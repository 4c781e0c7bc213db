"""`jaxdl sweep`: grids and names, validation before anything starts, the index, device slots,
the report on hand-written workdirs. One real sweep killed and rerun: tests/test_sweep_kills.py."""

import json
import math
import os
import signal
import subprocess
import sys

import pytest

from jaxdl import cli
from jaxdl.config import ConfigError, load_config
from jaxdl.sweep import grid, index, report, scheduler, slots


EXP = "moons_mlp:smoke"
BASE = load_config(EXP)[0]  # the config the CLI hands a sweep (`jaxdl.cli.sweep`)


# --- grids, names and validation (in-process: configs only, nothing trains) ---

def test_values_split_outside_brackets_and_quotes():
  assert grid.split_values("1e-3,1e-2") == ["1e-3", "1e-2"]
  assert grid.split_values("(64, 64),(32,32),'a,b'") == ["(64, 64)", "(32,32)", "'a,b'"]


def test_a_plan_types_values_like_train_and_names_runs_stably():
  plan = grid.plan(EXP, BASE, ["optim.lr=1e-3,0.001,1e-2", "model.hidden=(8,8),(16, 16)"], seeds=2)
  # 1e-3 and 0.001 are one value: the one the config holds after the override.
  assert plan.grid == {"optim.lr": ["0.001", "0.01"], "model.hidden": ["(8,8)", "(16,16)"]}
  assert plan.seeds == (0, 1) and len(plan.runs) == 2 * 2 * 2
  first = plan.runs[0]
  assert first.overrides == ("optim.lr=0.001", "model.hidden=(8,8)", "seed=0")
  # Keys sorted, unsafe characters replaced and the value's hash appended: no two share a name.
  assert first.name == (f"model.hidden=_8_8_-{grid.label('(8,8)')[-6:]},optim.lr=0.001,seed=0")
  assert len({r.name for r in plan.runs}) == len(plan.runs)
  assert all(r.name == f"{r.point},seed={r.seed}" for r in plan.runs)
  # Seeds start at the config's seed after the shared overrides.
  assert grid.plan(EXP, BASE, ["optim.lr=0.01"], shared=["seed=5"], seeds=2).seeds == (5, 6)
  assert [r.name for r in grid.plan(EXP, BASE, [], seeds=2).runs] == ["seed=0", "seed=1"]


@pytest.mark.parametrize("flags, kwargs, message", [
    (["optim.lrr=1,2"], {}, r"^optim\.lrr: unknown key$"),
    (["optim.lr=1e-3,fast"], {}, r"^optim\.lr: expected float, got 'fast'$"),
    (["optim.lr="], {}, r"^--grid optim\.lr: an empty value"),
    (["optim.lr=1e-3,"], {}, r"^--grid optim\.lr: an empty value"),
    (["optim.lr"], {}, r"^--grid 'optim\.lr': expected KEY=V1,V2"),
    (["optim.lr=1", "optim.lr=2"], {}, r"^--grid optim\.lr: given twice"),
    (["seed=1,2"], {}, r"^--grid seed: the seed is swept by --seeds"),
    (["optim.lr=1e-3"], {"seed_key": "rng"}, r"^--seed-key rng: the config of .* no key 'rng'"),
    (["optim.lr=1e-3,-1"], {}, r"^optim\.lr: must be >= 0, got -1\.0 \(point optim\.lr=-1\.0\)$"),
    (["optim.lr=1e-3"], {"shared": ["optim.lr=0.1"]}, r"^--grid optim\.lr: also fixed by --set"),
    (["optim.lr=1e-3"], {"seeds": 0}, r"^--seeds: expected a count >= 1"),
])
def test_a_bad_grid_is_one_config_error(flags, kwargs, message):
  with pytest.raises(ConfigError, match=message):
    grid.plan(EXP, BASE, flags, **kwargs)


@pytest.mark.parametrize("flags, line", [
    (["--grid", "optim.lr=1e-3,oops"], "optim.lr: expected float, got 'oops'"),
    (["--grid", "optim.lr=1e-3", "--seeds", "0"], "--seeds: expected a count >= 1, got 0"),
    (["--seeds", "-2"], "--seeds: expected a count >= 1, got -2"),
    (["--jobs", "0"], "--jobs: expected a count >= 1, got 0"),
])
def test_a_bad_sweep_exits_2_with_one_line_and_creates_nothing(flags, line, tmp_path, capsys):
  out = tmp_path / "sweep"
  assert cli.main(["sweep", EXP, *flags, "--out", str(out)]) == 2
  assert capsys.readouterr().err.strip().splitlines() == [f"jaxdl: error: {line}"]
  assert not out.exists()


def test_train_and_help_import_no_sweep_module():
  """The sweep package is loaded by `jaxdl sweep` only: a run a sweep starts takes its slot
  in `jaxdl.cli.main` only where the sweep's variable marks the process as a sweep's run."""
  code = ("import runpy, sys\n"
          "for argv in (['jaxdl', '--help'], ['jaxdl', 'train', '--help']):\n"
          "  sys.argv = argv\n"
          "  try:\n"
          "    runpy.run_module('jaxdl', run_name='__main__', alter_sys=True)\n"
          "  except SystemExit:\n"
          "    pass\n"
          "print('LOADED', sorted(m for m in sys.modules if m.startswith('jaxdl.sweep')))\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert "usage: jaxdl train" in out.stdout and out.stdout.splitlines()[-1] == "LOADED []"


def test_the_index_grows_with_the_grid_and_refuses_another_sweep():
  a = grid.plan(EXP, BASE, ["optim.lr=1e-3"], seeds=2)
  idx = index.merge(None, a)
  idx["runs"]["optim.lr=0.001,seed=0"]["status"] = index.FINISHED
  grown = index.merge(json.loads(json.dumps(idx)), grid.plan(EXP, BASE, ["optim.lr=1e-3,1e-2"],
                                                                seeds=2))
  assert grown["grid"] == {"optim.lr": ["0.001", "0.01"]} and len(grown["runs"]) == 4
  assert grown["runs"]["optim.lr=0.001,seed=0"]["status"] == index.FINISHED  # kept
  assert set(grown["provenance"]["versions"]) >= {"jax", "flax", "optax", "numpy"}
  with pytest.raises(ConfigError, match=r"^--out: the directory holds a sweep with --set \[\]"):
    index.merge(idx, grid.plan(EXP, BASE, ["optim.lr=1e-3"], shared=["train.steps=5"]))


def test_git_revision_is_read_from_the_files(tmp_path):
  git = tmp_path / "repo" / ".git"
  (git / "refs" / "heads").mkdir(parents=True)
  (git / "HEAD").write_text("ref: refs/heads/main\n")
  assert index.git_revision(tmp_path / "repo") is None  # a branch with no commit yet
  (git / "packed-refs").write_text("# pack-refs\n" + "a" * 40 + " refs/heads/main\n")
  assert index.git_revision(tmp_path / "repo") == "a" * 40
  (git / "refs" / "heads" / "main").write_text("b" * 40 + "\n")
  assert index.git_revision(tmp_path / "repo") == "b" * 40


def test_slots_split_cpus_and_give_one_gpu_each():
  slots_ = slots.make_slots(2, cpus=[0, 1, 2, 3, 4], gpus=["0", "1", "2"])
  assert [s.cpus for s in slots_] == [(0, 1), (2, 3)] and [s.gpu for s in slots_] == ["0", "1"]
  env = slots.child_env(slots_[1], base={"OMP_NUM_THREADS": "8"})
  assert env["OMP_NUM_THREADS"] == "2" and env["CUDA_VISIBLE_DEVICES"] == "1"
  assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in env
  # What the run applies itself at startup (`enter_slot`): its CPUs and the sweep's pid.
  assert env[slots.CPUS_VAR] == "2,3" and env[slots.PARENT_VAR] == str(os.getpid())
  shared = slots.make_slots(3, cpus=[0, 1], gpus=["0"])
  assert [s.cpus for s in shared] == [None] * 3 and all(s.gpu == "0" for s in shared)
  env = slots.child_env(shared[0], base={slots.CPUS_VAR: "7"})  # a sweep's run running a sweep
  assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" and slots.CPUS_VAR not in env
  assert "CUDA_VISIBLE_DEVICES" not in slots.child_env(slots.make_slots(1, [0], [])[0], {})


# A process that applies its slot as `python -m jaxdl` does, then reports its CPUs, the signal it
# gets when its parent dies (prctl PR_GET_PDEATHSIG) and whether the variables are gone.
_ENTER = """
import ctypes, json, os
from jaxdl.sweep import slots
slots.enter_slot()
sig = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(sig))
print(json.dumps([sorted(os.sched_getaffinity(0)), sig.value,
                  [v in os.environ for v in (slots.CPUS_VAR, slots.PARENT_VAR)]]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="affinity and prctl: Linux")
def test_a_run_takes_its_slot_at_startup_and_stops_if_the_sweep_is_gone():
  """The sweep starts its runs by a plain fork-exec (no code between fork and exec, which may
  deadlock in a process running jax's threads); each applies its slot itself."""
  cpu = sorted(os.sched_getaffinity(0))[-1]
  env = slots.child_env(slots.Slot(cpus=(cpu,), threads=1, gpu=None, gpu_shared=False))
  out = subprocess.run([sys.executable, "-c", _ENTER], env=env, capture_output=True, text=True,
                       timeout=60)
  assert out.returncode == 0, out.stderr
  assert json.loads(out.stdout) == [[cpu], signal.SIGTERM, [False, False]]
  # The sweep that started it is gone (another pid is its parent): it stops itself at once.
  env[slots.PARENT_VAR] = str(os.getpid() + 10_000_000)
  out = subprocess.run([sys.executable, "-c", _ENTER], env=env, capture_output=True, timeout=60)
  assert out.returncode == -signal.SIGTERM and not out.stdout
  # Any other process: nothing applied.
  plain = {k: v for k, v in env.items() if k not in (slots.CPUS_VAR, slots.PARENT_VAR)}
  out = subprocess.run([sys.executable, "-c", _ENTER], env=plain, capture_output=True, text=True,
                       timeout=60)
  assert json.loads(out.stdout)[1] == 0


def test_exit_codes_become_statuses(tmp_path):
  """Only an exit the run chose (1, 2) fails it; a signal leaves it resumable; a kill by any
  other signal is a vanished run (the scheduler starts it once more)."""
  (tmp_path / "logs").mkdir()
  record = {"workdir": "runs/r", "log": "logs/r.log"}
  log = tmp_path / "logs" / "r.log"
  log.write_text("jaxdl: stopped by SIGTERM at step 1\n# jaxdl sweep: 2026 attempt 2: cmd\n"
                 "Traceback ...\njaxdl: non-finite loss at step 3\nmore\n")
  assert scheduler.outcome(tmp_path, record, 1) == (
      index.FAILED, "jaxdl: non-finite loss at step 3")
  for code, how in ((130, "SIGINT"), (143, "SIGTERM"), (-signal.SIGTERM, "SIGTERM"),
                    (-signal.SIGINT, "SIGINT")):
    assert scheduler.outcome(tmp_path, record, code) == (
        index.PENDING, f"stopped ({how}); a rerun resumes it"), code
  # Stopped by the sweep in its first second (exit 1 before it could say so): resumable.
  assert scheduler.outcome(tmp_path, record, 1, signalled="SIGINT")[0] == index.PENDING
  assert scheduler.outcome(tmp_path, record, -9) == (
      index.PENDING, "vanished (killed by SIGKILL); a rerun resumes it")
  assert scheduler.vanished(-9) == "SIGKILL" and scheduler.vanished(-9, "SIGTERM") is None
  assert scheduler.vanished(-signal.SIGTERM) is None and scheduler.vanished(1) is None
  log.write_text("jaxdl: stopped by SIGTERM at step 10; its checkpoint is saved\n")
  status, error = scheduler.outcome(tmp_path, record, 0)
  assert status == index.PENDING and error.startswith("stopped (stopped by SIGTERM")
  with log.open("a") as f:  # the next attempt finishes: the previous one's line is history
    f.write("# jaxdl sweep: 2026 attempt 3: cmd\n{}\n")
  assert scheduler.outcome(tmp_path, record, 0) == (index.FINISHED, None)


# A stand-in for `jaxdl train` (a bare interpreter, no jax): what it does is the point's
# `train.steps` value, counted per attempt in its workdir.
_FAKE_RUN = """
import json, os, pathlib, signal, sys
workdir, how = pathlib.Path(sys.argv[1]), sys.argv[2]
workdir.mkdir(parents=True, exist_ok=True)
attempt = len(list(workdir.glob("attempt-*"))) + 1
(workdir / f"attempt-{attempt}").touch()
if how == "fails":
  print("jaxdl: loss became non-finite at step 3"); sys.exit(1)
if how == "stopped":  # SIGTERM from someone else than the sweep: saved, said so, exit 0
  print("jaxdl: stopped by SIGTERM at step 2; its checkpoint is saved"); sys.exit(0)
if how == "vanishes" or (how == "vanishes-once" and attempt == 1):
  os.kill(os.getpid(), signal.SIGKILL)
if how == "stops-the-sweep":  # the sweep's own process group gets SIGTERM while it runs
  signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
  os.kill(os.getppid(), signal.SIGTERM)
  signal.sigwait([signal.SIGTERM])
  (workdir / "checkpoints" / "1").mkdir(parents=True)  # as it says: a step to resume from
  print("jaxdl: stopped by SIGTERM at step 1; its checkpoint is saved"); sys.exit(0)
(workdir / "summary.json").write_text(json.dumps({"step": 1, "eval": {"loss": 0.5}}))
"""
_HOW = {"1": "finishes", "2": "fails", "3": "stopped", "4": "vanishes-once", "5": "vanishes",
        "6": "stops-the-sweep"}


@pytest.mark.parametrize("steps, code, says", [
    ("1,4", 0, None),  # finished, and vanished once (started again: finished)
    ("1,2", 1, "1 run failed: train.steps=2,seed=0"),
    ("1,3", 1, "1 run left unfinished (rerun the same command to resume): train.steps=3"),
    ("5", 1, "1 run left unfinished (rerun the same command to resume): train.steps=5"),
    ("6", 0, "jaxdl: sweep stopped by SIGTERM; the runs it started saved their current step"),
])
def test_the_exit_code_says_how_the_runs_ended(steps, code, says, tmp_path, capsys,
                                               monkeypatch):
  """0 only when every run finished (or the sweep was stopped by SIGTERM, its runs saved); a
  run that failed, stopped or vanished twice is named, exit 1. The scheduler runs a stand-in
  for `jaxdl train` (through the same subprocess start, session and signals)."""

  def fake(plan, record, workdir):
    how = _HOW[record["overrides"][0].split("=")[1]]
    return [sys.executable, "-c", _FAKE_RUN, str(workdir), how]

  monkeypatch.setattr(scheduler, "train_command", fake)
  out = tmp_path / "s"
  assert cli.main(["sweep", EXP, "--grid", f"train.steps={steps}", "--out", str(out)]) == code
  err = capsys.readouterr().err
  assert says is None or says in err, err
  idx = json.loads((out / "sweep.json").read_text())
  runs = idx["runs"]
  if steps == "1,4":
    assert runs["train.steps=4,seed=0"]["attempts"] == 2 and "retry    train.steps=4" in err
    assert all(r["status"] == index.FINISHED for r in runs.values())
  if steps == "5":
    assert runs["train.steps=5,seed=0"]["attempts"] == 2
    assert runs["train.steps=5,seed=0"]["error"].startswith("vanished (killed by SIGKILL)")
  if steps == "6":  # stopped once, by the sweep (its own session: not by the group signal too)
    assert runs["train.steps=6,seed=0"]["status"] == index.PENDING
  # The report marks no best point on unfinished seeds.
  assert not any(r["best_point"] and r["finished"] < r["seeds"]
                 for r in report.summarize(out)["rows"])


# --- the report, on hand-written workdirs ---

def _write_run(sweep, name, evals, *, finished=True, train_loss=0.5, locked=False):
  w = sweep / "runs" / name
  w.mkdir(parents=True)
  lines = [{"step": s, "split": "train", "loss": train_loss} for s, _ in evals]
  lines += [{"step": s, "split": "eval", "loss": v} for s, v in evals]
  (w / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
  if finished:
    (w / "summary.json").write_text(json.dumps({"step": evals[-1][0],
                                                "eval": {"loss": evals[-1][1]}}))
  if locked:  # held by a live process (this one)
    import socket
    (w / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                         "started": "2026-01-01T00:00:00"}))


@pytest.fixture
def hand_written_sweep(tmp_path):
  sweep = tmp_path / "sweep"
  plan = grid.plan(EXP, BASE, ["optim.lr=1e-3,1e-2,1e-1"], seeds=3)
  idx = index.merge(None, plan)
  a, b, c = "optim.lr=0.001", "optim.lr=0.01", "optim.lr=0.1"
  # lr 1e-3: three finished seeds; the middle record of seed 1 was logged twice (a resume).
  _write_run(sweep, f"{a},seed=0", [(10, 0.5), (20, 0.4)])
  _write_run(sweep, f"{a},seed=1", [(10, 0.9), (10, 0.6), (20, 0.45)])
  _write_run(sweep, f"{a},seed=2", [(10, 0.5), (20, 0.47)])
  # lr 1e-2: two finished, one still running.
  _write_run(sweep, f"{b},seed=0", [(10, 0.3), (20, 0.35)])
  _write_run(sweep, f"{b},seed=1", [(10, 0.3), (20, 0.31)])
  _write_run(sweep, f"{b},seed=2", [(10, 0.3)], finished=False, locked=True)
  # lr 1e-1: diverged (null = non-finite), failed by exit code, and never started.
  _write_run(sweep, f"{c},seed=0", [(10, 2.0), (20, None)], finished=False, train_loss=None)
  idx["runs"][f"{c},seed=1"].update(status=index.FAILED, returncode=2,
                                    error="jaxdl: error: data.n: must be > 0")
  index.write(sweep, idx)
  return sweep


def test_the_report_gives_mean_and_t_interval_per_point(hand_written_sweep):
  rep = report.summarize(hand_written_sweep)
  rows = {r["point"]: r for r in rep["rows"]}
  a, b, c = rows["optim.lr=0.001"], rows["optim.lr=0.01"], rows["optim.lr=0.1"]
  finals = [0.4, 0.45, 0.47]
  m = sum(finals) / 3
  s = math.sqrt(sum((x - m) ** 2 for x in finals) / 2)
  assert a["final_mean"] == pytest.approx(m)
  assert a["final_ci95"] == pytest.approx(4.302652729911275 * s / math.sqrt(3))  # t_{.975, 2}
  assert a["best_mean"] == pytest.approx((0.4 + 0.45 + 0.47) / 3)  # 0.6 replaced 0.9 at step 10
  assert (a["finished"], b["finished"], b["running"]) == (3, 2, 1)
  assert b["final_mean"] == pytest.approx(0.33) and b["best_mean"] == pytest.approx(0.3)
  # b's mean is better, but one of its seeds is still running: only a point whose every seed
  # finished is marked best.
  assert a["best_point"] and not b["best_point"] and not c["best_point"]
  assert (c["failed"], c["pending"], c["final_mean"]) == (2, 1, None)
  assert "seed 0: non-finite train/loss at step 10" in c["error"]
  assert "seed 1: jaxdl: error: data.n: must be > 0" in c["error"]
  table = report.format_table(rep)
  assert table.splitlines()[1].startswith("*  optim.lr=0.001") and "3/0/0/0" in table


def test_report_command_writes_csv_json_and_figures(hand_written_sweep, tmp_path, capsys):
  csv_path, json_path = tmp_path / "r.csv", tmp_path / "r.json"
  assert cli.main(["sweep", "report", str(hand_written_sweep), "--csv", str(csv_path),
                   "--json", str(json_path)]) == 0
  out = capsys.readouterr().out
  assert "0.44 ± 0.09" in out
  header, *rows = csv_path.read_text().splitlines()
  assert header.startswith("point,optim.lr,seeds,finished,failed,running,pending,final_mean")
  assert len(rows) == 3 and rows[1].split(",")[1] == "0.01"
  assert len(json.loads(json_path.read_text())["runs"]) == 9
  figures = hand_written_sweep / "report"
  assert (figures / "eval_loss_vs_optim.lr.png").stat().st_size > 0
  assert (figures / "curves.png").stat().st_size > 0
  assert cli.main(["sweep", "report", str(tmp_path / "nothing")]) == 2
