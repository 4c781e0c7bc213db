"""sweep.json, a sweep directory's index: what was asked, every run's status, provenance.

{
  "experiment": "moons_mlp:smoke", "set": [...shared overrides], "seed_key": "seed",
  "grid": {key: [values]},   the union over invocations, in the order first given
  "seeds": [0, 1],           likewise
  "runs": {name: {point, seed, values, overrides, workdir, log, status, returncode, error,
                  attempts, seconds, git}},
  "provenance": {git, python, versions}   of the latest invocation
}

A run's status is one of `pending` (never started, or stopped before it finished: a rerun
resumes it), `running`, `finished`, `failed`, and in a search's directory `pruned` (stopped by
the pruner: never resumed). A search's index also holds `search`, its settings, and each run its
`trial` number (`jaxdl.sweep.search`). The index is written whole and renamed, so a kill
never leaves it torn; a killed sweep may leave `running` behind, which the next invocation and
the report read against the workdir (`jaxdl.sweep.report.run_status`).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import pathlib
import platform

from jaxdl.config import ConfigError
from jaxdl.sweep.grid import Plan

INDEX = "sweep.json"
PENDING, RUNNING, FINISHED, FAILED = "pending", "running", "finished", "failed"
PRUNED = "pruned"
_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "numpy",
             "ml-collections", "jaxdl")


def read(sweep_dir) -> dict | None:
  """The index, or None when `sweep_dir` holds none; ConfigError when it cannot be read."""
  path = pathlib.Path(sweep_dir) / INDEX
  if not path.exists():
    return None
  try:
    index = json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise ConfigError(f"{path}: not a sweep index ({type(e).__name__}: {e})") from None
  if not isinstance(index, dict) or not isinstance(index.get("runs"), dict):
    raise ConfigError(f"{path}: not a sweep index (no 'runs')")
  return index


def write(sweep_dir, index: dict) -> None:
  """Writes the index whole, then renames it into place."""
  path = pathlib.Path(sweep_dir) / INDEX
  index["updated"] = datetime.datetime.now().isoformat(timespec="seconds")
  tmp = path.with_name(INDEX + ".tmp")
  tmp.write_text(json.dumps(index, indent=2))
  tmp.replace(path)


def merge(index: dict | None, plan: Plan) -> dict:
  """`index` with `plan`'s grid, seeds and runs added (a new index when None); the runs already
  there keep their records. A directory holding a sweep of another experiment or other shared
  overrides is refused: its runs would not be comparable."""
  if index is None:
    index = {"experiment": plan.experiment, "set": list(plan.shared), "seed_key": plan.seed_key,
             "grid": {}, "seeds": [], "runs": {},
             "created": datetime.datetime.now().isoformat(timespec="seconds")}
  if index.get("search"):
    raise ConfigError("--out: the directory holds a search (--search); use another --out for a "
                      "grid")
  for key, ours in (("experiment", plan.experiment), ("set", list(plan.shared)),
                    ("seed_key", plan.seed_key)):
    if index.get(key) != ours:
      flag = {"experiment": "EXPERIMENT", "set": "--set", "seed_key": "--seed-key"}[key]
      raise ConfigError(f"--out: the directory holds a sweep with {flag} {index.get(key)!r}, "
                        f"not {ours!r}; use another --out or the same {flag}")
  for key, values in plan.grid.items():
    known = index["grid"].setdefault(key, [])
    known += [v for v in values if v not in known]
  index["seeds"] = sorted(set(index["seeds"]) | set(plan.seeds))
  for run in plan.runs:
    index["runs"].setdefault(run.name, {
        "point": run.point, "seed": run.seed, "values": run.values,
        "overrides": list(run.overrides), "workdir": f"runs/{run.name}",
        "log": f"logs/{run.name}.log", "status": PENDING, "returncode": None, "error": None,
        "attempts": 0, "seconds": 0.0, "git": None})
  index["provenance"] = provenance()
  return index


_SEARCH_FLAGS = {"experiment": "EXPERIMENT", "set": "--set", "seed_key": "--seed-key",
                 "sampler": "--search", "startup": "--search", "sampler_seed": "--sampler-seed",
                 "metric": "--metric", "mode": "--mode", "space": "--space"}


def merge_search(index: dict | None, search) -> dict:
  """The index of `search`, a `space.Search` (a new one when None); ConfigError when the
  directory holds a grid sweep or a search with other settings (its trials would not be one
  study)."""
  ours = {"experiment": search.experiment, "set": list(search.shared),
          "seed_key": search.seed_key, **search.settings()}
  if index is None:
    index = {"experiment": search.experiment, "set": list(search.shared),
             "seed_key": search.seed_key, "search": search.settings(), "grid": {},
             "seeds": [search.seed], "runs": {},
             "created": datetime.datetime.now().isoformat(timespec="seconds")}
  if not isinstance(index.get("search"), dict):
    raise ConfigError("--out: the directory holds a grid sweep (--grid); use another --out for "
                      "a search")
  theirs = {**{k: index.get(k) for k in ("experiment", "set", "seed_key")}, **index["search"]}
  for key, value in ours.items():
    if theirs.get(key) != value:
      flag = _SEARCH_FLAGS[key]
      raise ConfigError(f"--out: the directory holds a search with {flag} {theirs.get(key)!r} "
                        f"(sweep.json {key}), not {value!r}; use another --out or the same {flag}")
  index["provenance"] = provenance()
  return index


def provenance() -> dict:
  """The git revision of jaxdl's checkout (None outside one) and the library versions."""
  versions = {}
  for name in _PACKAGES:
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      pass
  return {"git": git_revision(pathlib.Path(__file__).resolve().parent),
          "python": platform.python_version(), "versions": versions}


def git_revision(start: pathlib.Path) -> str | None:
  """The commit checked out in the git repository holding `start`, read from its files (no git
  program needed); None when there is none. Uncommitted changes are not seen."""
  for folder in (start, *start.parents):
    git = folder / ".git"
    try:
      if git.is_file():  # a worktree or submodule: `gitdir: PATH`
        git = (folder / git.read_text().split(":", 1)[1].strip()).resolve()
      if not git.is_dir():
        continue
      head = (git / "HEAD").read_text().strip()
      if not head.startswith("ref:"):
        return head  # detached
      ref = head.split(":", 1)[1].strip()
      for base in (git, _common_dir(git)):
        if (base / ref).is_file():
          return (base / ref).read_text().strip()
        packed = base / "packed-refs"
        if packed.is_file():
          for line in packed.read_text().splitlines():
            if line.endswith(" " + ref):
              return line.split()[0]
      return None
    except (OSError, IndexError):
      return None
  return None


def _common_dir(git: pathlib.Path) -> pathlib.Path:
  """A worktree's shared git directory (refs live there), else `git` itself."""
  common = git / "commondir"
  return (git / common.read_text().strip()).resolve() if common.is_file() else git
