"""Optimizers as optax chains, built by name from a config.

`make_optimizer(optim_cfg, total_steps) -> (tx, schedule)`: `tx` is
`chain(clip_by_global_norm(clip_norm), rule(schedule))` with the weight-decay mask inside the
rule; `schedule(step) -> lr` is the one the rule uses (the loop logs it as `lr`). The train step
measures the global gradient norm before `tx`, so its reported norm is the pre-clip one.

Config keys (`default_optim_config()` holds them all, with these defaults):

  name              'adamw'  sgd | momentum | nesterov | adagrad | rmsprop | adam | adam_l2 |
                             adamw | muon (update forms in `jaxdl.optim.rules`)
  lr                1e-3     peak learning rate eta0 (>= 0)
  momentum          0.9      mu for momentum / nesterov
  b1, b2            0.9, 0.999  Adam moment decays
  eps               1e-8     denominator epsilon of adam*, adagrad, rmsprop
  rho               0.9      RMSProp decay of the squared-gradient average
  muon_beta         0.95     Muon momentum
  weight_decay      0.01     lambda (>= 0); coupled L2 for sgd..rmsprop and adam_l2, decoupled for
                             adamw and muon; only on masked parameters
  decay_embeddings  False    also decay 'embedding' tables under the default mask
  decay_mask        None     list of path regexes replacing the default mask (which decays
                             kernels, plus embeddings when decay_embeddings)
  clip_norm         1.0      global-norm clipping g * min(1, c / ||g||_2); None disables
  ema_decay         None     d in [0, 1): also keep ema <- d ema + (1 - d) params in the optimizer
                             state (`jaxdl.optim.ema`; samplers of generative runs use it)
  schedule.name     'warmup_cosine'  constant | step | cosine | warmup_cosine | wsd
  schedule.warmup_steps  None  warmup W in steps (wins over warmup_frac; use it for runs that
                               may be extended, since a fraction moves with train.steps)
  schedule.warmup_frac   0.05  W = round(warmup_frac * T) when warmup_steps is None
  schedule.final_frac    0.1   final lr / peak for warmup_cosine and wsd
  schedule.decay_frac    0.2   wsd: fraction of the steps spent decaying, in (0, 1]
  schedule.decay_shape   'linear'  wsd decay: linear | cosine | 1-sqrt
  schedule.step_every_frac, schedule.gamma  0.3, 0.5   step decay: eta0 gamma^floor(t / (f T))

Errors name the key: `optim.name: unknown optimizer 'x'; expected one of [...]`,
`optim.schedule.warmup_steps: warmup of 500 steps is not shorter than the run (100 steps)`.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict
import optax

from jaxdl.optim.ema import ema_params, find_ema
from jaxdl.optim.masks import decay_mask, decay_table
from jaxdl.optim.rules import RULES, build_rule
from jaxdl.optim.schedules import (SCHEDULES, extension_check, extension_problem,
                                   first_changed_step, linear_scaled_lr, make_schedule,
                                   sqrt_scaled_lr)


def default_optim_config() -> ml_collections.ConfigDict:
  """Every `optim.*` key with its default; experiments copy and override it."""
  c = ml_collections.ConfigDict()
  c.name = "adamw"
  c.lr = 1e-3
  c.momentum = 0.9
  c.b1 = 0.9
  c.b2 = 0.999
  c.eps = 1e-8
  c.rho = 0.9
  c.muon_beta = 0.95
  c.weight_decay = 0.01
  c.decay_embeddings = False
  c.decay_mask = config_dict.placeholder(list)
  c.clip_norm = config_dict.placeholder(float)
  c.clip_norm = 1.0
  c.ema_decay = config_dict.placeholder(float)
  c.schedule = ml_collections.ConfigDict()
  c.schedule.name = "warmup_cosine"
  c.schedule.warmup_steps = config_dict.placeholder(int)
  c.schedule.warmup_frac = 0.05
  c.schedule.final_frac = 0.1
  c.schedule.decay_frac = 0.2
  c.schedule.decay_shape = "linear"
  c.schedule.step_every_frac = 0.3
  c.schedule.gamma = 0.5
  return c


def validate(optim_cfg) -> None:
  """Raises ValueError naming the offending `optim.*` key (schedule keys checked separately)."""
  if optim_cfg.name not in RULES:
    raise ValueError(f"optim.name: unknown optimizer {optim_cfg.name!r}; "
                     f"expected one of {list(RULES)}")
  for key in ("lr", "weight_decay", "eps"):
    v = optim_cfg.get(key, 0.0)
    if v is None or v < 0:
      raise ValueError(f"optim.{key}: must be a number >= 0, got {v}")
  for key in ("momentum", "b1", "b2", "rho", "muon_beta"):
    v = optim_cfg.get(key, 0.5)
    if v is None or not 0.0 <= v < 1.0:
      raise ValueError(f"optim.{key}: must be in [0, 1), got {v}")
  ema = optim_cfg.get("ema_decay")
  if ema is not None and not 0.0 <= ema < 1.0:
    raise ValueError(f"optim.ema_decay: must be in [0, 1) or None (no average), got {ema}")
  clip = optim_cfg.get("clip_norm")
  if clip is not None and clip <= 0:
    raise ValueError(f"optim.clip_norm: must be > 0 or None (no clipping), got {clip}")


def _check_keys(given: dict, known, prefix: str) -> None:
  """Unknown keys (typos) are errors, not silently ignored settings."""
  for k, v in given.items():
    if k not in known:
      raise ValueError(f"{prefix}.{k}: unknown key; expected one of {sorted(known.keys())}")
    if isinstance(v, dict) and isinstance(known[k], ml_collections.ConfigDict):
      _check_keys(v, known[k], f"{prefix}.{k}")


def make_optimizer(optim_cfg, total_steps: int):
  """Returns `(tx, schedule)` for `optim_cfg`; `schedule(step) -> lr`.

  Args:
    optim_cfg: the `optim` ConfigDict (keys in the module docstring; missing keys take the
      defaults of `default_optim_config()`).
    total_steps: T, the number of updates of the run (`train.steps`); schedules are built on it.
  """
  cfg = default_optim_config()
  given = optim_cfg.to_dict() if hasattr(optim_cfg, "to_dict") else dict(optim_cfg)
  _check_keys(given, cfg, "optim")
  cfg.update(given)
  validate(cfg)
  schedule = make_schedule(cfg, int(total_steps))
  parts = []
  if cfg.clip_norm is not None:
    parts.append(optax.clip_by_global_norm(cfg.clip_norm))
  parts.append(build_rule(cfg, schedule, decay_mask(cfg)))
  if cfg.ema_decay is not None:
    parts.append(ema_params(cfg.ema_decay))  # last: it averages the parameters after the update
  return optax.chain(*parts), schedule


__all__ = ["make_optimizer", "default_optim_config", "validate", "decay_mask", "decay_table",
           "ema_params", "find_ema",
           "make_schedule", "extension_check", "extension_problem", "first_changed_step",
           "linear_scaled_lr",
           "sqrt_scaled_lr", "RULES", "SCHEDULES"]
