"""`jaxdl sample WORKDIR` (jaxdl.cli.sample, jaxdl.generative.trained): a class-conditional run
draws every class into a labelled grid a person can read; bad inputs are one line, exit 2, nothing
written, refused before the checkpoint is read.

The run is an untrained fm_digits_cfg:smoke checkpoint (parameters drawn on the host, nothing
compiled for the init): the grid's layout, not its quality, is under test.
"""

import hashlib

import jax.numpy as jnp
import matplotlib.figure
import matplotlib.image
import pytest

from jaxdl import cli
from jaxdl.generative import trained


@pytest.fixture(scope="module")
def cfg_run(tmp_path_factory, untrained_run):
  return untrained_run(tmp_path_factory.mktemp("cfg") / "fm", "fm_digits_cfg:smoke",
                       jnp.zeros((1, 8, 8, 1)), jnp.zeros((1,)))


def _tree(path):
  return sorted((str(p.relative_to(path)), hashlib.sha256(p.read_bytes()).hexdigest())
                for p in path.rglob("*") if p.is_file())


def test_a_class_conditional_run_samples_a_labelled_grid_of_every_class(cfg_run, tmp_path,
                                                                        monkeypatch, capsys):
  figures = []
  savefig = matplotlib.figure.Figure.savefig
  monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                      lambda fig, *a, **kw: (figures.append(fig), savefig(fig, *a, **kw))[1])
  out = tmp_path / "grid.png"
  assert cli.main(["sample", str(cfg_run), "--steps", "2", "--num", "3", "--out", str(out)]) == 0
  assert capsys.readouterr().out.strip() == (
      f"wrote 30 samples (3 of each of 10 classes) to {out}")
  assert [p.name for p in tmp_path.iterdir()] == ["grid.png"]  # no temporary file left
  (fig,) = figures
  ax = fig.axes[0]
  assert [t.get_text() for t in ax.get_yticklabels()] == [str(k) for k in range(10)]
  assert ax.get_ylabel() == "class"
  (title,) = [t.get_text().replace("\n", " ") for t in fig.texts]
  assert "heun, 2 steps (4 network calls), guidance w = 2" in title  # the run's w
  # Ten rows of three 8x8 digits, each drawn 48 pixels wide (1-pixel lines between them).
  h, w = matplotlib.image.imread(out).shape[:2]
  assert h >= 10 * 48 and w >= 3 * 48


@pytest.fixture
def refuse_after_config(monkeypatch):
  """Fails the test if the checkpoint is read: each bad input must be refused before."""
  def load_run(*a, **kw):
    raise AssertionError("the checkpoint was read before the bad input was refused")
  monkeypatch.setattr(trained, "load_run", load_run)


@pytest.mark.parametrize("argv,message", [
    (["--guidance", "nan"], "--guidance: must be a finite number, got nan"),
    (["--guidance", "-1"], "--guidance: must be >= 0, got -1.0"),
    (["--steps", "0"], "--steps: must be > 0, got 0"),
    (["--sampler", "rk4"], "--sampler: expected one of"),
    (["--sampler", "dpmpp_3m", "--steps", "2"], "--steps: sampler 'dpmpp_3m' is of order 3"),
    (["--eta", "-0.5"], "--eta: must be >= 0"),
    (["--class", "10"], "--class: must be in 0..9 (the run's classes), got 10"),
    (["--num", "0"], "--num: must be >= 1, got 0"),
    (["--out", "{tmp}"], "is a folder; expected a file name ending in .png"),
    (["--out", "{tmp}/x.foo"], "x.foo: expected a file name ending in .png, .jpg, .pdf, .npy"),
    (["--out", "{tmp}/missing/x.png"], "does not exist"),
])
def test_a_bad_sample_input_is_one_line_exit_2_nothing_written(argv, message, cfg_run, tmp_path,
                                                               refuse_after_config, capsys):
  before = _tree(cfg_run)
  argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
  out = [] if "--out" in argv else ["--out", str(tmp_path / "s.png")]
  assert cli.main(["sample", str(cfg_run), *argv, *out]) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("jaxdl: error: ") and message in lines[0], lines
  assert list(tmp_path.iterdir()) == [] and _tree(cfg_run) == before
