"""Which config changes a resumed workdir accepts (`jaxdl.train.resume`), without training."""

import json

import pytest

from jaxdl.config import load_config
from jaxdl.train.resume import WorkdirMismatchError, check_same_run


def _json(name="moons_mlp", overrides=()):
  config, _ = load_config(name, list(overrides))
  return json.loads(config.to_json_best_effort())


def test_cadences_and_length_may_change():
  check_same_run("W", _json(), _json(overrides=["train.steps=400", "train.eval_every=7"]), False)


def test_a_different_setting_is_refused_unless_forced():
  with pytest.raises(WorkdirMismatchError, match=r"optim.lr: 0.01 -> 0.02"):
    check_same_run("W", _json(), _json(overrides=["optim.lr=0.02"]), False)
  check_same_run("W", _json(), _json(overrides=["optim.lr=0.02"]), True)


def test_a_record_with_the_defaults_written_out_is_the_same_run():
  """Runs recorded before the optimizer defaults moved into their classes wrote every default
  (b1 0.9, eps 1e-8, ...); today's config leaves them unset (None). Same optimizer: accepted."""
  old = _json("char_gpt")
  old["optim"].update(b1=0.9, b2=0.999, eps=1e-8, weight_decay=old["optim"]["weight_decay"] or
                      0.01, momentum=0.9, rho=0.9, muon_beta=0.95)
  new = _json("char_gpt")
  assert old["optim"] != new["optim"]  # different as written ...
  check_same_run("W", old, new, False)  # ... same as built
  old["optim"]["b2"] = 0.95
  with pytest.raises(WorkdirMismatchError, match="optim.b2: 0.95 -> 0.999"):
    check_same_run("W", old, new, False)
