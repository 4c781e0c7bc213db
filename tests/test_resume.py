"""End to end in real subprocesses: SIGKILL bit-exact resume, SIGTERM checkpoint, corrupt-checkpoint
fallback, workdir mismatch, non-finite loss, run extension."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.config import load_config
from jaxdl.train import NonFiniteLossError, run
from jaxdl.train.checkpoint import load_state
from jaxdl.train.writers import read_metrics

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Mini-batches with reshuffled epochs, dropout and BatchNorm: every source of step-to-step state.
OVERRIDES = ["--set", "data.batch_size=200", "--set", "model.dropout=0.1",
             "--set", "train.log_every=1", "--set", "train.eval_every=5",
             "--set", "train.plot=False", "--set", "train.async_checkpoint=True"]
N = 10


def _env():
  env = dict(os.environ)
  env["XLA_FLAGS"] = os.environ["XLA_FLAGS"].replace("device_count=4", "device_count=2")
  env["JAX_PLATFORMS"] = "cpu"
  return env


def _jaxdl(*args, check=True, experiment="moons_mlp:bn", env=None, **kw):
  proc = subprocess.run([sys.executable, "-m", "jaxdl", "train", experiment, *args,
                         "--no-progress"], env=env or _env(), cwd=ROOT, capture_output=True,
                        text=True, timeout=240, **kw)
  if check and proc.returncode != 0:
    raise AssertionError(proc.stderr[-3000:])
  return proc


# Runs the real CLI and SIGKILLs its own process at a chosen point (argv[1]):
#   'save:S'  right after the async save of step S is dispatched, before it is finalized;
#   'step:K'  when step K is dispatched (the checkpoints before it complete).
KILLER = """
import os, signal, sys
from jaxdl.train import checkpoint, loop
where, at = sys.argv[1].split(":"); at = int(at)
if where == "save":
  original = checkpoint.Checkpointer.save
  def save_then_die(self, step, *a, **kw):
    out = original(self, step, *a, **kw)
    if step == at:
      os.kill(os.getpid(), signal.SIGKILL)
    return out
  checkpoint.Checkpointer.save = save_then_die
else:
  advance = loop._Loop.advance
  def advance_then_die(self, s, *a, **kw):
    if s + 1 == at:
      self.ckpt.wait()
      os.kill(os.getpid(), signal.SIGKILL)
    return advance(self, s, *a, **kw)
  loop._Loop.advance = advance_then_die
from jaxdl.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _train_records(workdir):
  return {r["step"]: r for r in read_metrics(workdir, "train")}


# (experiment, overrides, steps, ckpt_every, kill at a save): every source of step-to-step state.
# moons_mlp:bn: mini-batches with reshuffled epochs, dropout and BatchNorm. bpe_gpt:smoke (shrunk):
# a BPE-tokenized ArrayRecord corpus read through grain, packed with segment ids. The augmented
# CNN: random crops drawn per (seed, epoch, record), so the resumed run must redraw the same ones.
CASES = {
    "moons_mlp:bn": (OVERRIDES, 2 * N, N // 2, True),
    "bpe_gpt:smoke": (["--set", "data.max_bytes=40000", "--set", "data.vocab=300",
                       "--set", "model.n_layer=1", "--set", "model.d_model=32",
                       "--set", "data.max_eval_windows=8", "--set", "model.dropout=0.1",
                       "--set", "train.log_every=1", "--set", "train.eval_every=4",
                       "--set", "train.plot=False", "--set", "train.async_checkpoint=True",
                       "--set", "sample.max_new_tokens=0"], 8, 2, False),
    "digits_cnn:subset,aug": (["--set", "train.log_every=1", "--set", "train.eval_every=4",
                               "--set", "train.plot=False",
                               "--set", "train.async_checkpoint=True"], 8, 2, False),
}


@pytest.mark.parametrize("experiment", list(CASES))
def test_sigkill_during_a_save_and_at_a_random_step_then_resume_is_bit_exact(
    experiment, tmp_path):
  """Killed at a random step (resumes from the newest checkpoint before it, or from scratch)
  and, for the MLP, while the async checkpoint of step N is being written (that step is lost,
  the run falls back to step N/2): every resumed run ends bit-identical to an uninterrupted
  one, metrics included."""
  overrides, steps, every, kill_in_save = CASES[experiment]
  env = {**_env(), "JAXDL_CACHE": str(tmp_path / "cache")}  # prepared data shared by the runs
  train = lambda *a, **kw: _jaxdl(*a, experiment=experiment, env=env, **kw)  # noqa: E731
  full = tmp_path / "full"
  common = [*overrides, "--set", f"train.steps={steps}", "--set", f"train.ckpt_every={every}"]
  train("--workdir", str(full), *common)
  _, state_full = load_state(full)
  a = _train_records(full)
  at_random = int(np.random.default_rng().integers(2, steps + 1))
  last_save = (at_random - 1) // every * every   # the newest complete checkpoint
  kills = [(f"step:{at_random}", last_save)]
  if kill_in_save:
    kills.insert(0, (f"save:{steps // 2}", steps // 2 - every))
  for kill, restart in kills:
    killed = tmp_path / kill.replace(":", "_")
    proc = subprocess.run([sys.executable, "-c", KILLER, kill, "train", experiment,
                           "--workdir", str(killed), *common, "--no-progress"], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    resumed = train("--workdir", str(killed), *common)
    # The summary is the CLI's last output (bpe_gpt prints a decoded sample before it).
    summary = json.loads(resumed.stdout[resumed.stdout.rindex('{\n  "workdir"'):])
    assert summary["start_step"] == restart, kill
    _, state_resumed = load_state(killed)
    jax.tree.map(np.testing.assert_array_equal, state_full, state_resumed)  # bit-identical
    b = _train_records(killed)
    for s in range(restart + 1, steps + 1):
      assert a[s] == b[s], f"{kill}, step {s}: {a[s]} != {b[s]}"


def test_sigterm_saves_current_step_and_exits_0(tmp_path):
  workdir = tmp_path / "pre"
  proc = subprocess.Popen([sys.executable, "-m", "jaxdl", "train", "moons_mlp", "--workdir",
                           str(workdir), *OVERRIDES, "--set", "train.steps=100000",
                           "--set", "train.ckpt_every=0", "--no-progress"], env=_env(), cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  metrics = workdir / "metrics.jsonl"
  deadline = time.time() + 120
  while time.time() < deadline and not (metrics.exists() and  # 20 train records written
                                        metrics.read_text().count('"split": "train"') > 20):
    time.sleep(0.2)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err[-2000:]
  summary = json.loads(out)
  assert summary["preempted"] and 20 <= summary["step"] < 100000
  step, state = load_state(workdir)
  assert step == summary["step"] == int(state["step"])
  events = [json.loads(l) for l in metrics.read_text().splitlines() if '"event"' in l]
  assert events[-1]["event"] == "preempted" and events[-1]["step"] == step


def _config(*overrides):
  config, _ = load_config("moons_mlp", ["train.plot=False", "train.log_every=1",
                                        "data.batch_size=200", *overrides])
  return config


def test_corrupt_latest_checkpoint_falls_back_to_previous(tmp_path, caplog):
  workdir = tmp_path / "c"
  run(_config("train.steps=20", "train.ckpt_every=10"), workdir, progress=False)
  # Truncate every data file of the latest step's state, as a crash mid-write would.
  for f in (workdir / "checkpoints" / "20" / "state").rglob("*"):
    if f.is_file() and f.stat().st_size > 0:
      f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])
  summary = run(_config("train.steps=30", "train.ckpt_every=10"), workdir, progress=False)
  assert summary["start_step"] == 10 and summary["step"] == 30
  assert "checkpoint at step 20 is unreadable" in caplog.text


def test_workdir_of_other_config_is_refused_then_forced(tmp_path, capsys):
  workdir = tmp_path / "w"
  run(_config("train.steps=4", "train.ckpt_every=2"), workdir, progress=False)
  before = sorted(p.name for p in workdir.rglob("*"))
  code = cli.main(["train", "moons_mlp", "--workdir", str(workdir), "--set", "optim.lr=0.5",
                   "--set", "data.batch_size=200", "--set", "train.plot=False",
                   "--set", "train.log_every=1", "--set", "train.steps=4"])
  assert code == 2
  err = capsys.readouterr().err
  assert "optim.lr: 0.01 -> 0.5" in err and "--force" in err
  assert sorted(p.name for p in workdir.rglob("*")) == before
  summary = run(_config("train.steps=6", "optim.lr=0.5"), workdir, force=True, progress=False)
  assert summary["start_step"] == 4


def test_nonfinite_loss_stops_with_step_and_saves_nothing_bad(tmp_path):
  workdir = tmp_path / "nan"
  with pytest.raises(NonFiniteLossError, match=r"at step \d+"):
    run(_config("train.steps=200", "train.ckpt_every=5", "optim.lr=1e30"), workdir,
        progress=False)
  for step in sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()
                     if p.name.isdigit()):
    _, state = load_state(workdir, step)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state["params"]))


def test_extension_wsd_allowed_cosine_refused(tmp_path):
  base = ["train.ckpt_every=10", "optim.schedule.warmup_steps=2"]
  wsd = tmp_path / "wsd"
  run(_config("train.steps=20", "optim.schedule.name='wsd'", *base), wsd, progress=False)
  # As if preempted right after the stable-phase checkpoint at step 10 (decay starts at 16).
  shutil.rmtree(wsd / "checkpoints" / "20")
  summary = run(_config("train.steps=30", "optim.schedule.name='wsd'", *base), wsd,
                progress=False)
  assert summary["start_step"] == 10 and summary["step"] == 30
  lrs = {r["step"]: r["lr"] for r in read_metrics(wsd, "train")}
  assert lrs[11] == lrs[20] == pytest.approx(0.01)  # still stable where the old run decayed
  # With the default warmup_frac the warmup would move with train.steps; the engine pins it.
  frac = tmp_path / "wsd_frac"
  wsd_frac = ["train.ckpt_every=10", "optim.schedule.name='wsd'", "optim.schedule.warmup_frac=0.1"]
  run(_config("train.steps=20", *wsd_frac), frac, progress=False)
  shutil.rmtree(frac / "checkpoints" / "20")
  before = {r["step"]: r["lr"] for r in read_metrics(frac, "train")}
  assert run(_config("train.steps=30", *wsd_frac), frac, progress=False)["start_step"] == 10
  after = [r for r in read_metrics(frac, "train")][-20:]
  assert before[2] == pytest.approx(0.005)  # warmup of 2 steps = 10% of the original 20
  assert json.loads((frac / "config.json").read_text())["optim"]["schedule"]["warmup_steps"] == 2
  assert [r["step"] for r in after] == list(range(11, 31))
  cos = tmp_path / "cos"
  run(_config("train.steps=20", "optim.schedule.name='cosine'", *base), cos, progress=False)
  with pytest.raises(ValueError,
                     match="train.steps: the new schedule changes the lr of steps already taken"):
    run(_config("train.steps=30", "optim.schedule.name='cosine'", *base), cos, progress=False)
