"""Optimizers as optax chains, built from a parsed config.

`make_optimizer(optim_cfg, total_steps) -> (tx, schedule)`: `tx` is
`chain(clip_by_global_norm(clip_norm), rule(schedule), ema_params(ema_decay))` with the
weight-decay mask inside the rule; `schedule(step) -> lr` is the one the rule uses (the loop
logs it as `lr`). The train step measures the global gradient norm before `tx`, so its reported
norm is the pre-clip one. `parse_optim(optim_cfg) -> OptimConfig` is the one parse of the
section (`jaxdl.optim.configs`); `make_optimizer` is `parse_optim(optim_cfg).build(T)`.

Config keys. Common keys (`default_optim_config()` holds them with these defaults):

  name              'adamw'  sgd | momentum | nesterov | adagrad | rmsprop | adam | adam_l2 |
                             adamw | muon (`OPTIMIZERS`; update forms in `jaxdl.optim.rules`)
  lr                1e-3     peak learning rate eta0 (>= 0)
  clip_norm         1.0      global-norm clipping g * min(1, c / ||g||_2); None disables
  ema_decay         None     d in [0, 1): also keep ema <- d ema + (1 - d) params in the optimizer
                             state (`jaxdl.optim.ema`; samplers of generative runs use it)
  decay_embeddings  False    also decay 'embedding' tables under the default mask
  decay_mask        None     list of path regexes replacing the default mask (which decays
                             kernels, plus embeddings when decay_embeddings)

Each rule's own keys: None in `default_optim_config()` means the rule's default, shown here. A
key the chosen rule does not have must stay None (weight_decay may also be 0), else it is an
error naming it: a rule never ignores a setting.

  weight_decay      0.01     lambda (>= 0): every rule but adam; coupled L2 for sgd..rmsprop and
                             adam_l2, decoupled for adamw and muon; only on masked parameters
  momentum          0.9      mu: momentum, nesterov
  b1, b2            0.9, 0.999  Adam moment decays: adam, adam_l2, adamw, muon (its Adam part)
  eps               1e-8     denominator epsilon: adagrad, rmsprop, adam, adam_l2, adamw, muon
  rho               0.9      RMSProp decay of the squared-gradient average: rmsprop
  muon_beta         0.95     Muon momentum: muon

Schedule keys (`optim.schedule.*`, `jaxdl.optim.schedules`; same rule for a schedule's own keys):

  name              'warmup_cosine'  constant | step | cosine | warmup_cosine | wsd (`SCHEDULES`)
  warmup_steps      None     warmup W in steps (wins over warmup_frac; use it for runs that may
                             be extended, since a fraction moves with train.steps)
  warmup_frac       0.05     W = round(warmup_frac * T) when warmup_steps is None
  final_frac        0.1      final lr / peak: warmup_cosine, wsd
  decay_frac        0.2      wsd: fraction of the steps spent decaying, in (0, 1]
  decay_shape       'linear' wsd decay: linear | cosine | 1-sqrt
  step_every_frac, gamma  0.3, 0.5   step: eta0 gamma^floor(t / (f T))

Errors name the key: `optim.name: unknown optimizer 'x'; expected one of [...]`,
`optim.b2: must be in [0, 1), got 1.5`,
`optim.weight_decay: optimizer 'adam' has no weight decay (got 0.01); use 'adamw' (decoupled)
or 'adam_l2', or leave it unset`,
`optim.schedule.warmup_steps: warmup of 500 steps is not shorter than the run (100 steps)`.

Adding an optimizer or a schedule: one `@register_optimizer(name)` class in `rules.py` or
`@register_schedule(name)` class in `schedules.py` (fields = its keys with defaults, `build`),
plus its test; `default_optim_config()` picks its keys up.
"""

from __future__ import annotations

from jaxdl.optim import configs
from jaxdl.optim.configs import (OptimConfig, decay_mask, decay_table, default_optim_config,
                                 parse_optim, parse_schedule)
from jaxdl.optim.ema import ema_params, find_ema
from jaxdl.optim.extension import extension_check, extension_problem, first_changed_step
from jaxdl.optim.rules import OPTIMIZERS, RULES, Optimizer, register_optimizer
from jaxdl.optim.schedules import (SCHEDULES, Schedule, linear_scaled_lr, register_schedule,
                                   sqrt_scaled_lr)


def make_optimizer(optim_cfg, total_steps: int):
  """Returns `(tx, schedule)` for `optim_cfg`; `schedule(step) -> lr`.

  Args:
    optim_cfg: the `optim` ConfigDict, a plain dict, or a parsed `OptimConfig` (keys in the
      module docstring; missing keys take their defaults).
    total_steps: T, the number of updates of the run (`train.steps`); schedules are built on it.
  """
  return parse_optim(optim_cfg).build(int(total_steps))


def make_schedule(optim_cfg, total_steps: int):
  """The `step -> lr` schedule of `optim_cfg` (its `schedule` section, peak `lr`) over T steps."""
  return parse_optim(optim_cfg).schedule_fn(int(total_steps))


def resolve_warmup(sched_cfg, total_steps: int) -> int:
  """Warmup steps W of an `optim.schedule` section (as saved with a run): `warmup_steps` when
  given, else round(warmup_frac * T)."""
  return parse_schedule(sched_cfg, strict=False).warmup(int(total_steps))


def validate(optim_cfg) -> None:
  """Raises ValueError naming the offending `optim.*` key (the checks of `parse_optim`)."""
  parse_optim(optim_cfg)


__all__ = ["make_optimizer", "make_schedule", "parse_optim", "parse_schedule", "OptimConfig",
           "default_optim_config", "validate", "resolve_warmup", "decay_mask", "decay_table",
           "ema_params", "find_ema", "extension_check", "extension_problem",
           "first_changed_step", "linear_scaled_lr", "sqrt_scaled_lr", "OPTIMIZERS", "RULES",
           "Optimizer", "register_optimizer", "SCHEDULES", "Schedule", "register_schedule",
           "configs"]
