"""What each run of a SLURM sweep asks for: `jaxdl sweep --executor slurm`'s flags and its
--executor-config file (a JSON, or YAML, object of the same names), checked into `Resources`
before anything is submitted; `jaxdl.sweep.slurm` turns them into sbatch options.

Counts are per run: its GPUs are split evenly over its nodes (sbatch --gpus-per-node), its CPUs
over its processes (--cpus-per-task), its processes over its nodes (--ntasks-per-node); a count
that does not split evenly is refused. The flags given override the file's values; `--sbatch`
options from both are merged, except the ones the sweep sets itself or a flag names.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re

from jaxdl.config import ConfigError

# The flags of `jaxdl sweep --executor slurm`, also the keys of an --executor-config file.
FIELDS = ("partition", "time", "gpus_per_run", "cpus_per_run", "account", "nodes",
          "tasks_per_run", "sbatch")
_COUNTS = ("gpus_per_run", "cpus_per_run", "nodes", "tasks_per_run")
# sbatch options the sweep sets itself: given through --sbatch they would break the array or the
# result files, or contradict a flag.
_OWN = {"array": None, "output": None, "error": None, "open-mode": None, "job-name": None,
        "partition": "--partition", "time": "--time", "account": "--account",
        "nodes": "--nodes", "ntasks": "--tasks-per-run", "ntasks-per-node": "--tasks-per-run",
        "cpus-per-task": "--cpus-per-run", "gpus-per-node": "--gpus-per-run",
        "gpus": "--gpus-per-run"}
_TIME = re.compile(r"^(\d+|\d+:\d{1,2}(:\d{1,2})?|\d+-\d{1,2}(:\d{1,2}(:\d{1,2})?)?|"
                   r"infinite|unlimited)$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Resources:
  """What each run of the sweep asks SLURM for; None: the cluster's default."""
  partition: str | None = None
  time: str | None = None          # sbatch --time: minutes, [D-]HH:MM[:SS], infinite
  gpus_per_run: int | None = None  # over all its nodes
  cpus_per_run: int | None = None  # over all its processes
  account: str | None = None
  nodes: int = 1
  tasks_per_run: int = 1           # processes, over all its nodes (parse: one per node)
  sbatch: tuple = ()               # (option, value) pairs; value True: a bare flag

  @property
  def distributed(self) -> bool:
    return self.nodes > 1 or self.tasks_per_run > 1


def read_config(path) -> dict:
  """An --executor-config file: a JSON object (YAML with a .yaml/.yml name) of FIELDS."""
  path = pathlib.Path(path)
  try:
    text = path.read_text()
  except OSError as e:
    raise ConfigError(f"--executor-config {path}: cannot read it ({e.strerror})") from None
  try:
    if path.suffix in (".yaml", ".yml"):
      import yaml  # only for a YAML file: PyYAML is no dependency of jaxdl
      data = yaml.safe_load(text)
    else:
      data = json.loads(text)
  except ImportError:
    raise ConfigError(f"--executor-config {path}: a YAML file needs PyYAML (pip install pyyaml); "
                      f"or write it as JSON") from None
  except ValueError as e:  # json's and yaml's parse errors
    raise ConfigError(f"--executor-config {path}: not valid "
                      f"{'YAML' if path.suffix in ('.yaml', '.yml') else 'JSON'} "
                      f"({str(e).splitlines()[0]})") from None
  if not isinstance(data, dict):
    raise ConfigError(f"--executor-config {path}: expected an object of {', '.join(FIELDS)}")
  data = {str(k).replace("-", "_"): v for k, v in data.items()}
  unknown = sorted(set(data) - set(FIELDS))
  if unknown:
    raise ConfigError(f"--executor-config {path}: unknown key {unknown[0]!r}; expected one of "
                      f"{', '.join(FIELDS)}")
  if isinstance(data.get("sbatch"), dict):
    data["sbatch"] = [k if v is True else f"{k}={v}" for k, v in data["sbatch"].items()]
  elif data.get("sbatch") is not None and not isinstance(data["sbatch"], list):
    raise ConfigError(f"--executor-config {path}: sbatch: expected an object of sbatch options, "
                      f"got {data['sbatch']!r}")
  return data


def parse_sbatch(items) -> tuple:
  """`--sbatch KEY=VALUE` items (`KEY` alone: a bare flag) as (option, value) pairs."""
  pairs = {}
  for item in items:
    key, has_value, value = str(item).partition("=")
    key = key.strip().lstrip("-")
    if not key or (has_value and not value.strip()):
      raise ConfigError(f"--sbatch {item!r}: expected KEY=VALUE (e.g. qos=high) or a bare KEY "
                        f"(e.g. exclusive)")
    if key.replace("_", "-") in _OWN:
      flag = _OWN[key.replace("_", "-")]
      raise ConfigError(f"--sbatch {key}: " + (f"give it as {flag}" if flag else
                                               "the sweep sets it itself"))
    pairs[key] = value.strip() if has_value else True
  return tuple(pairs.items())


def parse(flags: dict, config_path=None) -> Resources:
  """The runs' resources: the --executor-config file's, overridden by the flags given (None:
  not given; `sbatch` options are merged). ConfigError (one line) on a bad value."""
  given = read_config(config_path) if config_path else {}
  given = {k: v for k, v in given.items() if v is not None}
  sbatch = [*(given.get("sbatch") or []), *(flags.get("sbatch") or [])]
  given.update({k: v for k, v in flags.items() if v is not None and k != "sbatch"})
  for key in _COUNTS:
    value = given.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                              or value < 1):
      raise ConfigError(f"--{key.replace('_', '-')}: expected a count >= 1, got {value!r}")
  for key in ("partition", "account"):
    if given.get(key) is not None and (not isinstance(given[key], str) or not given[key]):
      raise ConfigError(f"--{key}: expected a name, got {given[key]!r}")
  if given.get("time") is not None:
    given["time"] = str(given["time"])
    if not _TIME.match(given["time"]):
      raise ConfigError(f"--time {given['time']!r}: expected minutes, [D-]HH:MM[:SS] or "
                        f"infinite (sbatch --time)")
  given.setdefault("tasks_per_run", given.get("nodes", 1))  # one process per node
  res = Resources(**{**given, "sbatch": parse_sbatch(sbatch)})
  for key, over in (("tasks_per_run", "nodes"), ("gpus_per_run", "nodes"),
                    ("cpus_per_run", "tasks_per_run")):
    value, parts = getattr(res, key), getattr(res, over)
    if value is not None and value % parts:
      raise ConfigError(f"--{key.replace('_', '-')} {value}: must be a multiple of "
                        f"--{over.replace('_', '-')} {parts} (each of its "
                        f"{'nodes' if over == 'nodes' else 'processes'} gets an equal share)")
  return res
