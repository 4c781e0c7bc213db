"""Every experiment loads (default and smoke) and documents its command and expected result;
the default experiment trains end to end through the CLI."""

import ast

import pytest

from jaxdl import cli
from jaxdl.config import list_experiments, load_config, resolve_experiment

NAMES = [name for name, _ in list_experiments()]


def test_there_are_experiments_and_a_default():
  assert cli.train.DEFAULT_EXPERIMENT in NAMES and len(NAMES) >= 10


@pytest.mark.parametrize("name", NAMES)
def test_experiment_loads_and_documents_itself(name):
  path, _ = resolve_experiment(name)
  doc = ast.get_docstring(ast.parse(path.read_text()))
  assert doc and len(doc.splitlines()[0]) > 10, f"{name}: needs a one-line description"
  assert "jaxdl train" in doc, f"{name}: docstring must give the run command"
  assert "xpected" in doc, f"{name}: docstring must state the expected result"
  config, _ = load_config(name)
  smoke, _ = load_config(f"{name}:smoke")
  assert config.name == name
  if "train" in smoke and "train" in config:
    assert smoke.train.steps <= config.train.steps


@pytest.mark.parametrize("name", NAMES)
def test_model_section_has_every_field_of_its_model_class(name):
  """Written by `jaxdl.models.model_config`, so any field of the model can be `--set`."""
  import jaxdl.course.planted  # noqa: F401  registers planted_mlp, the bug experiments' model
  from jaxdl.models import model_config
  config, _ = load_config(f"{name}:smoke")
  if "model" not in config:
    pytest.skip(f"{name} has no model section")
  missing = sorted(set(model_config(config.model.name)) - set(config.model))
  assert not missing, f"{name}: model section lacks {missing}"


def test_any_model_field_can_be_set_and_trains(tmp_path):
  """`jaxdl train moons_mlp --set model.init_name=he --set train.steps=5` (refused as an unknown
  key before the model sections were written from the model's fields)."""
  from jaxdl.train import run
  config, _ = load_config("moons_mlp", ["model.init_name=he", "train.steps=5",
                                        "train.plot=False"])
  summary = run(config, str(tmp_path), progress=False)
  assert summary["step"] == 5 and config.model.init_name == "he"


def test_no_experiment_runs_its_own_loop_but_the_optimizer_toys():
  toys = {"adamw_vs_l2", "sgd_vs_momentum", "schedules"}
  own_loop = {name for name in NAMES if hasattr(load_config(name)[1], "run")}
  assert own_loop <= toys, own_loop - toys


def test_no_experiment_imports_another_or_a_helper_beside_it():
  """Shared setup lives in the library (jaxdl.course); an experiment imports jaxdl, never a file
  of experiments/ (another experiment or an `_name.py` helper)."""
  folder = resolve_experiment(NAMES[0])[0].parent
  local = {p.stem for p in folder.glob("*.py")}
  for name in NAMES:
    tree = ast.parse((folder / f"{name}.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & local, f"{name} imports {sorted(imported & local)} from experiments/"
