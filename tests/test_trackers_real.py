"""The real trackers (the `test` extra installs them; the file is skipped where one is missing).

One in-process smoke run of moons_mlp feeds MLflow (its default store: SQLite in the workdir) and
W&B (offline) together, behind a tracker that raises on its third record. Each library's own
reader then gives back what the run wrote, compared with the run's own files:

  MLflow   `MlflowClient`: the run's params equal the flattened config.json (as strings), the
           metric history of every key equals metrics.jsonl at every step, and the summary.json
           and manifest.json artifacts (`mlflow.artifacts.load_dict`) equal the run's.
  W&B      wandb has no Python reader for an offline run (`wandb.Api` reads a server only), so its
           CLI's reader of the run's .wandb transaction log: `wandb leet inspect --summary --json`
           (state, config, summary) and `wandb leet inspect --json` (every record, history rows
           among them): the config equals config.json plus the manifest, the history row of each
           step holds exactly that step's metrics.jsonl values, the summary holds the flattened
           summary.json and each metric's last value.
  failing  the run finishes, metrics.jsonl holds every step, the trackers after the failing one
           get every record (the checks above), and the failure is one warning of one line.

The environment is the test's own (monkeypatch): WANDB_MODE=offline and W&B's directories under
tmp_path, no MLFLOW_TRACKING_URI (so the run's workdir holds the store), and a working directory
that must stay empty; nothing is written to the home directory and nothing touches the network.
"""

import json
import logging
import math
import pathlib
import subprocess
import sys

import jax
import pytest

from jaxdl.config import load_config
from jaxdl.train import run, trackers
from jaxdl.train.writers import read_records

EXPERIMENTS = pathlib.Path(__file__).parent.parent / "experiments"
HOME_PATHS = [pathlib.Path.home() / p for p in (".config/wandb", ".cache/wandb",
                                                ".local/share/wandb", ".netrc", "mlruns")]


class FailsOnThird(trackers.Tracker):
  calls = 0

  def log(self, step, split, metrics):
    FailsOnThird.calls += 1
    if FailsOnThird.calls == 3:
      raise RuntimeError("quota exceeded")


def flat(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
  return out


def expected_metrics(workdir):
  """{"split/key": [(step, value), ...]} of metrics.jsonl's finite values, in file order."""
  out = {}
  for r in read_records(workdir / "metrics.jsonl"):
    if "split" not in r:
      continue  # an event (resume, preemption): not a metric
    for k, v in r.items():
      if k not in ("step", "split") and v is not None and math.isfinite(v):
        out.setdefault(f"{r['split']}/{k}", []).append((r["step"], v))
  return out


def wandb_inspect(run_dir, *flags):
  """`wandb leet inspect [flags] --json run_dir`, W&B's reader of a run's .wandb log."""
  out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", *flags, "--json",
                        str(run_dir)], capture_output=True, text=True, timeout=120, check=True)
  return out.stdout


# MLflow 3.17's SQLite store calls an SQLAlchemy 2.1 deprecation: theirs, not this code's.
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")
def test_mlflow_and_wandb_offline_read_back_every_record(tmp_path, monkeypatch, caplog):
  # Imported here, not at collection, where both xdist workers would pay their 1.7 CPU-s.
  mlflow = pytest.importorskip("mlflow")
  wandb = pytest.importorskip("wandb")
  from mlflow.tracking import MlflowClient  # pylint: disable=g-import-not-at-top
  home_before = [p.exists() for p in HOME_PATHS]
  for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_API_KEY", "WANDB_PROJECT",
              "WANDB_ENTITY", "WANDB_RUN_ID", "WANDB_RESUME"):
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
    (tmp_path / var).mkdir()
    monkeypatch.setenv(var, str(tmp_path / var))
  (tmp_path / "cwd").mkdir()
  monkeypatch.chdir(tmp_path / "cwd")   # MLflow's and W&B's fallbacks write to the cwd
  monkeypatch.syspath_prepend(str(EXPERIMENTS))
  monkeypatch.setitem(trackers.TRACKERS, "failing", (FailsOnThird, None, None))
  FailsOnThird.calls = 0
  config, _ = load_config("moons_mlp:smoke", [
      "train.steps=6", "train.eval_every=3", "train.plot=False", "data.batch_size=64",
      "train.loggers=('failing', 'mlflow', 'wandb')"])
  workdir = tmp_path / "w"
  try:
    with caplog.at_level(logging.WARNING, logger="jaxdl"):
      summary = run(config, workdir, progress=False)
  finally:
    wandb.teardown()   # stops W&B's service process, so none outlives the test
  records = read_records(workdir / "metrics.jsonl")
  config_json = json.loads((workdir / "config.json").read_text())
  summary_json = json.loads((workdir / "summary.json").read_text())
  metrics = expected_metrics(workdir)

  # The failing tracker: the run went on, metrics.jsonl holds every step, one one-line warning.
  assert summary["step"] == 6 and not summary["preempted"]
  assert [r["step"] for r in records if r.get("split") == "train"] == [1, 2, 3, 4, 5, 6]
  assert [r["step"] for r in records if r.get("split") == "eval"] == [3, 6]
  failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
  assert failed == ["logger FailsOnThird failed (RuntimeError: quota exceeded); dropped for the "
                    "rest of the run"], caplog.text
  assert "did not start" not in caplog.text, caplog.text

  # MLflow, through its client, from the store in the workdir.
  client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
  experiment = client.get_experiment_by_name("jaxdl")
  (mlrun,) = client.search_runs([experiment.experiment_id])
  assert (mlrun.info.run_name, mlrun.info.status) == ("moons_mlp", "FINISHED")
  assert mlrun.info.artifact_uri.startswith((workdir / "mlartifacts").as_uri())
  assert mlrun.data.params == {k: str(v) for k, v in flat(config_json).items()}
  assert set(mlrun.data.metrics) == set(metrics)
  for key, points in metrics.items():
    history = sorted((m.step, m.value) for m in client.get_metric_history(mlrun.info.run_id, key))
    assert [s for s, _ in history] == [s for s, _ in points], key
    assert [v for _, v in history] == pytest.approx([v for _, v in points], rel=1e-12), key
  artifacts = mlrun.info.artifact_uri
  assert mlflow.artifacts.load_dict(f"{artifacts}/summary.json") == summary_json
  manifest = mlflow.artifacts.load_dict(f"{artifacts}/manifest.json")
  assert manifest["jax"] == jax.__version__ and manifest["device_count"] == jax.device_count()

  # W&B, through its reader of the offline run's transaction log.
  (run_dir,) = (workdir / "wandb").glob("offline-run-*")
  state = json.loads(wandb_inspect(run_dir, "--summary"))
  assert (state["state"], state["exit_code"], state["name"], state["project"]) == (
      "finished", 0, "moons_mlp", "jaxdl")
  assert state["config"] == {**config_json, "manifest": manifest}
  rows = {}
  for line in wandb_inspect(run_dir).splitlines():
    record = json.loads(line)
    if record["type"] == "history":
      step = int(record["history"]["step"]["num"])
      assert step not in rows, f"two history rows at step {step}"
      rows[step] = {k: v for k, v in record["history"]["item"].items() if not k.startswith("_")}
  expected_rows = {}
  for key, points in metrics.items():
    for step, value in points:
      expected_rows.setdefault(step, {})[key] = value
  assert sorted(rows) == sorted(expected_rows)
  for step, row in expected_rows.items():
    assert rows[step] == pytest.approx(row, rel=1e-12), step
  final = {k: float(v) for k, v in flat(summary_json).items()
           if isinstance(v, (int, float)) and math.isfinite(v)}
  final.update({key: points[-1][1] for key, points in metrics.items()})
  got = {k: v for k, v in state["summary"].items() if not k.startswith("_")}
  assert got == pytest.approx(final, rel=1e-12)

  # Nothing outside tmp_path: the cwd stays empty, the home directory gains no tracker files.
  assert list((tmp_path / "cwd").iterdir()) == []
  assert [p.exists() for p in HOME_PATHS] == home_before
