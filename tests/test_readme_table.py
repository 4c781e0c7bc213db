"""The README's experiment table against the experiments: every experiment and arg a row names
exists and loads, and every number a row states is written in that experiment's docstring or in
a claim of `jaxdl reproduce` (one number, one place: the README copies it from where it is
measured)."""

import ast
import pathlib
import re

import pytest

from jaxdl.config import experiments_dir, load_config

ROOT = pathlib.Path(__file__).resolve().parent.parent
HEADER = "| experiment | what it shows | expected |"
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e-?\d+)?")


def _rows():
  """(specs, expected text) per row of the table."""
  text = (ROOT / "README.md").read_text()
  assert HEADER in text, "the README lost its experiment table"
  table = text.split(HEADER, 1)[1].split("\n\n", 1)[0]
  rows = []
  for line in table.splitlines():
    if not line.startswith("| `"):
      continue
    cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
    specs = re.findall(r"`([a-z0-9_*]+(?::[a-z0-9_,=]+)?)`", cells[0])
    rows.append((specs, cells[-1]))
  return rows


def _names(spec: str) -> list[str]:
  """The experiment files a spec names (`bug_*` names several)."""
  return sorted(p.stem for p in experiments_dir().glob(spec.split(":")[0] + ".py"))


def _docstring(name: str) -> str:
  path = experiments_dir() / f"{name}.py"
  return ast.get_docstring(ast.parse(path.read_text())) or ""


CLAIMS = "".join(p.read_text() for p in sorted((ROOT / "jaxdl" / "course").glob("claims*.py")))
ROWS = _rows()


def test_the_table_names_every_row_by_its_experiments():
  assert len(ROWS) >= 10
  for specs, _ in ROWS:
    assert specs and all(_names(s) for s in specs), specs


@pytest.mark.parametrize("specs, expected", ROWS, ids=[", ".join(s) for s, _ in ROWS])
def test_each_row_loads_and_states_only_numbers_its_experiments_measured(specs, expected):
  for spec in specs:
    for name in _names(spec):
      load_config(name + (spec[spec.index(":"):] if ":" in spec else ""))
  sources = ("".join(_docstring(n) for s in specs for n in _names(s)) + CLAIMS).replace(",", "")
  missing = [n for n in NUMBER.findall(expected) if n.replace(",", "") not in sources]
  assert not missing, f"{specs}: {missing} not in the experiments' docstrings or the claims"


def test_a_changed_number_is_caught():
  specs, expected = next((s, e) for s, e in ROWS if s == ["char_gpt"])
  sources = "".join(_docstring(n) for n in _names("char_gpt")) + CLAIMS
  changed = expected.replace("2.37", "2.31")
  assert [n for n in NUMBER.findall(changed) if n not in sources] == ["2.31"]
