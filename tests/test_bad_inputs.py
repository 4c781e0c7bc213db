"""Every bad input is one line on stderr naming the key or path, exit code 2, workdir untouched.

One table (issue 13, item 6): each case is the argv of an in-process `jaxdl.cli.main`, the text
the single stderr line must contain, and the workdir whose bytes must not change (a fresh path
must still not exist; the module's tiny finished moons run must hash the same before and after).
"""

import hashlib
import pathlib
import stat

import numpy as np
import pytest

from jaxdl import cli

SMOKE = ["moons_mlp:smoke", "--set", "train.plot=False", "--no-progress"]

# A classification experiment over a user .npz (data.path is set per case).
NPZ_EXPERIMENT = '''"""A tiny npz classifier for the bad-input tests."""
from jaxdl.config import base_config
from jaxdl.data import default_data_config
from jaxdl.optim import default_optim_config


def get_config(arg=None):
  c = base_config()
  c.name = "npz_tiny"
  c.task = "classification"
  c.data = default_data_config("npz")
  c.data.batch_size = 8
  c.model = dict(name="mlp", hidden=(8,), out=3)
  c.optim = default_optim_config()
  c.train.steps = 2
  c.train.plot = False
  return c
'''


def run_cli(argv: list[str]) -> int:
  """`jaxdl.cli.main(argv)` in this process; its log handler writes to whatever stderr is now."""
  return cli.main(argv)


def tree_hash(path: pathlib.Path) -> str | None:
  """A hash of every file's relative path, mode and bytes under `path` (None if absent)."""
  if not path.exists() and not path.is_symlink():
    return None
  h = hashlib.sha256()
  if path.is_file():
    return hashlib.sha256(path.read_bytes()).hexdigest()
  for p in sorted(path.rglob("*")):
    h.update(str(p.relative_to(path)).encode())
    h.update(str(stat.S_IMODE(p.lstat().st_mode)).encode())
    if p.is_file():
      h.update(p.read_bytes())
  h.update(str(stat.S_IMODE(path.stat().st_mode)).encode())
  return h.hexdigest()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """A finished tiny moons run, broken experiment files and npz files, made once."""
  root = tmp_path_factory.mktemp("bad_inputs")
  run = root / "moons_run"
  assert run_cli(["train", *SMOKE, "--workdir", str(run)]) == 0
  (root / "syntax_error.py").write_text("def get_config(arg=None):\n  return (\n")
  (root / "raises.py").write_text("def get_config(arg=None):\n  raise RuntimeError('boom')\n")
  (root / "npz_tiny.py").write_text(NPZ_EXPERIMENT)
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(40, 2)).astype(np.float32), rng.integers(0, 3, 40)
  np.savez(root / "good.npz", x=x, y=y)
  data = (root / "good.npz").read_bytes()
  (root / "truncated.npz").write_bytes(data[:len(data) // 2])
  np.savez(root / "negative.npz", x=x, y=np.where(y == 2, -1, y))
  (root / "a_file").write_text("not a directory\n")
  texts = root / "texts"
  texts.mkdir()
  for i in range(4):
    (texts / f"doc{i}.txt").write_text(f"document {i}: the quick brown fox\n" * 3)
  readonly = root / "readonly"
  readonly.mkdir()
  readonly.chmod(0o555)
  yield root
  readonly.chmod(0o755)


def _npz(name):
  return lambda r: ["train", str(r / "npz_tiny.py"), "--set", f"data.path={r / name}",
                    "--workdir", "{W}"]


# id: (argv from the fixture root, text the stderr line contains, workdir: 'fresh' | a subpath)
CASES = {
    "syntax_error": (lambda r: ["train", str(r / "syntax_error.py"), "--workdir", "{W}"],
                     "syntax_error.py", "fresh"),
    "get_config_raises": (lambda r: ["train", str(r / "raises.py"), "--workdir", "{W}"],
                          "raises", "fresh"),
    "best_metric_missing": (lambda r: ["train", *SMOKE, "--set", "train.best_metric=eval/nope",
                                       "--workdir", "{W}"], "train.best_metric", "moons_run"),
    "hidden_negative": (lambda r: ["train", *SMOKE, "--set", "model.hidden=(64,-1)",
                                   "--workdir", "{W}"], "model.hidden", "fresh"),
    "dropout_above_one": (lambda r: ["train", *SMOKE, "--set", "model.dropout=1.5",
                                     "--workdir", "{W}"], "model.dropout", "fresh"),
    "label_smoothing_two": (lambda r: ["train", *SMOKE, "--set", "train.label_smoothing=2.0",
                                       "--workdir", "{W}"], "train.label_smoothing", "fresh"),
    "lr_infinite": (lambda r: ["train", *SMOKE, "--set", "optim.lr=1e400", "--workdir", "{W}"],
                    "optim.lr", "moons_run"),
    "workdir_is_file": (lambda r: ["train", *SMOKE, "--workdir", str(r / "a_file")],
                        "a_file", "a_file"),
    "workdir_read_only": (lambda r: ["train", *SMOKE, "--workdir", str(r / "readonly" / "run")],
                          "readonly", "readonly"),
    "workdir_name_too_long": (lambda r: ["train", *SMOKE, "--workdir", str(r / ("x" * 300))],
                              "x" * 300, "fresh"),
    "truncated_npz": (_npz("truncated.npz"), "truncated.npz", "fresh"),
    "negative_labels": (_npz("negative.npz"), "negative.npz", "fresh"),
    "distributed_no_coordinator": (lambda r: ["train", *SMOKE, "--distributed",
                                              "--workdir", "{W}"], "--coordinator", "fresh"),
    "process_id_out_of_range": (lambda r: ["train", *SMOKE, "--distributed", "--coordinator",
                                           "127.0.0.1:1", "--num-processes", "2",
                                           "--process-id", "2", "--workdir", "{W}"],
                                "--process-id", "fresh"),
    "sample_classification_run": (lambda r: ["sample", str(r / "moons_run"), "--out",
                                             str(r / "moons_run" / "s.png")],
                                  "moons_run", "moons_run"),
    "sample_num_zero": (lambda r: ["sample", str(r / "moons_run"), "--num", "0"], "--num",
                        "moons_run"),
    "sample_out_missing_folder": (lambda r: ["sample", str(r / "moons_run"), "--out",
                                             str(r / "missing" / "s.png")], "missing",
                                  "moons_run"),
    "likelihood_classification_run": (lambda r: ["likelihood", str(r / "moons_run")],
                                      "moons_run", "moons_run"),
    "likelihood_steps_zero": (lambda r: ["likelihood", str(r / "moons_run"), "--steps", "0"],
                              "--steps", "moons_run"),
    "locate_missing_workdir": (lambda r: ["doctor", "moons_mlp:smoke", "--workdir", "{W}",
                                          "--locate", "5"], "{W}", "fresh"),
    # Output paths and sizes are checked before any work (issue 26, items 1d-e).
    "data_out_under_a_file": (lambda r: ["data", "prepare", str(r / "texts"), "--out",
                                         str(r / "a_file" / "prep")], "a_file", "a_file"),
    "data_out_read_only": (lambda r: ["data", "tokenizer", str(r / "texts"), "--out",
                                      str(r / "readonly" / "prep")], "--out", "readonly"),
    "data_vocab_huge": (lambda r: ["data", "tokenizer", str(r / "texts"), "--vocab",
                                   "100000000000", "--out", "{W}"], "--vocab", "fresh"),
    "bench_json_missing_folder": (lambda r: ["bench", "--json", "{W}/x.json"], "{W}", "fresh"),
    "reproduce_json_missing_folder": (lambda r: ["reproduce", "--json", "{W}/x.json"], "{W}",
                                      "fresh"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_exit_2_workdir_untouched(case, files, tmp_path, capsys):
  make_argv, expected, target = CASES[case]
  fresh = tmp_path / "W"
  workdir = fresh if target == "fresh" else files / target
  argv = [a.replace("{W}", str(fresh)) for a in make_argv(files)]
  expected = expected.replace("{W}", str(fresh))
  before = tree_hash(workdir)
  capsys.readouterr()
  assert run_cli(argv) == 2
  err = capsys.readouterr().err
  lines = err.strip().splitlines()
  assert len(lines) == 1, err
  assert lines[0].startswith("jaxdl: error: ") and expected in lines[0], lines[0]
  assert tree_hash(workdir) == before


def test_list_survives_a_broken_experiment(files, monkeypatch, capsys):
  """One unparsable file in JAXDL_EXPERIMENTS is listed with its error; the rest still list."""
  folder = files / "experiments"
  folder.mkdir(exist_ok=True)
  (folder / "good.py").write_text('"""A fine experiment."""\n')
  (folder / "bad.py").write_text("def get_config(:\n")
  monkeypatch.setenv("JAXDL_EXPERIMENTS", str(folder))
  assert run_cli(["list"]) == 0
  out = capsys.readouterr().out
  assert "A fine experiment." in out
  assert "bad" in out and "SyntaxError" in out


def test_unreadable_source_is_named_as_unreadable(files, tmp_path, monkeypatch, capsys):
  """A SRC folder (or a folder under it) that cannot be listed is said to be unreadable, not
  "no documents". The tests run as root, whom file modes do not stop: the listing fails by
  injection (PermissionError, as for an unprivileged user on a chmod 000 folder)."""
  import errno
  import os
  src = files / "texts"
  real_listdir, real_scandir = os.listdir, os.scandir

  def denied(real, path):
    def call(p=".", *a):
      if pathlib.Path(p) == path:
        raise PermissionError(errno.EACCES, "Permission denied", str(p))
      return real(p, *a)
    return call
  monkeypatch.setattr(os, "listdir", denied(real_listdir, src))
  assert run_cli(["data", "prepare", str(src), "--out", str(tmp_path / "a")]) == 2
  err = capsys.readouterr().err.strip()
  assert err.count("\n") == 0 and "cannot read" in err and str(src) in err, err
  monkeypatch.setattr(os, "listdir", real_listdir)
  sub = src / "locked"
  sub.mkdir()
  try:
    monkeypatch.setattr(os, "scandir", denied(real_scandir, sub))
    assert run_cli(["data", "prepare", str(src), "--out", str(tmp_path / "b")]) == 2
  finally:
    sub.rmdir()
  err = capsys.readouterr().err.strip()
  assert err.count("\n") == 0 and "cannot read" in err and str(sub) in err, err
  assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


SPLIT = ["--val-frac", "0.6"]  # docs 0 and 2 of the four go to train, 1 and 3 to val


def test_a_second_prepare_into_one_out_is_refused_then_the_lock_is_released(files, tmp_path,
                                                                            capsys):
  """`jaxdl data` locks --out like a workdir: while another live process holds it, a prepare
  there exits 2 naming the holder; once that process is gone its stale lock is taken over."""
  import json
  import socket
  import subprocess
  out = tmp_path / "prep"
  out.mkdir()
  holder = subprocess.Popen(["sleep", "60"])
  try:
    (out / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": holder.pid,
                                           "started": "2026-01-02T03:04:05"}))
    assert run_cli(["data", "prepare", str(files / "texts"), "--out", str(out), *SPLIT]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--out" in err and "is in use by" in err, err
    assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing written
  finally:
    holder.kill()
    holder.wait()
  assert run_cli(["data", "prepare", str(files / "texts"), "--out", str(out), *SPLIT]) == 0
  assert (out / "manifest.json").exists() and not (out / ".lock").exists()
