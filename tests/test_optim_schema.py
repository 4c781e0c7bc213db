"""The optim schemas: keys a rule or schedule lacks are refused, defaults live in the classes,
and a new rule is one registered class (split from test_optim.py, whose helpers it uses)."""

import dataclasses

import jax
import numpy as np
import optax
import pytest

from jaxdl import schema
from jaxdl.optim import (OPTIMIZERS, OptimConfig, default_optim_config,
                         make_optimizer, parse_optim, rules)

from test_optim import LR, _assert_close, _cfg, _run_optax, _run_ref


# --- one schema per section: keys a rule does not have are refused, defaults live in the class --

def test_adam_refuses_weight_decay_instead_of_ignoring_it():
  """Before the schemas, name='adam' silently dropped weight_decay (default 0.01)."""
  c = default_optim_config()
  c.name, c.weight_decay = "adam", 0.01
  with pytest.raises(ValueError, match=r"^optim\.weight_decay: optimizer 'adam' has no weight "
                                       r"decay \(got 0\.01\); use 'adamw' \(decoupled\) or "
                                       r"'adam_l2', or leave it unset$"):
    make_optimizer(c, 10)


def test_zero_weight_decay_means_no_decay_for_every_rule():
  """weight_decay=0 is what adam does, so it is accepted: configs can say 'no decay' for any
  rule; the same config with adam_l2 gives the same trajectory (its L2 term is dropped at 0)."""
  _assert_close(_run_optax(_cfg("adam", weight_decay=0.0)),
                jax.tree.map(np.asarray, _run_optax(_cfg("adam_l2", weight_decay=0.0))))


@pytest.mark.parametrize("name,key,value,pattern", [
    ("sgd", "momentum", 0.9, r"^optim\.momentum: optimizer 'sgd' has no momentum \(got 0\.9\); "
                             r"use one that has it \('momentum', 'nesterov'\), or leave it unset"),
    ("momentum", "b2", 0.99, r"^optim\.b2: optimizer 'momentum' has no b2 "),
    ("adamw", "rho", 0.5, r"^optim\.rho: optimizer 'adamw' has no rho .*\('rmsprop'\)"),
    ("adam", "decay_mask", ["kernel"], r"^optim\.decay_mask: optimizer 'adam' has no weight "
                                       r"decay to mask"),
    ("adam", "decay_embeddings", True, r"^optim\.decay_embeddings: optimizer 'adam' has no "),
    ("adam", "lr", "abc", r"^optim\.lr: expected float, got 'abc'$"),
])
def test_a_key_the_rule_does_not_use_is_refused(name, key, value, pattern):
  c = _cfg(name).to_dict()  # a plain dict: types are checked by the parse, not by ConfigDict
  c[key] = value
  with pytest.raises(ValueError, match=pattern):
    make_optimizer(c, 10)


def test_a_rule_built_directly_checks_its_ranges():
  with pytest.raises(ValueError, match=r"^optim\.b2: must be in \[0, 1\), got 1\.5$"):
    rules.Adam(b2=1.5)
  with pytest.raises(ValueError, match=r"^optim\.weight_decay: must be >= 0, got -1.0$"):
    rules.Sgd(weight_decay=-1.0)
  with pytest.raises(ValueError, match=r"^optim\.clip_norm: must be > 0 or None"):
    OptimConfig(clip_norm=0.0)


def test_defaults_come_from_the_classes_and_unset_keys_take_them():
  """A rule's own keys are None in the ConfigDict; the parse fills the chosen rule's defaults."""
  c = default_optim_config()
  assert c.weight_decay is None and c.b2 is None and c.schedule.final_frac is None
  assert parse_optim(c) == OptimConfig()
  c.name, c.b1 = "muon", 0.8
  optim = parse_optim(c)
  assert optim.optimizer == rules.Muon(b1=0.8)
  assert optim.weight_decay == rules.Muon().weight_decay > 0
  assert parse_optim({"name": "adam"}).weight_decay == 0.0


def test_no_rule_shadows_a_common_key_and_every_key_has_one_type():
  common = set(schema.hints(OptimConfig)) | {"name"}
  for name, cls in OPTIMIZERS.items():
    assert not set(schema.hints(cls)) & common, name
  keys = default_optim_config()
  for key in schema.types_of(OPTIMIZERS):
    assert key in keys and keys.get_type(key) is schema.types_of(OPTIMIZERS)[key]
  with pytest.raises(TypeError, match=r"key 'b2' is str here and float"):
    @rules.register_optimizer("bad_b2")
    @dataclasses.dataclass(frozen=True)
    class BadB2(rules.Optimizer):
      b2: str = "x"
  assert "bad_b2" not in OPTIMIZERS


@pytest.fixture
def lion():
  """A new rule is one registered class: Lion (Chen et al., 2023) through optax.lion."""

  @rules.register_optimizer("lion")
  @dataclasses.dataclass(frozen=True)
  class Lion(rules._Decayed):  # pylint: disable=protected-access
    b1: float = schema.setting(0.9, schema.UNIT)
    b2: float = schema.setting(0.99, schema.UNIT)  # not Adam's 0.999: each rule's own default

    def build(self, schedule, mask_fn):
      return optax.lion(schedule, b1=self.b1, b2=self.b2, weight_decay=self.weight_decay,
                        mask=mask_fn)

  yield Lion
  del OPTIMIZERS["lion"]


def test_a_registered_rule_gets_its_keys_and_follows_its_formula(lion):
  """t = 1 from m = 0: theta -= eta (sign((1 - b1) g) + lambda theta) on decayed leaves."""
  lam = 0.5
  assert parse_optim({"name": "lion"}).optimizer == lion()  # unset keys: Lion's defaults
  cfg = _cfg("lion", weight_decay=lam)

  def step(th, g, s, t, dec):
    return th - LR * (np.sign(g) + (lam * th if dec else 0.0)), s
  _assert_close(_run_optax(cfg, steps=1), _run_ref(step, lambda th: None, steps=1))
  with pytest.raises(ValueError, match=r"^optim\.eps: optimizer 'lion' has no eps"):
    make_optimizer(dict(cfg.to_dict(), eps=1e-6), 10)
