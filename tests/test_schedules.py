"""jaxdl.optim.schedules: values against the formulas, WSD extension, config errors."""

import dataclasses
import math

import ml_collections
import numpy as np
import optax
import pytest

from jaxdl.optim import (default_optim_config, extension_check, extension_problem,
                         first_changed_step, linear_scaled_lr, make_optimizer, make_schedule,
                         resolve_warmup, schedules, sqrt_scaled_lr)
from jaxdl import schema

ETA = 0.1
T = 1000


def _cfg(name, **sched):
  c = default_optim_config()
  c.lr = ETA
  c.schedule.name = name
  c.schedule.warmup_frac = 0.0
  for k, v in sched.items():
    c.schedule[k] = v
  return c


def _lr(cfg, t, total=T):
  return float(make_schedule(cfg, total)(t))


def test_constant():
  assert [_lr(_cfg("constant"), t) for t in (0, 500, T - 1)] == pytest.approx([ETA] * 3)


def test_step_decay():
  cfg = _cfg("step", step_every_frac=0.3, gamma=0.5)
  for t in (0, 299, 300, 599, 600, 900, T - 1):
    assert _lr(cfg, t) == pytest.approx(ETA * 0.5**math.floor(t / 300)), t


def test_cosine():
  cfg = _cfg("cosine")
  for t in (0, 250, 500, 999):
    assert _lr(cfg, t) == pytest.approx(ETA / 2 * (1 + math.cos(math.pi * t / T)), abs=1e-7), t


def test_warmup_cosine_to_final_fraction():
  w, f = 100, 0.1
  cfg = _cfg("warmup_cosine", warmup_frac=0.1, final_frac=f)

  def ref(t):
    if t < w:
      return ETA * t / w
    u = (t - w) / (T - w)
    return f * ETA + (ETA - f * ETA) * (1 + math.cos(math.pi * u)) / 2

  for t in (0, 50, w, 400, T - 1, T):
    assert _lr(cfg, t) == pytest.approx(ref(t), abs=1e-7), t
  assert _lr(cfg, 0) == 0.0 and _lr(cfg, w) == pytest.approx(ETA)


@pytest.mark.parametrize("shape", ["linear", "cosine", "1-sqrt"])
def test_wsd_phases(shape):
  w, d, f = 50, 200, 0.1  # decay_frac 0.2 of 1000
  cfg = _cfg("wsd", warmup_steps=w, decay_frac=0.2, final_frac=f, decay_shape=shape)
  end = f * ETA
  decay = {"linear": lambda u: ETA - (ETA - end) * u,
           "cosine": lambda u: end + (ETA - end) * (1 + math.cos(math.pi * u)) / 2,
           "1-sqrt": lambda u: end + (ETA - end) * (1 - math.sqrt(u))}[shape]
  assert _lr(cfg, 0) == 0.0                                   # start of warmup
  assert _lr(cfg, 25) == pytest.approx(ETA * 25 / w)          # inside warmup
  assert _lr(cfg, w) == pytest.approx(ETA)                    # end of warmup
  assert _lr(cfg, 500) == pytest.approx(ETA)                  # stable phase
  assert _lr(cfg, T - d) == pytest.approx(ETA)                # decay start
  for t in (T - d + 50, T - d + 150, T - 1):                  # inside the decay, last step
    assert _lr(cfg, t) == pytest.approx(decay((t - (T - d)) / d), abs=1e-6), (shape, t)
  assert _lr(cfg, T) == pytest.approx(end, abs=1e-7)          # the decay lands on f eta0


def _full(optim_cfg, steps):
  c = ml_collections.ConfigDict()
  c.optim = optim_cfg
  c.train = ml_collections.ConfigDict({"steps": steps})
  return c


def test_wsd_extension_replays_every_lr_taken():
  old = _full(_cfg("wsd", warmup_steps=50, decay_frac=0.2), T)
  new = _full(_cfg("wsd", warmup_steps=50, decay_frac=0.2), int(1.5 * T))
  restored = 700  # stable phase of the old run (decay starts at 800)
  assert extension_check(old, new, restored)
  s_old, s_new = make_schedule(old.optim, T), make_schedule(new.optim, int(1.5 * T))
  t = np.arange(restored)
  np.testing.assert_array_equal(np.asarray(s_old(t)), np.asarray(s_new(t)))
  # the extended run stays at the peak until its own decay (1500 - 300)
  assert float(s_new(1199)) == pytest.approx(ETA) and float(s_new(1300)) < ETA
  # restored inside the old decay: those lrs are not replayed
  assert not extension_check(old, new, 900)
  assert first_changed_step(old, new, 900) == 801  # lr(800) is still the peak (u = 0)
  assert extension_check(old, new, 801)


def test_cosine_extension_is_refused():
  old, new = _full(_cfg("cosine"), T), _full(_cfg("cosine"), int(1.5 * T))
  assert not extension_check(old, new, 700)
  assert first_changed_step(old, new, 700) == 1  # every lr after t = 0 depends on T


def test_extension_problem_message_and_plain_dict_configs():
  old, new = _full(_cfg("cosine"), T), _full(_cfg("cosine"), int(1.5 * T))
  msg = extension_problem(old.to_dict(), new.to_dict(), 700)  # configs as saved in a workdir
  assert msg.startswith("train.steps: ") and "first at step 1" in msg and "cosine" in msg
  wsd_old = _full(_cfg("wsd", warmup_steps=50), T).to_dict()
  wsd_new = _full(_cfg("wsd", warmup_steps=50), 2 * T).to_dict()
  assert extension_problem(wsd_old, wsd_new, 700) is None


def test_wsd_warmup_fraction_moves_with_total():
  old = _full(_cfg("wsd", warmup_frac=0.05), T)
  new = _full(_cfg("wsd", warmup_frac=0.05), 2 * T)
  assert not extension_check(old, new, 500)  # give warmup_steps for an extendable run


def test_make_optimizer_returns_the_schedule_it_uses():
  c = _cfg("wsd", warmup_steps=10)
  c.name, c.clip_norm, c.weight_decay = "sgd", None, 0.0
  _, sched = make_optimizer(c, 100)
  assert float(sched(5)) == pytest.approx(ETA / 2) and float(sched(99)) < ETA


@pytest.mark.parametrize("name,sched,total,pattern", [
    ("nope", {}, T, r"^optim\.schedule\.name: unknown schedule 'nope'; expected one of "
                    r"constant, step, cosine, warmup_cosine, wsd$"),
    ("warmup_cosine", {"warmup_steps": 200}, 100,
     r"^optim\.schedule\.warmup_steps: warmup of 200 steps is not shorter than the run \(100"),
    ("warmup_cosine", {"warmup_steps": 100}, 100, r"^optim\.schedule\.warmup_steps: .*shorter"),
    ("warmup_cosine", {"warmup_frac": 1.5}, 100, r"^optim\.schedule\.warmup_frac: "),
    ("wsd", {"decay_frac": 0.0}, T, r"^optim\.schedule\.decay_frac: must be in \(0, 1\]"),
    ("wsd", {"decay_frac": 1.2}, T, r"^optim\.schedule\.decay_frac: "),
    ("wsd", {"decay_frac": 0.9, "warmup_steps": 200}, T, r"^optim\.schedule\.decay_frac: "),
    ("wsd", {"decay_shape": "exp"}, T, r"^optim\.schedule\.decay_shape: .*'1-sqrt'"),
    ("step", {"gamma": 0.0}, T, r"^optim\.schedule\.gamma: "),
])
def test_bad_schedule_config_names_the_key(name, sched, total, pattern):
  with pytest.raises(ValueError, match=pattern):
    make_optimizer(_cfg(name, **sched), total)


def test_scaling_rules():
  assert linear_scaled_lr(0.1, 256, 1024) == pytest.approx(0.4)
  assert sqrt_scaled_lr(1e-3, 256, 1024) == pytest.approx(2e-3)


# --- one schema per schedule: own keys, defaults in the class, keys it lacks refused ------------

@pytest.mark.parametrize("name,key,value,pattern", [
    ("cosine", "final_frac", 0.1, r"^optim\.schedule\.final_frac: schedule 'cosine' has no final "
                                  r"frac \(got 0\.1\); use one that has it \('warmup_cosine', "
                                  r"'wsd'\), or leave it unset$"),
    ("wsd", "gamma", 0.5, r"^optim\.schedule\.gamma: schedule 'wsd' has no gamma .*\('step'\)"),
    ("constant", "decay_shape", "cosine", r"^optim\.schedule\.decay_shape: schedule 'constant' "),
    ("wsd", "warmup_steps", 2.5, r"^optim\.schedule\.warmup_steps: expected int, got 2\.5$"),
    ("wsd", "warmp_steps", 5, r"^optim\.schedule\.warmp_steps: unknown key for schedule 'wsd'; "
                              r"expected one of decay_frac, .*warmup_steps$"),
])
def test_a_key_the_schedule_does_not_use_is_refused(name, key, value, pattern):
  c = _cfg(name).to_dict()
  c["schedule"][key] = value
  with pytest.raises(ValueError, match=pattern):
    make_optimizer(c, T)


def test_a_schedule_built_directly_checks_its_ranges():
  with pytest.raises(ValueError, match=r"^optim\.schedule\.decay_shape: expected one of "
                                       r"'linear', 'cosine', '1-sqrt', got 'exp'$"):
    schedules.Wsd(decay_shape="exp")
  wsd = schedules.Wsd(warmup_steps=50)
  assert wsd.warmup(T) == 50 and schedules.Cosine().warmup(T) == 50  # 5% of T by default
  assert float(wsd.build(ETA, T)(500)) == pytest.approx(ETA)


def test_extension_reads_old_records_that_hold_every_key():
  """A config.json written before keys were refused holds every default (cosine with a
  final_frac, adam with weight_decay 0.01): extension checks read it, the optimizer refuses it."""
  old = _full(_cfg("cosine"), T).to_dict()
  old["optim"].update(name="adam", weight_decay=0.01, momentum=0.9)
  old["optim"]["schedule"].update(final_frac=0.1, decay_frac=0.2, gamma=0.5)
  new = _full(_cfg("cosine"), 2 * T).to_dict()
  assert "first at step 1" in extension_problem(old, new, 700)
  assert first_changed_step(old, old, 700) is None
  assert resolve_warmup(old["optim"]["schedule"], T) == 0
  with pytest.raises(ValueError, match=r"^optim\.(weight_decay|momentum): optimizer 'adam' has"):
    make_optimizer(old["optim"], T)


@pytest.fixture
def linear_decay():
  """A new schedule is one registered class: eta0 (1 - t / T) after the warmup."""

  @schedules.register_schedule("linear_decay")
  @dataclasses.dataclass(frozen=True)
  class LinearDecay(schedules.Schedule):
    end_frac: float = schema.setting(0.0, schema.FRACTION)

    def make(self, peak, total_steps, warmup):
      main = optax.linear_schedule(peak, self.end_frac * peak, total_steps - warmup)
      return schedules.with_warmup(peak, warmup, main)

  yield LinearDecay
  del schedules.SCHEDULES["linear_decay"]


def test_a_registered_schedule_gets_its_keys_and_follows_its_formula(linear_decay):
  c = _cfg("linear_decay")
  assert c.schedule.end_frac is None  # its key joins the config, unset
  c.schedule.end_frac, c.schedule.warmup_steps = 0.5, 100
  for t in (0, 50, 100, 550, T):
    ref = ETA * t / 100 if t < 100 else ETA * (1 - 0.5 * (t - 100) / (T - 100))
    assert _lr(c, t) == pytest.approx(ref, abs=1e-7), t
  with pytest.raises(ValueError, match=r"^optim\.schedule\.end_frac: schedule 'wsd' has no"):
    make_schedule(dict(c.to_dict(), schedule=dict(c.schedule.to_dict(), name="wsd")), T)
