"""A sweep's plan: `--grid KEY=V1,V2,...` flags over an experiment, expanded into named runs.

Every value is read by the override code `jaxdl train` uses (`jaxdl.config.with_overrides` on
the experiment's config, which the caller loaded): it is applied and read back typed, so its
canonical text is what the run would get (`1e-3` -> `0.001`; `1` on a float key -> `1.0`), and
a bad grid fails here with the config's own one-line `ConfigError` before any run starts. Each
point's whole config is then checked the way the engine's setup checks it (`check_config`).

The points are the product of the grid's value lists; each runs once per seed, seeds
s0, s0 + 1, ..., s0 + N - 1 where s0 is the config's seed after the shared `--set` overrides.
Names: `key=value` pairs, keys sorted, joined by ','; the seed's pair last
(`optim.lr=0.001,seed=1`). A value with characters unsafe in a file name has them replaced by '_'
and a short hash of its text appended, so two values never share a directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import re
from typing import Sequence

from jaxdl.config import ConfigError, with_overrides

_UNSAFE = re.compile(r"[^A-Za-z0-9._+\-]")
_MAX_NAME = 200


@dataclasses.dataclass(frozen=True)
class Run:
  """One run of a sweep: a point of the grid at one seed."""
  name: str                  # its workdir's and log's name
  point: str                 # the point's name (the name without the seed)
  seed: int
  values: dict               # swept key -> canonical value text
  overrides: tuple           # `key=value` for `jaxdl train --set`: the point's, then the seed


@dataclasses.dataclass(frozen=True)
class Plan:
  """What one `jaxdl sweep` invocation asks for."""
  experiment: str
  shared: tuple              # `--set` overrides every run gets, in the order given
  grid: dict                 # key -> canonical value texts, in the order given
  seed_key: str
  seeds: tuple
  runs: tuple                # Run, points in grid order, seeds innermost


def split_values(text: str) -> list[str]:
  """`V1,V2,...` split at the commas outside brackets and quotes (`(64, 64),(32, 32)` is two)."""
  out, depth, quote, current = [], 0, None, ""
  for ch in text:
    if quote:
      quote = None if ch == quote else quote
    elif ch in "'\"":
      quote = ch
    elif ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    elif ch == "," and depth == 0:
      out.append(current.strip())
      current = ""
      continue
    current += ch
  out.append(current.strip())
  return out


def parse_grid(flags: Sequence[str], shared: Sequence[str] = (),
               seed_key: str = "seed") -> dict[str, list[str]]:
  """`--grid` flags as {key: [value texts]}; ConfigError on a malformed flag, an empty value, a
  key given twice, the seed key (swept by `--seeds`) or a key also fixed by `--set`."""
  fixed = {item.split("=", 1)[0].strip() for item in shared}
  grid: dict[str, list[str]] = {}
  for flag in flags:
    key, has_values, text = flag.partition("=")
    key = key.strip()
    if not has_values or not key:
      raise ConfigError(f"--grid {flag!r}: expected KEY=V1,V2,... (e.g. optim.lr=1e-3,1e-2)")
    values = split_values(text)
    if not text.strip() or any(not v for v in values):
      raise ConfigError(f"--grid {key}: an empty value in {text!r}; expected KEY=V1,V2,...")
    if key in grid:
      raise ConfigError(f"--grid {key}: given twice; list all its values in one --grid")
    if key == seed_key:
      raise ConfigError(f"--grid {key}: the seed is swept by --seeds N, not by --grid")
    if key in fixed:
      raise ConfigError(f"--grid {key}: also fixed by --set; give it in one place")
    grid[key] = values
  return grid


def value_text(value) -> str:
  """The canonical override text of a typed config value (parses back to the same value)."""
  if isinstance(value, str):
    return value
  return repr(value).replace(" ", "")


def label(text: str) -> str:
  """`text` as a file-name part: unsafe characters -> '_', plus a hash when any was replaced."""
  safe = _UNSAFE.sub("_", text)
  return safe if safe == text else f"{safe}-{hashlib.sha1(text.encode()).hexdigest()[:6]}"


def _shorten(name: str) -> str:
  """Names stay under common file-name limits; a long one keeps its start and a hash of all."""
  if len(name) <= _MAX_NAME:
    return name
  return f"{name[:_MAX_NAME - 9]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def point_name(values: dict) -> str:
  """`k1=v1,k2=v2` over the sorted keys; 'base' for the empty grid (seeds only)."""
  return _shorten(",".join(f"{k}={label(v)}" for k, v in sorted(values.items())) or "base")


def run_name(values: dict, seed_key: str, seed: int) -> str:
  pairs = [f"{k}={label(v)}" for k, v in sorted(values.items())] + [f"{seed_key}={seed}"]
  return _shorten(",".join(pairs))


def _lookup(config, key: str):
  """The value at dotted `key`; KeyError when the config lacks it."""
  node = config
  for part in key.split("."):
    if not hasattr(node, "keys") or part not in node:
      raise KeyError(key)
    node = node[part]
  return node


def check_config(config, overrides: Sequence[str] = ()) -> None:
  """Parses the sections the engine's setup parses (`jaxdl.train.assembly.build`) without
  building data or compiling: a value out of range in data, model or optim is refused here, and
  an architecture key among `overrides` (the run's `--set` items) that a fine-tuning run's base
  decides (`jaxdl.train.init_from.check_overrides`, as the run itself would refuse it)."""
  if config.get("train") is None:
    return  # a custom-run experiment owns its keys; with_overrides checked what it could
  from jaxdl.train import init_from
  init_from.check_overrides(config, overrides)
  # As in `jaxdl train`: experiment files may name the generative models and tasks (the course's
  # planted-bug ones are registered by `jaxdl sweep`, a layer above this package).
  import jaxdl.generative  # noqa: F401
  from jaxdl.data import parse_data
  from jaxdl.models import build_model
  from jaxdl.optim import parse_optim
  try:
    if "data" in config:
      parse_data(config.data)
    if "model" in config:
      build_model(config.model)
    if "optim" in config:
      parse_optim(config.optim)
  except ConfigError:
    raise
  except ValueError as e:  # the parsers' ValueErrors name the key too: one line, like them
    raise ConfigError(str(e).splitlines()[0]) from None


def plan(experiment: str, base, grid_flags: Sequence[str], shared: Sequence[str] = (),
         seeds: int = 1, seed_key: str = "seed") -> Plan:
  """Parses, types and validates a sweep of `experiment` (the spec its runs are started with),
  whose config without overrides, `base`, the caller loaded; raises ConfigError (one line) on
  any bad input."""
  if seeds < 1:
    raise ConfigError(f"--seeds: expected a count >= 1, got {seeds}")
  flags = parse_grid(grid_flags, shared, seed_key)
  shared = tuple(shared)
  base = with_overrides(base, shared)
  try:
    s0 = _lookup(base, seed_key)
  except KeyError:
    raise ConfigError(f"--seed-key {seed_key}: the config of {experiment} has no key "
                      f"{seed_key!r}") from None
  if not isinstance(s0, int) or isinstance(s0, bool):
    raise ConfigError(f"--seed-key {seed_key}: expected an int key, the config has {s0!r}")
  grid = {}
  for key, texts in flags.items():
    canonical = []
    for text in texts:
      config = with_overrides(base, [f"{key}={text}"])
      value = value_text(_lookup(config, key))
      if value not in canonical:  # `1e-3` and `0.001` are one point
        canonical.append(value)
    grid[key] = canonical
  seed_list = tuple(range(s0, s0 + seeds))
  runs = []
  for combo in itertools.product(*grid.values()):
    values = dict(zip(grid, combo))
    overrides = tuple(f"{k}={v}" for k, v in values.items())
    try:
      config = with_overrides(base, [*overrides, f"{seed_key}={s0}"])
      check_config(config, [*shared, *overrides])
    except ConfigError as e:
      where = f" (point {point_name(values)})" if values else ""
      raise ConfigError(f"{str(e).splitlines()[0]}{where}") from None
    for seed in seed_list:
      runs.append(Run(run_name(values, seed_key, seed), point_name(values), seed, values,
                      (*overrides, f"{seed_key}={seed}")))
  return Plan(experiment, shared, grid, seed_key, seed_list, tuple(runs))
