"""jaxdl.schema: the one way to declare a setting, and the codebase holding to it.

The primitives (a setting's default and check, `parse_section` on a class or a registry,
`default_section`) are tested on small classes written here; the codebase tests walk every
declared section of the package (train, parallel, data, models, optimizers, schedules, gen,
reflow, distill) and its source.
"""

import ast
import dataclasses
import pathlib
import re
from typing import ClassVar

import pytest

from jaxdl import schema
from jaxdl.schema import (NONNEG, POSITIVE, ConfigError, Settings, default_section, one_of,
                          parse_section, setting)

ROOT = pathlib.Path(__file__).resolve().parent.parent / "jaxdl"


@dataclasses.dataclass(frozen=True)
class Toy(Settings):
  prefix: ClassVar[str] = "toy."
  steps: int = setting(10, POSITIVE)
  rate: float = setting(0.5, NONNEG)
  mode: str = setting("a", one_of("a", "b"))
  shape: tuple = (2,)
  limit: float | None = setting(None, POSITIVE)


def test_a_settings_class_checks_itself_in_one_line_naming_the_key():
  assert Toy() == Toy(steps=10, rate=0.5, mode="a", shape=(2,), limit=None)
  for kwargs, message in ((dict(steps=0), "toy.steps: must be > 0, got 0"),
                          (dict(rate=-1.0), "toy.rate: must be >= 0, got -1.0"),
                          (dict(mode="c"), "toy.mode: expected one of 'a', 'b', got 'c'"),
                          (dict(rate=float("inf")), "toy.rate: must be a finite number, got inf"),
                          (dict(limit=0.0), "toy.limit: must be > 0, got 0.0")):
    with pytest.raises(ConfigError) as e:
      Toy(**kwargs)
    assert str(e.value) == message


def test_parse_section_types_each_key_and_refuses_unknown_ones():
  t = parse_section({"steps": 3, "rate": 2, "shape": [4, 5]}, Toy)
  assert (t.steps, t.rate, t.shape) == (3, 2.0, (4, 5)) and isinstance(t.rate, float)
  assert parse_section(None, Toy) == Toy()  # an absent section: the defaults
  for section, message in (({"stepz": 3}, r"^toy\.stepz: unknown key; expected one of limit, "),
                           ({"steps": True}, r"^toy\.steps: expected int, got True$"),
                           ({"steps": 2**63}, r"^toy\.steps: 9223372036854775808 does not fit"),
                           ({"steps": "3"}, r"^toy\.steps: expected int, got '3'$"),
                           ({"steps": None}, r"^toy\.steps: must be set \(expected int\)$")):
    with pytest.raises(ConfigError, match=message):
      parse_section(section, Toy)


def test_default_section_round_trips_through_parse_section():
  cfg = default_section(Toy, steps=7)
  assert cfg.steps == 7 and cfg.limit is None and cfg.get_type("limit") is float
  assert parse_section(cfg, Toy) == Toy(steps=7)
  with pytest.raises(ConfigError, match="^toy.nope: unknown key"):
    default_section(Toy, nope=1)


REGISTRY = {}
register = schema.registrar(REGISTRY, "rule")


@dataclasses.dataclass(frozen=True)
class Rule(Settings):
  prefix: ClassVar[str] = "rule."
  kind: ClassVar[str] = "rule"
  off_values: ClassVar[dict] = {"decay": 0.0}


@register("plain")
@dataclasses.dataclass(frozen=True)
class Plain(Rule):
  lr: float = setting(0.1, POSITIVE)


@register("decayed")
@dataclasses.dataclass(frozen=True)
class Decayed(Rule):
  lr: float = setting(0.1, POSITIVE)
  decay: float = setting(0.01, NONNEG)


def test_a_registry_section_builds_the_named_class_and_refuses_keys_it_lacks():
  assert parse_section({"name": "decayed", "decay": 0.5}, REGISTRY) == Decayed(decay=0.5)
  assert parse_section({}, REGISTRY, default="plain") == Plain()
  assert parse_section({"name": "plain", "decay": 0.0}, REGISTRY) == Plain()  # "off" is fine
  with pytest.raises(ConfigError, match=r"^rule\.decay: rule 'plain' has no decay \(got 0\.5\); "
                                        r"use one that has it \('decayed'\), or leave it unset$"):
    parse_section({"name": "plain", "decay": 0.5}, REGISTRY)
  assert parse_section({"name": "plain", "decay": 0.5}, REGISTRY, strict=False) == Plain()
  with pytest.raises(ConfigError, match=r"^rule\.name: unknown rule 'x'; expected one of "
                                        r"plain, decayed$"):
    parse_section({"name": "x"}, REGISTRY)
  with pytest.raises(TypeError, match="register a frozen dataclass"):
    register("loose")(type("Loose", (), {}))


# ----------------------------------------------------------------------------- the codebase


def _sections():
  """Every declared section class of the package: (prefix, class)."""
  import jaxdl.generative.settings  # noqa: F401  (the gen sections)
  from jaxdl.config import ParallelSettings, TrainSettings
  from jaxdl.data import SOURCES
  from jaxdl.generative.distill import DistillSettings
  from jaxdl.generative.reflow import ReflowSettings
  from jaxdl.generative.settings import GEN_SETTINGS
  from jaxdl.optim import OPTIMIZERS, OptimConfig
  from jaxdl.optim.schedules import SCHEDULES
  return [TrainSettings, ParallelSettings, OptimConfig, DistillSettings, ReflowSettings,
          *SOURCES.values(), *OPTIMIZERS.values(), *SCHEDULES.values(), *GEN_SETTINGS.values()]


def test_every_section_is_declared_with_the_one_primitive_and_round_trips():
  """Each section class, written out by `default_section` and read back by `parse_section`, is
  its defaults: the root, train, parallel, data, optim (its rule and schedule inside), gen,
  reflow, distill, and every model (a Flax class or a builder function, by its `Registry`)."""
  import jaxdl.course.planted  # noqa: F401  (models registered outside jaxdl.models)
  import jaxdl.generative.gan  # noqa: F401
  import jaxdl.generative.vae  # noqa: F401
  from jaxdl.config import RootSettings
  from jaxdl.models import MODELS, build_model, model_config
  from jaxdl.optim import OPTIMIZERS, SCHEDULES, OptimConfig
  for cls in [RootSettings, *_sections()]:
    assert issubclass(cls, Settings), cls
    assert cls.prefix.endswith(".") or cls is RootSettings, cls
    registered = isinstance(cls.name, str) and cls.name  # (OptimConfig's is its rule's)
    built = parse_section(default_section(cls), {cls.name: cls} if registered else cls)
    assert built == cls(), cls
  optim = default_section(OptimConfig, clip_norm=None)
  optim.update(name="momentum", momentum=0.5)
  optim.schedule.update(name="wsd", decay_frac=0.5)
  assert optim.b2 is None and optim.schedule.gamma is None  # every class's keys, unset
  assert parse_section(optim, OptimConfig) == OptimConfig(
      optimizer=OPTIMIZERS["momentum"](momentum=0.5), schedule=SCHEDULES["wsd"](decay_frac=0.5),
      clip_norm=None)
  assert {"planted_mlp", "vae", "gan", "gpt", "rnn"} <= set(MODELS)
  for name, builder in MODELS.items():
    cfg = model_config(name)
    assert cfg.name == name and set(cfg) == set(schema.hints(builder)) | {"name"}, name
    assert build_model(cfg) == builder(), name  # parse_section, with dtypes by name


def _definitions(*queries):
  """{(node kind, name): sorted paths under jaxdl/ that define it} for every query, in one parse
  of the package (a parse per query made the test four times as costly). Nothing is kept: a
  cached syntax tree of the package would be walked by every later full collection."""
  found = {query: [] for query in queries}
  for path in ROOT.rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      for kind, name in queries:
        if isinstance(node, kind) and node.name == name:
          found[kind, name].append(str(path.relative_to(ROOT)))
  return {query: sorted(paths) for query, paths in found.items()}


def test_one_settings_primitive_and_one_parse_section_in_the_package():
  queries = ((ast.FunctionDef, "parse_section"), (ast.FunctionDef, "setting"),
             (ast.ClassDef, "Check"), (ast.ClassDef, "ConfigError"))
  home = {"parse_section": "schema/sections.py"}
  for query, paths in _definitions(*queries).items():
    assert paths == [home.get(query[1], "schema/checks.py")], query
  # Field checks are declared through `setting`, not by hand-built field metadata.
  hand_made = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
               if 'metadata={"check"' in p.read_text() and p.parent.name != "schema"]
  assert hand_made == []


def test_no_declared_setting_is_read_with_a_restated_default():
  """`section.get("key", literal)` or `getattr(obj, "key", literal)` restates a default its
  class declares; the parsed section (or the locked config) has the key. `getattr(model,
  "key", None)` stays: "a model of another family has no such field"."""
  from jaxdl.config import RootSettings
  from jaxdl.models import MODELS
  declared = {k for cls in [RootSettings, *_sections()] for k in schema.hints(cls)}
  for builder in MODELS.values():
    declared |= set(schema.hints(builder))
  pattern = re.compile(r"\.get\(\"(\w+)\", |getattr\([^,()]+, \"(\w+)\", (?!None\))")
  offenders = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
               for p in sorted(ROOT.rglob("*.py")) if p.parent.name != "schema"
               for i, line in enumerate(p.read_text().splitlines(), 1)
               for keys in pattern.findall(line) for key in keys if key in declared]
  assert offenders == []
