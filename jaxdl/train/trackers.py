"""Experiment trackers beside metrics.jsonl: TensorBoard, Weights & Biases, MLflow.

`train.loggers` names them (default ('tensorboard',)). metrics.jsonl is always written: resume,
the doctor and the plots read it. A tracker receives every record the run writes:

  start(workdir, name, config, manifest)   once, on process 0, before the first step
  log(step, split, metrics)                each train / throughput / watch / eval record
  finish(summary)                          once, with the summary `run` returns

Weights & Biases and MLflow are optional extras (`pip install -e ".[wandb]"`, `".[mlflow]"`);
asking for one that is not installed is a one-line error before anything runs. One that fails to
start (no login, an unreachable server) is a warning and the run goes on without it. Both honour
their own environment (WANDB_MODE=offline, MLFLOW_TRACKING_URI; MLflow defaults to a file store
in workdir/mlruns, so nothing leaves the machine unless asked).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import pathlib
from typing import Callable

log = logging.getLogger("jaxdl")


class Tracker:
  """No-op base; a tracker overrides what it records."""

  def start(self, workdir, name: str, config: dict, manifest: dict) -> None:
    del workdir, name, config, manifest

  def log(self, step: int, split: str, metrics: dict) -> None:
    del step, split, metrics

  def finish(self, summary: dict) -> None:
    del summary


# name -> (factory, the package it imports or None, the pyproject extra that installs it)
TRACKERS: dict[str, tuple[Callable[[], Tracker], str | None, str | None]] = {}


def register_tracker(name: str, package: str | None = None, extra: str | None = None):
  """Registers `factory() -> Tracker` as `train.loggers` name `name`."""

  def wrap(factory):
    TRACKERS[name] = (factory, package, extra)
    return factory

  return wrap


def check(names) -> None:
  """Refuses unknown names and trackers whose package is missing (one line naming the extra)."""
  for name in names:
    if name not in TRACKERS:
      raise ValueError(f"train.loggers: unknown logger {name!r}; expected some of "
                       f"{', '.join(sorted(TRACKERS))}")
    _, package, extra = TRACKERS[name]
    if package is not None and importlib.util.find_spec(package) is None:
      raise ValueError(f"train.loggers: {name!r} needs the {package} package: "
                       f"pip install -e \".[{extra}]\"")


def start(names, workdir, name: str, config: dict, manifest: dict) -> list[Tracker]:
  """The started trackers of `names` ('tensorboard' is the metrics writer's own); a tracker
  that fails to start is left out with a warning."""
  out = []
  for logger in names:
    if logger == "tensorboard":
      continue
    try:
      tracker = TRACKERS[logger][0]()
      tracker.start(workdir, name, config, manifest)
    except Exception as e:  # noqa: BLE001 -- a tracker must never cost the run
      log.warning("train.loggers: %s did not start (%s: %s); training goes on without it",
                  logger, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
      continue
    out.append(tracker)
  return out


def _flat(tree: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _finite(metrics: dict) -> dict:
  return {k: float(v) for k, v in metrics.items()
          if isinstance(v, (int, float)) and math.isfinite(float(v))}


register_tracker("tensorboard")(Tracker)  # written by `jaxdl.train.writers.MetricsWriter`


@register_tracker("wandb", package="wandb", extra="wandb")
class WandbTracker(Tracker):
  """A W&B run named after the experiment, its config and manifest as the run config."""

  def start(self, workdir, name, config, manifest):
    import wandb
    self.run = wandb.init(project="jaxdl", name=name, dir=str(workdir),
                          config={**config, "manifest": manifest})

  def log(self, step, split, metrics):
    self.run.log({f"{split}/{k}": v for k, v in _finite(metrics).items()}, step=step)

  def finish(self, summary):
    self.run.summary.update(_finite(_flat(summary)))
    self.run.finish()


@register_tracker("mlflow", package="mlflow", extra="mlflow")
class MlflowTracker(Tracker):
  """An MLflow run: the flattened config as params, the manifest and summary as artifacts."""

  def start(self, workdir, name, config, manifest):
    import mlflow
    if not os.environ.get("MLFLOW_TRACKING_URI"):
      mlflow.set_tracking_uri((pathlib.Path(workdir) / "mlruns").absolute().as_uri())
    self.mlflow = mlflow
    self.run = mlflow.start_run(run_name=name)
    mlflow.log_params({k: str(v)[:500] for k, v in _flat(config).items()})
    mlflow.log_dict(manifest, "manifest.json")

  def log(self, step, split, metrics):
    self.mlflow.log_metrics({f"{split}/{k}": v for k, v in _finite(metrics).items()}, step=step)

  def finish(self, summary):
    self.mlflow.log_dict(summary, "summary.json")
    self.mlflow.end_run()
