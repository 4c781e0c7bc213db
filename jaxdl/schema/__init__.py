"""The one way to declare a setting: its type, default and check, and the one-line error.

Every config section (the root, `train`, `parallel`, `data`, `model`, `optim`, `optim.schedule`,
`gen`, `reflow`, `distill`) is a dataclass whose fields are the section's keys, each declared once,
and every one is parsed by `parse_section`:

  @dataclasses.dataclass(frozen=True)
  class TrainSettings(Settings):
    prefix: ClassVar[str] = "train."
    steps: int = setting(1000, POSITIVE)
    precision: str = setting("fp32", one_of("fp32", "bf16", "fp16"))

`Settings.__post_init__` type-checks nothing (the locked ConfigDict and `parse_section` do that)
but checks every field's range and refuses non-finite floats, so a class built directly
(`TrainSettings(steps=-5)`) fails as a parsed one does: `train.steps: must be > 0, got -5`.

A section chooses one of several classes by its `name` key (the optimizer, the schedule, the
dataset): those classes are registered in a dict by `registrar(registry, kind)`, and
`parse_section(section, registry)` builds the named one. `default_section(cls)` writes a class's
fields back out as the ConfigDict that experiments start from and `--set` overrides.

A section may hold another chosen by name (`subsection`): the optimizer rule, whose keys sit in
the `optim` section itself beside `optim.lr`, and the schedule, in `optim.schedule`.

Flax model classes are dataclasses too: their fields use `setting(...)` and their
`__post_init__` calls `check_fields(self, "model.")`; `setting(..., run_choice=True)` marks a
field that is a run's choice rather than the model's architecture (`run_choices`: what a
fine-tuning run may set over its base's). They are registered in a `Registry`, which
carries the prefix and kind a Flax class cannot; a builder function (GPT's preset) is a section
class whose keys are its parameters (`hints`).

The bottom layer, in two modules: `checks` (declaring a setting: `setting`, the checks,
`Settings`, `ConfigError`) and `sections` (parsing and writing sections); this package imports
no other jaxdl module and no jax. Callers import every name from `jaxdl.schema`.
"""

from jaxdl.schema.checks import (ConfigError, Check, POSITIVE, NONNEG, UNIT, FRACTION,
                                 OPEN_FRACTION, OPEN_UNIT, at_least, greater_than, one_of, each,
                                 setting, run_choices, runtime, fail, check_fields, Settings)
from jaxdl.schema.sections import (Registry, subsection, SWITCHABLE, switchable_registry,
                                   switch_section, registrar, config_type, hints, defaults,
                                   types_of, coerce, parse_section, default_section, plain)

__all__ = ["ConfigError", "Check", "POSITIVE", "NONNEG", "UNIT", "FRACTION", "OPEN_FRACTION",
           "OPEN_UNIT", "at_least", "greater_than", "one_of", "each", "setting", "run_choices",
           "runtime", "fail", "check_fields", "Settings", "Registry", "subsection", "SWITCHABLE",
           "switchable_registry", "switch_section", "registrar", "config_type", "hints", "defaults",
           "types_of", "coerce", "parse_section", "default_section", "plain"]
