"""Experiment trackers beside metrics.jsonl: TensorBoard, Weights & Biases, MLflow.

`train.loggers` names them (default ('tensorboard',)). metrics.jsonl is always written: resume,
the doctor and the plots read it. A tracker receives every record the run writes:

  start(workdir, name, config, manifest)   once, on process 0, before the first step
  log(step, split, metrics)                each train / throughput / watch / eval record
  finish(summary)                          once, with the summary `run` returns

Weights & Biases and MLflow are optional extras (`pip install -e ".[wandb]"`, `".[mlflow]"`);
asking for one that is not installed is a one-line error before anything runs. One that fails to
start (no login, an unreachable server) is a warning and the run goes on without it; one that
fails mid-run is a one-line warning and is dropped (`jaxdl.train.writers.MetricsWriter`), and
metrics.jsonl keeps every record either way. Both honour their own environment (WANDB_MODE=offline,
MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME). Without MLFLOW_TRACKING_URI, MLflow writes to its
documented local store, SQLite, in workdir/mlflow.db with artifacts in workdir/mlartifacts, so
nothing leaves the machine unless asked.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import pathlib
import time
from typing import Callable

from jaxdl.schema import ConfigError

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
      raise ConfigError(f"train.loggers: unknown logger {name!r}; expected some of "
                       f"{', '.join(sorted(TRACKERS))}")
    _, package, extra = TRACKERS[name]
    if package is not None and importlib.util.find_spec(package) is None:
      raise ConfigError(f"train.loggers: {name!r} needs the {package} package: "
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
  """An MLflow run named after the experiment, in MLflow experiment "jaxdl" (or
  MLFLOW_EXPERIMENT_NAME): the flattened config as params (values as `str`), each record as
  metrics "split/key" at its step, the manifest and summary as artifacts manifest.json and
  summary.json; the run ends FINISHED, or KILLED when the summary says `preempted`.

  Through `MlflowClient` rather than `mlflow`'s module-level API: `mlflow.set_tracking_uri` also
  sets MLFLOW_TRACKING_URI in the environment, which would send every later run in the process
  (a sweep, a test) to this run's workdir.
  """

  def start(self, workdir, name, config, manifest):
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH
    uri, artifacts = os.environ.get("MLFLOW_TRACKING_URI"), None
    if not uri:
      # MLflow 3's local default is SQLite (its file store raises unless MLFLOW_ALLOW_FILE_STORE
      # is set); the artifact root is given, else MLflow puts artifacts under the cwd.
      workdir = pathlib.Path(workdir).absolute()
      uri, artifacts = f"sqlite:///{workdir / 'mlflow.db'}", (workdir / "mlartifacts").as_uri()
    self.client = MlflowClient(tracking_uri=uri)
    experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "jaxdl"
    found = self.client.get_experiment_by_name(experiment)
    experiment_id = (found.experiment_id if found is not None else
                     self.client.create_experiment(experiment, artifact_location=artifacts))
    self.run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
    self.client.log_batch(self.run_id, params=[Param(k, str(v)[:MAX_PARAM_VAL_LENGTH])
                                               for k, v in _flat(config).items()])
    self.client.log_dict(self.run_id, manifest, "manifest.json")

  def log(self, step, split, metrics):
    from mlflow.entities import Metric
    now = int(time.time() * 1000)
    self.client.log_batch(self.run_id, metrics=[
        Metric(f"{split}/{k}", v, now, step) for k, v in _finite(metrics).items()])

  def finish(self, summary):
    self.client.log_dict(self.run_id, summary, "summary.json")
    self.client.set_terminated(self.run_id, "KILLED" if summary.get("preempted") else "FINISHED")
