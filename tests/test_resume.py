"""End to end in real processes (forked from tests/warm_python.py's warm interpreter): SIGKILL
bit-exact resume, SIGTERM checkpoint; and corrupt-checkpoint fallback, workdir mismatch,
non-finite loss, run extension."""

import json
import os
import pathlib
import shutil
import signal
import sys
import time

import jax
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.config import load_config
from jaxdl.train import NonFiniteLossError, run
from jaxdl.train.checkpoint import load_state
from jaxdl.train.writers import read_metrics, read_records

import warm_python

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


def _jaxdl(*args, check=True, experiment="moons_mlp:bn", env=None):
  proc = warm_python.run([sys.executable, "-m", "jaxdl", "train", experiment, *args,
                          "--no-progress"], env=env or _env(), cwd=ROOT, timeout=240)
  if check and proc.returncode != 0:
    raise AssertionError(proc.stderr[-3000:])
  return proc


# Runs the real CLI and SIGKILLs its own process at a chosen point (argv[1]):
#   'save:S'  right after the async save of step S is dispatched, before it is finalized;
#   'step:K'  when step K is dispatched (the checkpoints before it complete).
# argv[2], when not empty, is a workdir where the same command first runs uninterrupted (the
# reference run shares the process, and its imports, with the first killed one); argv[3] is the
# killed run's workdir, then the `jaxdl` arguments.
KILLER = """
import os, signal, sys
from jaxdl.cli import load_library_frozen, main
load_library_frozen()  # as the `jaxdl` program does before its command
from jaxdl.train import checkpoint, loop
kill, reference, workdir, *args = sys.argv[1:]
if reference and main([*args, "--workdir", reference]) != 0:
  sys.exit(3)
where, at = kill.split(":"); at = int(at)
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
sys.exit(main([*args, "--workdir", workdir]))
"""


def _records(workdir) -> list[dict]:
  """metrics.jsonl's train and eval records in file order, the killed attempts' included."""
  return [r for split in ("train", "eval") for r in read_metrics(workdir, split)]


def _text_table(root) -> pathlib.Path:
  """A Parquet file of 60 code-like rows (about 6 kB): 81 train windows of 64 bytes, 2 batches
  of 32 an epoch, so 8 steps run 4 epochs, each reshuffled."""
  import pyarrow as pa
  import pyarrow.parquet as pq
  rng = np.random.default_rng(0)
  words = ["def", "return", "x", "y", "for", "in", "range", "if", "else", "(", ")", ":", "+"]
  rows = [f"def f{i}(x):\n    " + " ".join(rng.choice(words, 24)) + "\n" for i in range(60)]
  pq.write_table(pa.table({"text": rows}), root / "text.parquet")
  return root / "text.parquet"


def _prepared_images(root) -> pathlib.Path:
  """A tiny image folder (3 classes of 12 8x8 RGB pngs) prepared by `jaxdl data prepare`: 32
  train images, 4 batches of 8 an epoch, so 8 steps run 2 epochs."""
  from PIL import Image
  rng = np.random.default_rng(0)
  folder, out = root / "imgs", root / "prepared"
  for cls in ("ants", "bees", "wasps"):
    (folder / cls).mkdir(parents=True)
    for i in range(12):
      Image.fromarray(rng.integers(0, 256, (8, 8, 3), np.uint8)).save(folder / cls / f"{i}.png")
  assert cli.main(["data", "prepare", str(folder), "--out", str(out)]) == 0
  return out


def _sets(*kvs):
  return [a for kv in kvs for a in ("--set", kv)]


# A one-layer GPT of d 32 and 300 ids: the BPE case's and the Parquet case's (bytes, 257 ids)
# programs are the same, so the second compiles nothing; its one block unrolled, not scanned
# (a GPT process costs about 7 CPU-s instead of 8.5, mostly tracing).
TINY_GPT = _sets("model.n_layer=1", "model.scan_layers=False", "model.d_model=32",
                 "model.vocab_size=300", "model.dropout=0.1", "data.max_eval_windows=8",
                 "train.log_every=1", "train.eval_every=4", "train.plot=False",
                 "train.async_checkpoint=True", "sample.max_new_tokens=0")
# One case per kind of data: (experiment, overrides, steps, ckpt_every, data it needs or None).
# Each has step-to-step state besides the parameters that a resume must restore exactly.
CASES = {
    # embedded arrays: mini-batches with reshuffled epochs, dropout and BatchNorm statistics.
    "embedded": ("moons_mlp:bn", OVERRIDES, 2 * N, N // 2, None),
    # prepared text: a BPE-tokenized ArrayRecord corpus read through grain, read document by
    # document and packed with segment ids.
    "prepared_text": ("bpe_gpt:smoke", [*_sets("data.max_bytes=40000", "data.vocab=300"),
                                        *TINY_GPT], 8, 2, None),
    # prepared images with augmentation: records decoded from ArrayRecord shards, random crops
    # and flips drawn per (seed, epoch, record), which the resumed run must draw again.
    "prepared_images": ("digits_cnn:data={data}", _sets(
        "data.batch_size=8", "data.augment=('crop=2','flip')", "model.features=(8,)",
        "model.hidden=0", "train.log_every=1", "train.eval_every=4", "train.plot=False",
        "train.async_checkpoint=True"), 8, 2, _prepared_images),
    # a Parquet table read in place: byte-tokenized rows packed into an in-memory stream.
    "parquet": ("char_gpt:smoke", [*_sets("data.name=parquet", "data.path={data}",
                                          "data.context_length=64", "data.segment_ids=True"),
                                   *TINY_GPT], 8, 2, _text_table),
}


def _kill_points(rng, steps: int, every: int) -> list[tuple[str, int]]:
  """Three kill points in order, each with the step its resume starts from: during the async
  save of a random checkpoint step P (that save is lost: back to P - every, 0 being a fresh
  start), then at two random later steps (back to the newest checkpoint before each)."""
  save = int(rng.choice(np.arange(every, steps - 1, every)))
  k2 = int(rng.integers(save + 1, steps))
  k3 = int(rng.integers(k2 + 1, steps + 1))
  return [(f"save:{save}", save - every), *((f"step:{k}", (k - 1) // every * every)
                                            for k in (k2, k3))]


@pytest.mark.parametrize("case", list(CASES))
def test_sigkill_three_times_in_one_workdir_then_resume_is_bit_exact(case, tmp_path):
  """One workdir killed three times (during an async save, then at two random later steps),
  each time resumed from the newest complete checkpoint, then run to the end: its final state is
  bit-identical to an uninterrupted run's, and so is every train and eval record metrics.jsonl
  holds, those the killed attempts wrote included. The kill points come from a seeded draw
  named in every failure (JAXDL_KILL_SEED=SEED replays them)."""
  experiment, overrides, steps, every, make_data = CASES[case]
  seed = int(os.environ.get("JAXDL_KILL_SEED") or np.random.SeedSequence().entropy % 2**32)
  kills = _kill_points(np.random.default_rng(seed), steps, every)
  where = f"{case}, JAXDL_KILL_SEED={seed}, kills {[k for k, _ in kills]}"
  env = {**_env(), "JAXDL_CACHE": str(tmp_path / "cache")}  # prepared data shared by the runs
  if make_data is not None:
    data = make_data(tmp_path)
    experiment = experiment.format(data=data)
    overrides = [a.format(data=data) for a in overrides]
  common = [*overrides, "--set", f"train.steps={steps}", "--set", f"train.ckpt_every={every}"]
  full, chained = tmp_path / "full", tmp_path / "chained"
  for i, (kill, _) in enumerate(kills):
    proc = warm_python.run([sys.executable, "-c", KILLER, kill, str(full) if i == 0 else "",
                            str(chained), "train", experiment, *common, "--no-progress"],
                           env=env, cwd=ROOT, timeout=240)
    assert proc.returncode == -signal.SIGKILL, f"{where}: {kill}\n{proc.stderr[-2000:]}"
  resumed = _jaxdl("--workdir", str(chained), *common, experiment=experiment, env=env)
  # The summary is the CLI's last output (the GPTs print a decoded sample before it).
  summary = json.loads(resumed.stdout[resumed.stdout.rindex('{\n  "workdir"'):])
  assert summary["start_step"] == kills[-1][1], where
  events = [r for r in read_records(chained / "metrics.jsonl") if r.get("event") == "resume"]
  # A resume from step 0 is a fresh start: it restores nothing and writes no event.
  assert [e["step"] for e in events] == [r for _, r in kills if r > 0], where
  _, state_full = load_state(full)
  _, state_chained = load_state(chained)
  assert jax.tree.structure(state_full) == jax.tree.structure(state_chained), where
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(state_full),
                          jax.tree.leaves(state_chained)):
    np.testing.assert_array_equal(a, b, err_msg=f"{where}: {jax.tree_util.keystr(path)}")
  expected = {(r["split"], r["step"]): r for r in _records(full)}
  seen = _records(chained)
  assert {(r["split"], r["step"]) for r in seen} == set(expected), where
  for r in seen:
    same = expected[r["split"], r["step"]]
    assert r == same, f"{where}: {r} != {same}"


def test_sigterm_saves_current_step_and_exits_0(tmp_path):
  workdir = tmp_path / "pre"
  proc = warm_python.Popen([sys.executable, "-m", "jaxdl", "train", "moons_mlp", "--workdir",
                            str(workdir), *OVERRIDES, "--set", "train.steps=100000",
                            "--set", "train.ckpt_every=0", "--no-progress"], env=_env(), cwd=ROOT)
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
