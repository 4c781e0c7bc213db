"""CONTRIBUTING.md's examples run: each ```python block is executed, and its asserts must hold.

The registries the examples add to are restored afterwards, so no other test sees them.
"""

import pathlib
import re

import pytest

from jaxdl import data, models, optim
from jaxdl.generative import samplers
from jaxdl.train import tasks

GUIDE = pathlib.Path(__file__).resolve().parent.parent / "CONTRIBUTING.md"
BLOCKS = re.findall(r"^### (.+?)\n.*?^```python\n(.*?)^```", GUIDE.read_text(), re.M | re.S)
REGISTRIES = (optim.OPTIMIZERS, optim.SCHEDULES, models.MODELS, data.SOURCES, samplers.SAMPLERS,
              tasks.TASKS)


def test_the_guide_has_an_example_per_extension_point():
  titles = [t for t, _ in BLOCKS]
  for kind in ("optimizer", "schedule", "model", "sampler", "data source", "hook"):
    assert any(kind in t for t in titles), f"CONTRIBUTING.md has no example of a {kind}"


@pytest.fixture
def clean_registries():
  saved = [dict(r) for r in REGISTRIES]
  yield
  for registry, before in zip(REGISTRIES, saved):
    registry.clear()
    registry.update(before)


@pytest.mark.parametrize("title,code", BLOCKS, ids=[t for t, _ in BLOCKS])
def test_example_runs(title, code, clean_registries):
  del title
  exec(compile(code, str(GUIDE), "exec"), {"__name__": "contributing_example"})  # noqa: S102


def test_the_guide_stays_a_guide():
  """CONTRIBUTING.md is a contributor's guide, not a diary: at most 250 lines (measurement
  history belongs in the docstrings of the benches that measure it, and in git)."""
  assert len(GUIDE.read_text().splitlines()) <= 250
