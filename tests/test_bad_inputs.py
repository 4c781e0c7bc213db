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
