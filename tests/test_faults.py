"""Faults a long unattended run meets: corrupt checkpoints (all of them, or one flipped byte), a
second run on the same workdir, a stale lock, `--force` with another model, a leftover tmp
checkpoint, restarting a finished run. Each ends in a usable workdir: bit-identical to an
uninterrupted run, or refused with one line and the documented exit code, nothing lost.

One uninterrupted run is trained once (module fixture) and copied per test; runs are in-process.
"""

import hashlib
import json
import logging
import os
import pathlib
import shutil
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.config import load_config
from jaxdl.train import checkpoint as jckpt
from jaxdl import disk_errors
from jaxdl.train import run, workdir as jworkdir
from jaxdl.train.checkpoint import load_state

import warm_python

pytestmark = pytest.mark.slow

STEPS, EVERY = 10, 5
SETTINGS = [f"train.steps={STEPS}", f"train.ckpt_every={EVERY}", "train.plot=False",
            "data.batch_size=200", "train.log_every=1"]


def _config(*overrides):
  config, _ = load_config("moons_mlp", [*SETTINGS, *overrides])
  return config


def _cli(workdir, *extra):
  sets = [a for kv in SETTINGS for a in ("--set", kv)]
  return cli.main(["train", "moons_mlp", "--workdir", str(workdir), *sets, *extra,
                   "--no-progress"])


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  """An uninterrupted run: checkpoints at steps 5 and 10, summary stored."""
  workdir = tmp_path_factory.mktemp("faults") / "base"
  summary = run(_config(), workdir, progress=False)
  return workdir, summary


def _copy(base, tmp_path) -> pathlib.Path:
  workdir = tmp_path / "w"
  shutil.copytree(base[0], workdir)
  return workdir


def _assert_same_state(a, b):
  (step_a, state_a), (step_b, state_b) = load_state(a), load_state(b)
  assert step_a == step_b
  jax.tree.map(np.testing.assert_array_equal, state_a, state_b)  # bit-identical


def _digest(workdir) -> dict:
  return {p.relative_to(workdir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(pathlib.Path(workdir).rglob("*")) if p.is_file()}


@pytest.fixture
def caplog(caplog):
  """caplog that also sees the jaxdl logger (the CLI stops it propagating to the root)."""
  logger = logging.getLogger("jaxdl")
  level, propagate = logger.level, logger.propagate
  logger.addHandler(caplog.handler)
  logger.setLevel(logging.INFO)
  logger.propagate = False  # each record once, whether or not the CLI ran before
  yield caplog
  logger.removeHandler(caplog.handler)
  logger.setLevel(level)
  logger.propagate = propagate


def _warnings(caplog, text):
  return [r for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


def test_every_checkpoint_corrupt_is_quarantined_and_the_run_completes(base, tmp_path, caplog,
                                                                        capsys):
  workdir = _copy(base, tmp_path)
  for step in (EVERY, STEPS):
    for f in (workdir / "checkpoints" / str(step) / "state").rglob("*"):
      if f.is_file() and f.stat().st_size > 0:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])  # as a crash mid-write leaves it
  assert _cli(workdir) == 0
  assert "Traceback" not in capsys.readouterr().err
  lines = _warnings(caplog, "unreadable")
  assert len(lines) == 1, [r.getMessage() for r in lines]
  assert f"checkpoints at steps {STEPS}, {EVERY} are unreadable" in lines[0].getMessage()
  assert "starting fresh" in lines[0].getMessage()
  assert len(list((workdir / "corrupt_checkpoints").iterdir())) == 2
  _assert_same_state(base[0], workdir)  # a fresh start is the same run


def test_flipped_byte_is_detected_and_the_previous_checkpoint_used(base, tmp_path, caplog):
  workdir = _copy(base, tmp_path)
  state_dir = workdir / "checkpoints" / str(STEPS) / "state"
  data = max((f for f in state_dir.rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
  raw = bytearray(data.read_bytes())
  raw[len(raw) // 2] ^= 0x01
  data.write_bytes(bytes(raw))
  summary = run(_config(), workdir, progress=False)
  assert summary["start_step"] == EVERY and summary["step"] == STEPS
  (line,) = _warnings(caplog, "unreadable")
  assert "checksum mismatch in state/" in line.getMessage()
  assert f"falling back to step {EVERY}" in line.getMessage()
  _assert_same_state(base[0], workdir)


def test_second_run_on_a_locked_workdir_exits_2_naming_the_holder(base, tmp_path, capsys):
  workdir = _copy(base, tmp_path)
  holder = subprocess.Popen(["sleep", "60"])  # a live process of this host holds the lock
  try:
    (workdir / ".lock").write_text(json.dumps(
        {"host": socket.gethostname(), "pid": holder.pid, "started": "2025-01-02T03:04:05"}))
    before = _digest(workdir)
    assert _cli(workdir, "--set", "seed=7") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{socket.gethostname()}:{holder.pid} since 03:04" in err[0], err
    assert _digest(workdir) == before  # the first run's files are intact
  finally:
    holder.kill()
    holder.wait()


def test_lock_is_exclusive_and_released_on_error(tmp_path):
  workdir = tmp_path / "w"
  with jworkdir.lock(workdir):
    with pytest.raises(jworkdir.WorkdirLockedError, match=f":{os.getpid()} since"):
      with jworkdir.lock(workdir):
        pass
  assert not workdir.exists()  # created for the lock, left empty: removed
  with pytest.raises(RuntimeError):
    with jworkdir.lock(workdir):
      (workdir / "x").write_text("")
      raise RuntimeError
  assert not (workdir / ".lock").exists()


def test_stale_lock_is_taken_over_and_a_complete_run_returns_its_summary(base, tmp_path, caplog):
  workdir = _copy(base, tmp_path)
  dead = subprocess.Popen(["true"])
  dead.wait()
  (workdir / ".lock").write_text(json.dumps(
      {"host": socket.gethostname(), "pid": dead.pid, "started": "2025-01-02T03:04:05"}))
  summary = run(_config(), workdir, progress=False)
  assert summary == base[1]
  assert len(_warnings(caplog, "took over the stale lock")) == 1
  assert f"already complete at step {STEPS}" in caplog.text
  assert not (workdir / ".lock").exists()


def test_complete_run_in_the_cli_prints_the_stored_summary(base, tmp_path, capsys):
  workdir = _copy(base, tmp_path)
  before = _digest(workdir)
  assert _cli(workdir) == 0
  printed = json.loads(capsys.readouterr().out)
  assert printed["step"] == STEPS and printed["eval"] == base[1]["eval"]
  assert _digest(workdir) == before  # nothing retrained, re-evaluated or re-plotted


def test_complete_run_killed_before_its_summary_recomputes_and_stores_it(base, tmp_path, capsys):
  """A kill between the final checkpoint and summary.json: the rerun restores the final step,
  evaluates it (the same numbers), reads its train metrics back, stores the summary, exit 0."""
  workdir = _copy(base, tmp_path)
  (workdir / "summary.json").unlink()
  assert _cli(workdir) == 0
  printed = json.loads(capsys.readouterr().out)
  assert printed["step"] == STEPS and printed["start_step"] == STEPS
  assert printed["eval"] == base[1]["eval"] and printed["train"] == base[1]["train"]
  stored = jworkdir.read_summary(workdir)
  assert stored["eval"] == base[1]["eval"] and stored["step"] == STEPS
  assert _cli(workdir) == 0  # and from now on it is a complete run with its summary
  assert json.loads(capsys.readouterr().out)["eval"] == base[1]["eval"]


def test_force_with_another_model_moves_the_old_run_aside(base, tmp_path, caplog):
  workdir = _copy(base, tmp_path)
  old = _digest(workdir)
  summary = run(_config("model.hidden=(32,32,32)"), workdir, force=True, progress=False)
  assert summary["start_step"] == 0 and summary["step"] == STEPS
  (previous,) = workdir.glob("previous-*")
  assert _digest(previous) == old  # the old run, whole
  assert len(_warnings(caplog, "moved it to")) == 1
  assert json.loads((workdir / "config.json").read_text())["model"]["hidden"] == [32, 32, 32]


def test_leftover_tmp_checkpoint_is_removed(base, tmp_path, caplog):
  workdir = _copy(base, tmp_path)
  tmp = workdir / "checkpoints" / f"{STEPS + EVERY}{jckpt.TMP_MARK}"
  (tmp / "state").mkdir(parents=True)
  (tmp / "state" / "partial").write_bytes(b"\0" * 10)
  ckpt = jckpt.Checkpointer(workdir / "checkpoints")
  ckpt.close()
  assert not tmp.exists() and ckpt.all_steps() == [EVERY, STEPS]
  assert len(_warnings(caplog, "unfinished checkpoint save")) == 1


def test_an_experiment_with_its_own_loop_is_locked_too(tmp_path, capsys):
  """The optimizer toys run their own loop (`run(config, workdir)`), not the training loop; a
  live run's lock refuses them as well, and they release the lock they take."""
  workdir = tmp_path / "toy"
  workdir.mkdir()
  holder = subprocess.Popen(["sleep", "60"])
  try:
    (workdir / ".lock").write_text(json.dumps(
        {"host": socket.gethostname(), "pid": holder.pid, "started": "2025-01-02T03:04:05"}))
    assert cli.main(["train", "sgd_vs_momentum", "--workdir", str(workdir)]) == 2
    assert "is in use by" in capsys.readouterr().err
    assert sorted(os.listdir(workdir)) == [".lock"]  # nothing written
  finally:
    holder.kill()
    holder.wait()
  (workdir / ".lock").unlink()
  assert cli.main(["train", "sgd_vs_momentum", "--workdir", str(workdir)]) == 0
  assert (workdir / "results.json").exists() and not (workdir / ".lock").exists()


def _one_device_env() -> dict:
  """The suite's environment (its fast-compile XLA flags) with one CPU device, as a user has."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  return {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(flags)}


def test_two_cli_processes_on_one_workdir_one_trains_the_other_is_refused(tmp_path):
  """Two `jaxdl train` processes started together on one workdir: exactly one takes the lock
  and trains to the end; the other exits 2 naming it, and the workdir holds one run."""
  workdir = tmp_path / "w"
  cmd = [sys.executable, "-m", "jaxdl", "train", "moons_mlp", "--workdir", str(workdir),
         "--no-progress", "--set", "train.plot=False", "--set", "train.ckpt_every=50",
         "--set", "train.steps=100"]  # long enough that the two runs overlap
  env = _one_device_env()
  procs = [warm_python.Popen([*cmd, "--set", f"seed={seed}"], env=env) for seed in (1, 2)]
  outs = [(p.wait(timeout=300), *p.communicate()) for p in procs]
  assert sorted(rc for rc, _, _ in outs) == [0, 2], outs
  (_, _, refused_err), = [o for o in outs if o[0] == 2]
  assert "is in use by" in refused_err and "Traceback" not in refused_err, refused_err
  (winner_out, ), = [(o[1],) for o in outs if o[0] == 0]
  seed = json.loads((workdir / "config.json").read_text())["seed"]
  assert json.loads(winner_out)["workdir"] == str(workdir) and seed in (1, 2)
  steps = [r["step"] for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())
           if r["split"] == "train"]
  assert steps == sorted(set(steps))  # one run's records, no duplicates
  assert not (workdir / ".lock").exists()


def test_closed_event_loop_noise_from_failed_saves_is_dropped_and_nothing_else():
  """After a failed checkpoint write orbax closes its event loop while tensorstore completes
  the other writes; their callbacks' "Event loop is closed" reaches sys.unraisablehook as a bare
  traceback each. The CLI's hook drops exactly those and passes anything else on."""
  import types
  seen = []
  hook = disk_errors.QuietClosedLoop(seen.append)
  noise = types.SimpleNamespace(exc_value=RuntimeError("Event loop is closed"))
  other = types.SimpleNamespace(exc_value=RuntimeError("something else"))
  hook(noise)
  hook(other)
  assert seen == [other]


def test_stopping_closes_everything_even_when_a_closer_fails():
  """The loop's teardown calls every closer (an unclosed checkpoint manager or event writer
  keeps writing from its threads during interpreter shutdown). After a failed loop the closers'
  errors become notes on its error; after a clean loop the first one is raised."""
  from jaxdl.train.guards import close_all
  called = []

  def ok(name):
    return lambda: called.append(name)

  def full_disk():
    called.append("ckpt")
    raise OSError(28, "No space left on device")

  loop_error = ValueError("the step failed")
  close_all((ok("profiler"), full_disk, ok("writer")), failed=loop_error)
  assert called == ["profiler", "ckpt", "writer"]
  assert len(loop_error.__notes__) == 1 and "No space left" in loop_error.__notes__[0]
  called.clear()
  with pytest.raises(OSError, match="No space left"):
    close_all((full_disk, ok("writer")), failed=None)
  assert called == ["ckpt", "writer"]


@pytest.fixture
def small_tmpfs(tmp_path):
  """A 300 KiB tmpfs (needs root and mount rights; skipped elsewhere, where the patched-write
  test in test_durability.py stands in)."""
  mnt = tmp_path / "disk"
  mnt.mkdir()
  yield from _mounted_tmpfs(mnt, "size=300k")


def _mounted_tmpfs(path, options: str):
  """Yields `path` with a tmpfs of `options` mounted on it, unmounted afterwards; skips the
  test where mounting is not allowed."""
  r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                     capture_output=True)
  if r.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs ({options}) here")
  yield path
  subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_real_full_disk_is_one_line_and_the_run_resumes_once_space_is_freed(small_tmpfs):
  workdir = small_tmpfs / "w"
  cmd = [sys.executable, "-m", "jaxdl", "train", "moons_mlp", "--workdir", str(workdir),
         "--no-progress", "--set", "train.steps=20", "--set", "train.ckpt_every=1",
         "--set", "train.keep_ckpts=20", "--set", "train.plot=False"]
  env = _one_device_env()
  full = warm_python.run(cmd, env=env, timeout=300)
  err = [line for line in full.stderr.splitlines() if line.strip()]
  assert full.returncode == 1 and len(err) == 1, full.stderr[-3000:]
  assert "no space left on device" in err[0] and str(workdir) in err[0]
  kept, _ = load_state(workdir)
  assert kept >= 1  # the last good checkpoint survived the failed save
  subprocess.run(["mount", "-o", "remount,size=64m", str(small_tmpfs)], check=True)
  done = warm_python.run(cmd, env=env, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert json.loads(done.stdout)["step"] == 20 and load_state(workdir)[0] == 20


@pytest.fixture
def read_only_checkpoints(tmp_path):
  """A workdir whose checkpoints/ folder cannot be written: chmod 555 for an unprivileged user;
  as root (whom modes do not stop) a read-only tmpfs mounted there; skipped where neither."""
  workdir = tmp_path / "w"
  ckpts = workdir / "checkpoints"
  ckpts.mkdir(parents=True)
  if os.geteuid() != 0:
    ckpts.chmod(0o555)
    yield workdir
    ckpts.chmod(0o755)
    return
  for _ in _mounted_tmpfs(ckpts, "ro,size=64k"):
    yield workdir


def test_a_failed_async_save_ends_the_program_in_seconds_with_one_line(read_only_checkpoints):
  """After an asynchronous save fails, orbax's signalling threads of that save wait (as threads
  the interpreter joins at exit) for a signal it never sends; the program must not wait with
  them: one line, exit 1, well within the timeout (it used to hang until killed)."""
  workdir = read_only_checkpoints
  cmd = [sys.executable, "-m", "jaxdl", "train", "moons_mlp:smoke", "--workdir", str(workdir),
         "--no-progress", "--set", "train.steps=2", "--set", "train.plot=False"]
  done = subprocess.run(cmd, env=_one_device_env(), capture_output=True, text=True, timeout=60)
  err = [line for line in done.stderr.splitlines() if line.strip()]
  assert done.returncode == 1 and len(err) == 1, done.stderr[-3000:]
  assert str(workdir / "checkpoints") in err[0] and (
      "read-only" in err[0] or "permission denied" in err[0]), err[0]
  assert not (workdir / ".lock").exists()
