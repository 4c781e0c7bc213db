"""Every experiment loads (default and smoke) and documents its command and expected result;
the default experiment trains end to end through the CLI."""

import ast

import pytest

from jaxdl import cli
from jaxdl.config import list_experiments, load_config, resolve_experiment

NAMES = [name for name, _ in list_experiments()]


def test_there_are_experiments_and_a_default():
  assert cli.DEFAULT_EXPERIMENT in NAMES and len(NAMES) >= 10


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
