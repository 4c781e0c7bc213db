"""A search's plan: `--space KEY=DIST` flags, the sampler, the pruner and the metric, typed and
checked against the experiment's config before anything starts (`jaxdl sweep --search`).

Distributions, one `--space` flag per searched key:

  uniform:LOW:HIGH      a float in [LOW, HIGH]
  loguniform:LOW:HIGH   a float in [LOW, HIGH], uniform in log (0 < LOW)
  int:LOW:HIGH          an integer in [LOW, HIGH], both included
  logint:LOW:HIGH       an integer in [LOW, HIGH], uniform in log (1 <= LOW)
  choice:V1,V2,...      one of the values, any override texts (split like `--grid` values)

Every bound and choice is applied to the config by the override code `jaxdl train` uses
(`jaxdl.config.with_overrides`) and the config at it checked as a grid point is
(`grid.check_config`), so an unknown key, a float range on an int key or a bound the engine
refuses (`optim.lr=uniform:-1:1`) is one `ConfigError` here. A sampled combination is checked the
same way when its trial starts; one the config refuses is a failed trial, not a crash.

Samplers (`--search`): `random`, or `tpe[:STARTUP]`, Optuna's TPE, drawing at random until
STARTUP trials (default 5) have ended. A trial's sampler is seeded with a hash of
`--sampler-seed` and the trial's number, so its random draws depend neither on how concurrent
runs were timed nor on an interruption (TPE's later draws depend on the trials ended before, as
they must).

Pruners (`--prune`): `none` (the default); `median[:STARTUP[:WARMUP]]`, which stops a trial whose
best value so far is worse than the median of the finished trials' values at the same step,
once STARTUP trials (default 3) have finished and from step WARMUP on (default 0);
`percentile:P[:STARTUP[:WARMUP]]`, the same with the P-th percentile (P in (0, 100); median is
50; a lower P prunes more when minimizing).

The metric (`--metric SPLIT/KEY`, a key of the runs' metrics.jsonl records) defaults to
`eval/loss` where the config evaluates during training (`train.eval_every > 0`, so there are
values to prune on), else `train/loss`; `--mode` defaults to max for accuracies, else min.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

from jaxdl.config import ConfigError, parse_train, with_overrides
from jaxdl.sweep import grid

KINDS = ("uniform", "loguniform", "int", "logint", "choice")
SAMPLERS = ("random", "tpe")
STUDY_FILE = "study.log"
STUDY_NAME = "jaxdl-sweep"
_EXAMPLE = "e.g. optim.lr=loguniform:1e-4:1e-1"


@dataclasses.dataclass(frozen=True)
class Dist:
  """One searched key's distribution; bounds typed as the config holds the key."""
  kind: str
  low: float | int | None = None
  high: float | int | None = None
  choices: tuple = ()        # canonical override texts

  @property
  def text(self) -> str:
    """The canonical flag text (what sweep.json keeps and a rerun must match)."""
    if self.kind == "choice":
      return "choice:" + ",".join(self.choices)
    return f"{self.kind}:{grid.value_text(self.low)}:{grid.value_text(self.high)}"


@dataclasses.dataclass(frozen=True)
class Search:
  """What one `jaxdl sweep --search` invocation asks for."""
  experiment: str
  base: Any                  # the experiment's config with `shared` applied (a ConfigDict)
  shared: tuple              # `--set` overrides every run gets
  seed_key: str
  seed: int                  # every run's seed: the config's, after `--set`
  space: dict                # key -> Dist, in the order given
  sampler: str               # 'random' or 'tpe'
  startup: int               # TPE's random trials
  sampler_seed: int
  metric: str                # SPLIT/KEY
  mode: str                  # 'min' or 'max'
  prune: tuple | None        # (percentile, startup, warmup), None: no pruning
  steps: int | None          # train.steps: a run at its last step is complete, never judged

  def settings(self) -> dict:
    """What sweep.json keeps of the search; a rerun must ask for the same."""
    return {"sampler": self.sampler, "startup": self.startup, "sampler_seed": self.sampler_seed,
            "metric": self.metric, "mode": self.mode,
            "space": {k: d.text for k, d in self.space.items()}}


def _ints(parts: Sequence[str], flag: str, names: str) -> list[int]:
  try:
    return [int(p) for p in parts]
  except ValueError:
    raise ConfigError(f"{flag}: expected integers {names}, got {':'.join(parts)!r}") from None


def parse_sampler(text: str) -> tuple[str, int]:
  """`random` or `tpe[:STARTUP]` -> (name, startup)."""
  name, _, rest = text.partition(":")
  if name not in SAMPLERS or (rest and name != "tpe"):
    raise ConfigError(f"--search {text!r}: expected random or tpe[:STARTUP]")
  startup = _ints([rest], "--search", "STARTUP")[0] if rest else 5
  if startup < 0:
    raise ConfigError(f"--search {text!r}: STARTUP must be >= 0")
  return name, startup


def parse_pruner(text: str) -> tuple | None:
  """`none`, `median[:STARTUP[:WARMUP]]` or `percentile:P[:STARTUP[:WARMUP]]` -> (percentile,
  startup, warmup) or None."""
  name, *rest = text.split(":")
  usage = (f"--prune {text!r}: expected none, median[:STARTUP[:WARMUP]] or "
           f"percentile:P[:STARTUP[:WARMUP]]")
  if name == "none" and not rest:
    return None
  if name == "median" and len(rest) <= 2:
    percentile = 50.0
  elif name == "percentile" and 1 <= len(rest) <= 3:
    try:
      percentile = float(rest.pop(0))
    except ValueError:
      raise ConfigError(usage) from None
    if not 0.0 < percentile < 100.0:
      raise ConfigError(f"--prune {text!r}: P must be in (0, 100)")
  else:
    raise ConfigError(usage)
  given = _ints(rest, "--prune", "STARTUP:WARMUP")
  startup, warmup = (given + [3, 0][len(given):])
  if startup < 0 or warmup < 0:
    raise ConfigError(f"--prune {text!r}: STARTUP and WARMUP must be >= 0")
  return percentile, startup, warmup


def _typed(base, key: str, text: str, shared: Sequence[str] = ()):
  config = with_overrides(base, [f"{key}={text}"])
  try:
    grid.check_config(config, [*shared, f"{key}={text}"])
  except ConfigError as e:
    raise ConfigError(f"{str(e).splitlines()[0]} (--space {key})") from None
  return grid._lookup(config, key)


def parse_dist(base, key: str, text: str, shared: Sequence[str] = ()) -> Dist:
  """One `--space` value, its bounds or choices typed and checked against the config `base`
  (the experiment's, with the shared `--set` overrides, `shared`, applied)."""
  kind, has_args, args = text.partition(":")
  if kind not in KINDS or not has_args:
    raise ConfigError(f"--space {key}={text}: expected KIND:ARGS, KIND one of "
                      f"{', '.join(KINDS)} ({_EXAMPLE})")
  if kind == "choice":
    values = grid.split_values(args)
    if any(not v for v in values):
      raise ConfigError(f"--space {key}: an empty value in {args!r}; expected choice:V1,V2,...")
    canonical = []
    for v in values:
      typed = grid.value_text(_typed(base, key, v, shared))
      if typed not in canonical:
        canonical.append(typed)
    return Dist(kind, choices=tuple(canonical))
  bounds = args.split(":")
  if len(bounds) != 2 or not all(b.strip() for b in bounds):
    raise ConfigError(f"--space {key}={text}: expected {kind}:LOW:HIGH ({_EXAMPLE})")
  low, high = (_typed(base, key, b.strip(), shared) for b in bounds)
  if kind in ("int", "logint"):
    ints = _ints([b.strip() for b in bounds], f"--space {key}", "LOW:HIGH")
    if not isinstance(low, (int, float)) or isinstance(low, bool):
      raise ConfigError(f"--space {key}: {kind} needs a numeric key; the config holds "
                        f"{type(low).__name__}")
    low, high = ints
  elif not isinstance(low, float) or not isinstance(high, float):
    raise ConfigError(f"--space {key}: {kind} needs a float key; the config holds "
                      f"{type(low).__name__} (use int:LOW:HIGH or choice:...)")
  if not low < high:
    raise ConfigError(f"--space {key}={text}: LOW must be below HIGH")
  if kind == "loguniform" and low <= 0 or kind == "logint" and low < 1:
    raise ConfigError(f"--space {key}={text}: a log range needs LOW "
                      f"{'> 0' if kind == 'loguniform' else '>= 1'}")
  return Dist(kind, low, high)


def parse_space(base, flags: Sequence[str], shared: Sequence[str] = (),
                seed_key: str = "seed") -> dict:
  """`--space` flags as {key: Dist}; ConfigError (one line) on any bad flag."""
  fixed = {item.split("=", 1)[0].strip() for item in shared}
  space: dict[str, Dist] = {}
  for flag in flags:
    key, has_dist, text = flag.partition("=")
    key = key.strip()
    if not has_dist or not key:
      raise ConfigError(f"--space {flag!r}: expected KEY=KIND:ARGS ({_EXAMPLE})")
    if key in space:
      raise ConfigError(f"--space {key}: given twice")
    if key == seed_key:
      raise ConfigError(f"--space {key}: the seed is not searched (every trial runs the "
                        f"config's {key})")
    if key in fixed:
      raise ConfigError(f"--space {key}: also fixed by --set; give it in one place")
    space[key] = parse_dist(base, key, text.strip(), shared)
  if not space:
    raise ConfigError("--search: give the searched keys with --space KEY=KIND:ARGS "
                      f"({_EXAMPLE})")
  return space


def plan(experiment: str, base, space_flags: Sequence[str], *, search: str, trials: int | None,
         shared: Sequence[str] = (), seed_key: str = "seed", sampler_seed: int = 0,
         metric: str | None = None, mode: str | None = None, prune: str = "none") -> Search:
  """Parses and checks a search of `experiment` (the spec its trials are started with), whose
  config without overrides, `base`, the caller loaded; raises ConfigError (one line) on any bad
  input."""
  from jaxdl.sweep import report
  if trials is None:
    raise ConfigError("--search: give the number of trials with --trials N")
  if trials < 1:
    raise ConfigError(f"--trials: expected a count >= 1, got {trials}")
  sampler, startup = parse_sampler(search)
  pruner = parse_pruner(prune)
  if mode not in (None, "min", "max"):
    raise ConfigError(f"--mode {mode!r}: expected min or max")
  base = with_overrides(base, tuple(shared))
  try:
    seed = grid._lookup(base, seed_key)
  except KeyError:
    raise ConfigError(f"--seed-key {seed_key}: the config of {experiment} has no key "
                      f"{seed_key!r}") from None
  train = base.get("train")
  if metric is None:
    evaluates = train is None or parse_train(base).eval_every > 0
    metric = "eval/loss" if evaluates else "train/loss"
  split, key = report.split_metric(metric)
  if split not in ("train", "eval") or not key:
    raise ConfigError(f"--metric {metric!r}: expected train/KEY or eval/KEY (e.g. eval/loss)")
  space = parse_space(base, space_flags, shared, seed_key)
  return Search(experiment, base, tuple(shared), seed_key, seed, space, sampler, startup,
                sampler_seed, f"{split}/{key}", mode or report.default_mode(metric), pruner,
                train.get("steps") if train is not None else None)


# --- the optuna objects (optuna is imported only here, only for a search) ---

def import_optuna():
  """optuna, its INFO lines silenced (the sweep says what happens); ConfigError when missing."""
  try:
    import optuna
  except ImportError:
    raise ConfigError('--search needs optuna: pip install -e ".[sweep]"') from None
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  return optuna


def open_study(optuna, sweep_dir, search: Search):
  """The study in `sweep_dir` (created the first time), with `search`'s direction and pruner;
  call it holding the sweep's lock (`scheduler.sweep_lock`)."""
  from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock, JournalStorage
  path = os.path.join(sweep_dir, STUDY_FILE)
  lock = JournalFileSymlinkLock(path)
  # The caller holds the sweep's lock, so no one else writes the study: a journal lock left by
  # a killed sweep is stale, and waiting out Optuna's grace period for it would stall the rerun.
  # (Without the attribute, Optuna frees it itself after its grace period.)
  stale = getattr(lock, "_lock_file", None)
  if stale and os.path.islink(stale):
    os.unlink(stale)
  storage = JournalStorage(JournalFileBackend(path, lock_obj=lock))
  if search.prune is None:
    pruner = optuna.pruners.NopPruner()
  else:
    percentile, startup, warmup = search.prune
    pruner = optuna.pruners.PercentilePruner(percentile, n_startup_trials=startup,
                                             n_warmup_steps=warmup)
  return optuna.create_study(storage=storage, study_name=STUDY_NAME, load_if_exists=True,
                             direction="minimize" if search.mode == "min" else "maximize",
                             pruner=pruner)


def trial_seed(sampler_seed: int, number: int) -> int:
  """Trial `number`'s sampler seed, a hash of (`sampler_seed`, `number`): not their sum, so two
  sampler seeds never draw the same trials shifted by one."""
  import numpy as np
  return int(np.random.SeedSequence([sampler_seed, number]).generate_state(1)[0])


def seed_sampler(optuna, study, search: Search, number: int) -> None:
  """Trial `number`'s sampler, seeded by `trial_seed`, so its random draws are the same
  whenever it is asked (concurrent runs, interruptions)."""
  seed = trial_seed(search.sampler_seed, number)
  study.sampler = (optuna.samplers.RandomSampler(seed=seed) if search.sampler == "random" else
                   optuna.samplers.TPESampler(n_startup_trials=search.startup, seed=seed))


def suggest(trial, key: str, dist: Dist) -> str:
  """The override text of `trial`'s value of `key` (a value it holds already comes back)."""
  if dist.kind == "choice":
    return trial.suggest_categorical(key, list(dist.choices))
  if dist.kind in ("int", "logint"):
    return str(trial.suggest_int(key, dist.low, dist.high, log=dist.kind == "logint"))
  return repr(trial.suggest_float(key, dist.low, dist.high, log=dist.kind == "loguniform"))
