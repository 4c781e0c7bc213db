"""Experiment configs: load `experiments/<name>.py`, apply dotted overrides, validate.

An experiment is a Python file defining `get_config(arg=None) -> ml_collections.ConfigDict`.
It is named on the command line as a path (`experiments/moons_mlp.py`), a bare name
(`moons_mlp`), and optionally `:ARG` (`moons_mlp:smoke`, `moons_mlp:bn`), the argument passed to
`get_config`. Arguments compose: `moons_mlp:bn,smoke` passes 'bn,smoke', which the experiment
reads with `parse_arg(arg, bn=False, smoke=False)` (flags, and `key=value` for typed values).

Overrides are `key.path=value` strings. The value is parsed as a Python literal when it is one
(`3e-3`, `500`, `True`, `(64, 64)`, `None`) and taken as a string otherwise. The config is locked:
an unknown key, or a value whose type does not match the field, raises `ConfigError` with a
one-line message naming the key, before anything is built or compiled.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import pathlib
import types
from typing import Any, ClassVar, Sequence

import ml_collections


from jaxdl.schema import (NONNEG, POSITIVE, UNIT, ConfigError, Settings, at_least,
                          default_section, greater_than, one_of, parse_section, setting,
                          SWITCHABLE, switch_section)
from jaxdl.schema import hints as schema_hints

__all__ = ["ConfigError", "RootSettings", "TrainSettings", "ParallelSettings", "base_config",
           "load_config", "parse_arg", "parse_root", "parse_train", "parse_parallel", "validate"]


def experiments_dir() -> pathlib.Path:
  """The directory searched for bare experiment names ($JAXDL_EXPERIMENTS overrides)."""
  env = os.environ.get("JAXDL_EXPERIMENTS")
  if env:
    return pathlib.Path(env)
  return pathlib.Path(__file__).resolve().parent.parent / "experiments"


def list_experiments() -> list[tuple[str, str]]:
  """Returns (name, one-line description) for every experiment file, sorted by name."""
  out = []
  for path in sorted(experiments_dir().glob("*.py")):
    if path.name.startswith("_"):
      continue
    try:
      doc = ast.get_docstring(ast.parse(path.read_text(), filename=str(path))) or ""
    except (SyntaxError, ValueError, OSError, UnicodeDecodeError) as e:
      # One broken file must not hide the others: it is listed with its error instead.
      out.append((path.stem, f"(cannot be read: {_one_line(e)})"))
      continue
    out.append((path.stem, doc.strip().splitlines()[0] if doc.strip() else ""))
  return out


def _one_line(e: BaseException) -> str:
  """`Type: message (line N)` of an exception, on one line."""
  if isinstance(e, SyntaxError):
    return f"SyntaxError: {e.msg} (line {e.lineno})"
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def resolve_experiment(spec: str) -> tuple[pathlib.Path, str | None]:
  """Splits `path_or_name[:arg]` and finds the experiment file."""
  arg = None
  base = spec
  if ":" in spec and not pathlib.Path(spec).exists():
    base, arg = spec.rsplit(":", 1)
  candidates = [pathlib.Path(base)]
  if not base.endswith(".py"):
    candidates.append(experiments_dir() / f"{base}.py")
  for path in candidates:
    if path.is_file():
      return path, arg or None
  names = ", ".join(name for name, _ in list_experiments())
  raise ConfigError(f"experiment: {base!r} not found; known experiments: {names}")


def default_workdir(spec: str, config) -> str:
  """`runs/<config.name>[-<arg>]`, the run directory when none is given.

  The experiment's `:ARG` is part of the name (commas as '-', `moons_mlp:bn,smoke` ->
  `runs/moons_mlp-bn-smoke`), so runs of differently configured variants never share a
  workdir: `jaxdl train moons_mlp` then `jaxdl train moons_mlp:bn` are two runs.
  """
  _, arg = resolve_experiment(spec)
  parts = [config.name] + [a.strip() for a in (arg or "").split(",") if a.strip()]
  return os.path.join("runs", "-".join(parts).replace(os.sep, "_"))


def load_module(path: pathlib.Path) -> types.ModuleType:
  """Imports an experiment file as a module.

  An experiment imports only jaxdl: shared setup lives in the library (`jaxdl.course`), never in
  another experiment or a helper file beside it, so its directory is not put on `sys.path`.
  """
  spec = importlib.util.spec_from_file_location(f"jaxdl_experiment_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # noqa: BLE001 -- any error of the user's file is a bad input
    raise ConfigError(f"experiment: {path} cannot be loaded: {_one_line(e)}") from e
  if not hasattr(module, "get_config"):
    raise ConfigError(f"experiment: {path} defines no get_config(arg=None)")
  return module


def load_config(spec: str, overrides: Sequence[str] = ()) -> tuple[ml_collections.ConfigDict,
                                                                  types.ModuleType]:
  """Loads an experiment, applies overrides and validates; returns (config, module)."""
  path, arg = resolve_experiment(spec)
  module = load_module(path)
  try:
    config = module.get_config(arg) if arg is not None else module.get_config()
  except (ValueError, KeyError) as e:
    raise ConfigError(f"experiment: {path.stem} rejects arg {arg!r}: {e}") from None
  except Exception as e:  # noqa: BLE001 -- a crashing get_config is the file's error, one line
    raise ConfigError(f"experiment: {path.stem}: get_config({arg!r}) raised "
                      f"{_one_line(e)}") from e
  if "name" not in config:
    raise ConfigError(f"experiment: {path.stem}: get_config() must set `name`")
  config.lock()
  apply_overrides(config, overrides)
  validate(config)
  return config, module


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parses an experiment argument such as 'bn,smoke' or 'smoke,steps=50' against `defaults`.

  A bare name sets a bool default to True; `key=value` parses the value as a Python literal and
  must match the default's type. An unknown name raises ValueError listing the known ones, so a
  typo in `:ARG` is an error, not a silently different run.

  Example: `parse_arg('bn,smoke', bn=False, smoke=False)` -> {bn: True, smoke: False -> True}.
  """
  out = ml_collections.ConfigDict(defaults)
  for item in (arg or "").split(","):
    item = item.strip()
    if not item:
      continue
    key, has_value, text = item.partition("=")
    if key not in defaults:
      raise ValueError(f"unknown arg {key!r}; expected some of {', '.join(defaults)} "
                       f"(comma-separated)")
    if not has_value:
      if not isinstance(defaults[key], bool):
        raise ValueError(f"arg {key!r} needs a value ({key}=...)")
      out[key] = True
      continue
    value = _parse_value(text)
    if type(value) is not type(defaults[key]) and not (isinstance(defaults[key], float) and
                                                          isinstance(value, int)):
      raise ValueError(f"arg {key}: expected {type(defaults[key]).__name__}, got {text!r}")
    out[key] = type(defaults[key])(value)
  return out


def _parse_value(text: str) -> Any:
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    lowered = text.lower()
    if lowered in ("true", "false"):
      return lowered == "true"
    if lowered in ("none", "null"):
      return None
    return text


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str]) -> None:
  """Applies `key.path=value` overrides in place; raises ConfigError naming the key.

  `data.name=KIND` comes first, whatever its place: it re-writes the data section for that
  source (its own keys at their defaults, the experiment's batch size kept), so the source's
  keys can be set after it (`--set data.name=parquet --set data.path=f.parquet`).
  """
  items = []
  for item in overrides:
    if "=" not in item:
      raise ConfigError(f"override: {item!r} is not of the form key.path=value")
    key, text = item.split("=", 1)
    key = key.strip()
    if key.startswith("config."):  # accept the `--config.x=` spelling too
      key = key[len("config."):]
    items.append((key, text))
  items.sort(key=lambda kv: not _switches_section(config, *kv))
  for key, text in items:
    if _switches_section(config, key, text):
      section = key.rsplit(".", 1)[0]
      switched = switch_section(section, config[section], _parse_value(text))
      switched.lock()  # as locked as the section it replaces: a typo after it is still refused
      with config.unlocked():
        config[section] = switched
      continue
    _apply_override(config, key, text)


def variant_config(config, overrides: dict) -> ml_collections.ConfigDict:
  """A copy of `config` with `overrides` ({'model.num_layers': 4, ...}) applied and checked as
  `--set` would (an unknown key or a wrong type is a ConfigError naming it)."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.lock()
  apply_overrides(c, [f"{key}={value!r}" for key, value in overrides.items()])
  return c


def with_overrides(base: ml_collections.ConfigDict,
                   overrides: Sequence[str]) -> ml_collections.ConfigDict:
  """A copy of the loaded experiment config `base` with `key.path=value` `overrides` applied and
  validated: `load_config(spec, overrides)` for the spec `base` was loaded from without
  overrides (an experiment's `get_config` is a pure function of its arg), without reading the
  file again. Multi-run procedures (the sweep's points) take `base` from their caller."""
  c = ml_collections.ConfigDict(base.to_dict())
  c.lock()
  apply_overrides(c, overrides)
  validate(c)
  return c


def _switches_section(config, key: str, text: str) -> bool:
  """Whether `key=text` names another class for a switchable section (`data.name=parquet`)."""
  section, _, leaf = key.rpartition(".")
  return (leaf == "name" and section in SWITCHABLE and section in config
          and isinstance(config[section], ml_collections.ConfigDict)
          and config[section].get("name") != _parse_value(text))


def _apply_override(config: ml_collections.ConfigDict, key: str, text: str) -> None:
  """Sets one `key.path` of the locked config to the literal `text`."""
  *parents, leaf = key.split(".")
  node = config
  for i, part in enumerate(parents):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      raise ConfigError(f"{'.'.join(parents[:i + 1])}: unknown key")
    node = node[part]
  if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
    raise ConfigError(f"{key}: unknown key")
  value = _parse_value(text)
  current = node[leaf]
  expected = node.get_type(leaf)
  if isinstance(current, ml_collections.ConfigDict):
    raise ConfigError(f"{key}: is a section; set one of its keys instead")
  if isinstance(value, list) and isinstance(current, tuple):
    value = tuple(value)
  if isinstance(value, tuple) and isinstance(current, list):
    value = list(value)
  if isinstance(value, str) and expected in (int, float, bool):
    raise ConfigError(f"{key}: expected {expected.__name__}, got {text!r}")
  if expected is str and isinstance(value, (bool, int, float)):
    value = text.strip()  # a name that reads as a literal ('true', '1'): the key's check judges it
  try:
    node[leaf] = value
  except TypeError:
    raise ConfigError(
        f"{key}: expected {getattr(expected, '__name__', expected)}, got {text!r}") from None


@dataclasses.dataclass(frozen=True)
class RootSettings(Settings):
  """The root section: the top-level keys every experiment has, declared once (`base_config`
  writes them, `parse_root` reads them). An experiment's own top-level keys (a study's `rules`,
  `depths`, ...) belong to its `after_training` and are not checked here; the sections are
  parsed by their own classes."""

  name: str = ""
  description: str = ""
  seed: int = 0               # PRNGKey(seed): the run's one base key; the data order's seed
  task: str = "classification"  # a name of `jaxdl.train.tasks.TASKS`
  # The `smoke` arg of every experiment sets it (`smoke`): the procedures of multi-stage
  # experiments (the teacher, the digits judge, evaluation sizes) read it, never a step count.
  smoke: bool = False
  init_from: str = ""         # a fresh run's parameters from this run or HF directory; '' off


@dataclasses.dataclass(frozen=True)
class TrainSettings(Settings):
  """The `train` section: every key, its default and its check, written once.

  `base_config()` copies the defaults into the ConfigDict users override; `parse_train` turns the
  overridden section back into this object (one-line ConfigError naming the key when a value is
  out of range).
  """
  prefix: ClassVar[str] = "train."

  steps: int = setting(1000, POSITIVE)
  # 0 disables periodic evaluation (the last step always evaluates)
  eval_every: int = setting(100, NONNEG)
  log_every: int = setting(10, NONNEG)
  ckpt_every: int = setting(100, NONNEG)     # 0: only the final checkpoint
  keep_ckpts: int = setting(3, at_least(1))
  best_metric: str = ""          # e.g. 'eval/accuracy'; '' keeps only the latest checkpoints
  best_mode: str = setting("max", one_of("max", "min"))
  # early stopping after this many evals without improvement (0: never)
  patience: int = setting(0, NONNEG)
  # jaxdl.optim.precision
  precision: str = setting("fp32", one_of("fp32", "bf16", "fp16"))
  label_smoothing: float = setting(0.0, UNIT)  # s: targets (1 - s) onehot(y) + s / K
  z_loss: float = setting(0.0, NONNEG)   # c: lm tasks add c * mean (log Z)^2 (PaLM); 0 off
  # C > 0: the lm loss over C-position chunks of GPT's hidden states, never holding the
  # B x T x V logits (jaxdl.train.chunked_loss); the same loss and gradient. 0: off.
  loss_chunk: int = setting(0, NONNEG)
  grad_accum: int = setting(1, at_least(1))   # N microbatches per update
  async_checkpoint: bool = True
  plot: bool = True
  doctor: bool = False           # preflight before, history diagnosis after (jaxdl.doctor hooks)
  # Spike guard: on loss (or grad norm) > spike_factor x the rolling median of the last
  # spike_window steps, rewind to the last checkpoint and skip the offending batch.
  spike_guard: bool = False
  spike_factor: float = setting(5.0, greater_than(1, "a multiple of the rolling median"))
  spike_window: int = setting(20, at_least(1))
  spike_watch: str = setting("loss", one_of("loss", "grad_norm", "either"))
  max_rewinds: int = setting(3, NONNEG)
  # Seeing inside a run (jaxdl.train.throughput, jaxdl.train.profiling).
  count_flops: bool = True       # FLOPs per step and the device peak, for FLOP/s and MFU
  # per-device peak FLOP/s; 0: datasheet table or measured once
  peak_flops: float = setting(0.0, NONNEG)
  profile_steps: tuple = (0, 0)  # (start, stop): jax.profiler trace of these steps; (0, 0) off
  # health signals (jaxdl.train.watch)
  watch: str = setting("cheap", one_of("off", "cheap", "detailed"))
  # K: the health signals of every K-th step (train.watch='off' for none)
  watch_every: int = setting(100, POSITIVE)
  loggers: tuple = ("tensorboard",)  # + 'wandb', 'mlflow' (extras); metrics.jsonl always
  eval_ema: bool = False         # also evaluate optim.ema_decay's average (eval_ema/...); the
                                 # best checkpoint and early stopping then judge the average
  xla_cpu_workarounds: bool = True  # XLA:CPU compiler workarounds (jaxdl.train.xla_cpu)

  def __post_init__(self):
    super().__post_init__()
    window = tuple(self.profile_steps)
    if not (window == (0, 0) or len(window) == 2 and all(isinstance(s, int) for s in window)
            and 1 <= window[0] <= window[1] <= self.steps):
      self.fail("profile_steps", f"expected (start, stop) with 1 <= start <= stop <= "
                f"train.steps ({self.steps}), or (0, 0) for none; got {window}")


@dataclasses.dataclass(frozen=True)
class ParallelSettings(Settings):
  """The `parallel` section (strategies in `jaxdl.train.strategies`)."""
  prefix: ClassVar[str] = "parallel."

  strategy: str = setting("jit", one_of("jit", "pmap", "fsdp"))
  # how many devices to use (0 = all); the global batch is split over them
  devices: int = setting(0, at_least(0, "0 = all devices"))
  # size of the fsdp mesh axis under strategy 'fsdp' (0 = all devices)
  fsdp: int = setting(0, at_least(0, "0 = all devices"))
  # size of the expert mesh axis (MoE experts split over it; 1 = none)
  expert: int = setting(1, at_least(1, "1 = none"))
  # size of the tensor mesh axis (attention heads, MLP hidden and vocabulary split over it,
  # `jaxdl.train.sharding_rules`; 1 = none)
  tensor: int = setting(1, at_least(1, "1 = none"))
  # size of the sequence mesh axis (a GPT's positions split over it, attention over the whole
  # sequence by `sequence_attention`, `jaxdl.models.ring_attention`; 1 = none)
  sequence: int = setting(1, at_least(1, "1 = none"))
  # how attention reads the other devices' keys and values: passed round a 'ring' (ppermute,
  # fully masked causal blocks skipped) or 'allgather'ed
  sequence_attention: str = setting("ring", one_of("ring", "allgather"))


def parse_root(config) -> RootSettings:
  """The root keys of `config` (a ConfigDict or mapping) as a checked `RootSettings`; keys it
  lacks take their defaults, the experiment's own keys and the sections are left out."""
  own = schema_hints(RootSettings)
  return parse_section({k: v for k, v in config.items() if k in own}, RootSettings)


def parse_train(config) -> TrainSettings:
  """`config.train` as a checked `TrainSettings` (defaults when the section is absent)."""
  return parse_section(config.get("train"), TrainSettings)


def parse_parallel(config) -> ParallelSettings:
  """`config.parallel` as a checked `ParallelSettings` (defaults when the section is absent)."""
  return parse_section(config.get("parallel"), ParallelSettings)


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks the root and the engine's own sections (data, model and optim parse themselves when
  built, by
  `jaxdl.data.parse_data`, `jaxdl.models.build_model` and `jaxdl.optim.parse_optim`)."""
  parse_root(config)
  if config.get("train") is None:
    return  # a custom-run experiment (e.g. an optimizer toy) owns its own sections
  parse_train(config)
  parse_parallel(config)


def diff_configs(old: dict, new: dict, prefix: str = "") -> list[str]:
  """Dotted keys whose values differ between two nested dicts (JSON views of configs)."""
  keys = sorted(set(old) | set(new))
  out = []
  for k in keys:
    path = f"{prefix}{k}"
    a, b = old.get(k, "<missing>"), new.get(k, "<missing>")
    if isinstance(a, dict) and isinstance(b, dict):
      out += diff_configs(a, b, path + ".")
    elif a != b:
      out.append(f"{path}: {a!r} -> {b!r}")
  return out


def smoke(c: ml_collections.ConfigDict, steps: int = 20, eval_every: int = 10,
          ckpt_every: int = 10) -> ml_collections.ConfigDict:
  """`c` shrunk for the `smoke` arg: `c.smoke = True` (the flag procedures read) and a short
  run of `steps` steps evaluated and checkpointed every `eval_every` / `ckpt_every`. Returns c.

  The one place an experiment's smoke size is written, so no experiment repeats these lines.
  """
  c.smoke = True
  c.train.steps, c.train.eval_every, c.train.ckpt_every = steps, eval_every, ckpt_every
  return c


def base_config() -> ml_collections.ConfigDict:
  """The engine's keys with their defaults; experiments start from this and fill in the rest."""
  c = default_section(RootSettings)
  c.train = default_section(TrainSettings)
  c.parallel = default_section(ParallelSettings)
  return c
