"""The `optim` section, parsed once: `parse_optim(optim_cfg) -> OptimConfig`.

`OptimConfig` holds the keys every rule shares (lr, clip_norm, ema_decay, decay_embeddings,
decay_mask), the rule (`jaxdl.optim.rules`, its own keys and defaults, in the section itself) and
the schedule (`jaxdl.optim.schedules`, in `optim.schedule`), both `schema.subsection`s, so
`schema.parse_section` parses the whole section and `schema.default_section` writes
`default_optim_config()`, the ConfigDict experiments copy and `--set` overrides: common keys
carry their defaults, and each rule's or schedule's own key is a typed placeholder, None meaning
"the chosen class's default". So a key is set only when someone means it, and a rule given a key
it does not have refuses it:
`optim.weight_decay: optimizer 'adam' has no weight decay (got 0.01); use 'adamw' (decoupled)
or 'adam_l2', or leave it unset`.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import ml_collections
import optax

from jaxdl import schema
from jaxdl.optim.ema import ema_params
from jaxdl.optim.masks import mask_of, mask_table, path_predicate
from jaxdl.optim.rules import OPTIMIZERS, AdamW, Optimizer
from jaxdl.optim.schedules import SCHEDULES, Schedule, WarmupCosine
from jaxdl.optim.tree_reductions import clip_by_global_norm

UNIT_OR_NONE = schema.Check(lambda v: 0 <= v < 1, "must be in [0, 1) or None (no average)")
POSITIVE_OR_NONE = schema.Check(lambda v: v > 0, "must be > 0 or None (no clipping)")


@dataclasses.dataclass(frozen=True)
class OptimConfig(schema.Settings):
  """A parsed `optim` section; `build(total_steps) -> (tx, schedule)`.

  tx = chain(clip_by_global_norm(clip_norm), rule(schedule, mask), ema_params(ema_decay)),
  the first and last links only when their key is set.
  """

  prefix: ClassVar[str] = "optim."
  optimizer: Optimizer = schema.subsection(OPTIMIZERS, AdamW, flat=True)  # key `name`, its keys
  schedule: Schedule = schema.subsection(SCHEDULES, WarmupCosine)         # section `schedule`
  lr: float = schema.setting(1e-3, schema.NONNEG)                        # peak eta0
  clip_norm: float | None = schema.setting(1.0, POSITIVE_OR_NONE)        # c: g min(1, c/|g|)
  ema_decay: float | None = schema.setting(None, UNIT_OR_NONE)           # d of the EMA
  decay_embeddings: bool = False         # the default mask also decays 'embedding' tables
  decay_mask: tuple[str, ...] | None = None  # path regexes replacing the default mask

  def __post_init__(self):
    super().__post_init__()
    path_predicate(self.decay_mask)  # a bad regex fails here, before any compile
    hint = self.optimizer.unset_hints.get("weight_decay") or "use a rule with weight decay"
    for key, off in (("decay_mask", None), ("decay_embeddings", False)):
      if not self.has_decay and getattr(self, key) != off:
        self.fail(key, f"optimizer {self.name!r} has no weight decay to mask "
                       f"(got {getattr(self, key)!r}); {hint}, or leave it unset")

  @property
  def name(self) -> str:
    return self.optimizer.name

  @property
  def has_decay(self) -> bool:
    return "weight_decay" in schema.hints(type(self.optimizer))

  @property
  def weight_decay(self) -> float:
    """lambda in effect (0 for a rule without decay)."""
    return self.optimizer.weight_decay if self.has_decay else 0.0

  def mask_fn(self):
    """`params -> pytree of bool`: which parameters are decayed."""
    return mask_of(path_predicate(self.decay_mask, self.decay_embeddings))

  def schedule_fn(self, total_steps: int) -> optax.Schedule:
    return self.schedule.build(self.lr, total_steps)

  def build(self, total_steps: int):
    """`(tx, schedule)` for a run of T = `total_steps` updates."""
    schedule = self.schedule_fn(total_steps)
    parts = []
    if self.clip_norm is not None:
      parts.append(clip_by_global_norm(self.clip_norm))
    parts.append(self.optimizer.build(schedule, self.mask_fn()))
    if self.ema_decay is not None:
      parts.append(ema_params(self.ema_decay))  # last: it averages the parameters after the update
    return optax.chain(*parts), schedule


def default_optim_config(name: str | None = None, *, schedule: str | None = None,
                         **keys) -> ml_collections.ConfigDict:
  """Every `optim.*` key: common keys with their defaults, each rule's and schedule's own keys
  as typed placeholders (None = that class's default): `schema.default_section(OptimConfig)`.

  `name` picks the rule, `schedule` the schedule, and each of `keys` sets the key of that name
  in the section or its `schedule` subsection (`default_optim_config("adam", lr=0.01,
  schedule="constant", warmup_frac=0.0)`), so an experiment states only what differs from the
  defaults. An unknown key is a ValueError naming it.
  """
  c = schema.default_section(OptimConfig)
  s = c.schedule
  if name is not None:
    c.name = name
  if schedule is not None:
    s.name = schedule
  for key, value in keys.items():
    section = c if key in c and key != "schedule" else s if key in s and key != "name" else None
    if section is None:
      raise ValueError(f"optim.{key}: unknown key; expected one of "
                       f"{sorted(k for k in (*c, *s) if k not in ('name', 'schedule'))}")
    section[key] = value
  return c


def parse_optim(optim_cfg, *, strict: bool = True) -> OptimConfig:
  """The typed `OptimConfig` of an `optim` section (ConfigDict or plain dict; missing keys take
  their defaults), by `schema.parse_section`. Raises ValueError naming the key for unknown keys,
  wrong types, values out of range and keys the chosen rule or schedule does not have.
  `strict=False` drops the latter instead: for the `config.json` of a past run, written before
  they were refused."""
  if isinstance(optim_cfg, OptimConfig):
    return optim_cfg
  given = schema.plain(optim_cfg)
  rule = OPTIMIZERS.get(given.get("name"))
  if not strict and rule is not None and "weight_decay" not in schema.hints(rule):
    given.pop("decay_mask", None), given.pop("decay_embeddings", None)  # nothing to mask
  return schema.parse_section(given, OptimConfig, strict=strict)


def parse_schedule(sched_cfg, *, strict: bool = True) -> Schedule:
  """The typed schedule of an `optim.schedule` section alone (see `parse_optim`)."""
  return parse_optim({"schedule": schema.plain(sched_cfg)}, strict=strict).schedule


def decay_table(params, optim_cfg) -> str:
  """A text table of every parameter: path, shape, size, decayed; totals and lambda at the
  bottom (lambda in effect: the rule's default when unset, 0 for a rule without decay)."""
  optim = parse_optim(optim_cfg)
  return mask_table(params, path_predicate(optim.decay_mask, optim.decay_embeddings),
                    optim.weight_decay)


def decay_mask(optim_cfg):
  """`params -> pytree of bool` (True = decayed) of an `optim` section or a parsed
  `OptimConfig` (its `mask_fn`)."""
  return parse_optim(optim_cfg).mask_fn()
