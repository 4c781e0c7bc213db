"""Every experiment runs in the suite at least as `:smoke`. Most have a test of their own (grep
tests/ for the name); the ones that do not are trained here through the CLI, exactly as a user
runs them, `after_training` included, and `test_every_experiment_has_a_smoke_run` keeps the list
complete."""

import json
import pathlib
import re

import pytest

from jaxdl import cli
from jaxdl.config import list_experiments

TESTS = pathlib.Path(__file__).resolve().parent
# Experiments whose smoke run no other test makes. Two steps each: the point is that the whole
# command (config, engine, after_training) runs; each experiment's own numbers are its docstring's.
HERE = ("digits_lstm", "digits_mlp", "digits_vit", "graph_classify")
# Experiments whose smoke run is a README command (tests/test_readme.py runs every `jaxdl train`
# of the README at smoke size, `after_training` included).
VIA_README = ("edm_digits",)


def test_every_experiment_has_a_smoke_run():
  others = "".join(p.read_text() for p in TESTS.glob("test_*.py")
                   if p.name != pathlib.Path(__file__).name)
  for name, _ in list_experiments():
    if name in HERE or name in VIA_README:
      continue
    assert re.search(rf"[\"']{name}(:[a-z0-9_,=]*)?[\"']", others), (
        f"{name}: no test runs it; add it to HERE")


def test_the_readme_trains_the_experiments_left_to_it():
  from test_readme import readme_commands
  trained = {c.split()[2].split(":")[0] for c in readme_commands()
             if c.startswith("jaxdl train ") and len(c.split()) > 2}
  assert set(VIA_README) <= trained, set(VIA_README) - trained


@pytest.mark.slow
@pytest.mark.parametrize("name", HERE)
def test_smoke_run_trains_and_finishes(name, tmp_path, capsys):
  workdir = tmp_path / name
  argv = ["train", f"{name}:smoke", "--workdir", str(workdir), "--no-progress",
          "--set", "train.steps=2", "--set", "train.eval_every=2", "--set", "train.ckpt_every=2",
          "--set", "train.plot=False"]
  assert cli.main(argv) == 0
  out = capsys.readouterr().out
  summary = json.loads(out[out.rindex('{\n  "workdir"'):])
  assert summary["step"] == 2 and (workdir / "summary.json").exists()
