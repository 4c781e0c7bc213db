"""Trackers (`train.loggers`): the interface with a fake tracker, failures that must not cost
the run, and the one-line errors. The real wandb and mlflow, read back through their own readers,
are test_trackers_real.py's; a run feeding a tracker end to end, and the CLI's exit 2 on a bad
name, are in test_throughput.py's CLI test."""

import importlib.util
import logging

import pytest

from jaxdl.train import trackers
from jaxdl.train.writers import MetricsWriter, read_metrics


class Recording(trackers.Tracker):
  def start(self, workdir, name, config, manifest):
    self.started = (name, config, manifest)
    self.records, self.summary = [], None

  def log(self, step, split, metrics):
    self.records.append((step, split, dict(metrics)))

  def finish(self, summary):
    self.summary = summary


class Broken(trackers.Tracker):
  def start(self, workdir, name, config, manifest):
    raise ConnectionError("no server")


class BreaksLater(Recording):
  def log(self, step, split, metrics):
    raise RuntimeError("quota exceeded")


@pytest.fixture
def registered():
  saved = dict(trackers.TRACKERS)
  for name, cls in (("recording", Recording), ("broken", Broken), ("breaks", BreaksLater)):
    trackers.register_tracker(name)(cls)
  yield
  trackers.TRACKERS.clear()
  trackers.TRACKERS.update(saved)


def test_trackers_get_every_record_and_failures_are_warnings(tmp_path, registered, caplog):
  with caplog.at_level(logging.WARNING, logger="jaxdl"):
    started = trackers.start(("tensorboard", "recording", "broken", "breaks"), tmp_path, "exp",
                             {"seed": 0}, {"devices": 1})
  assert [type(t) for t in started] == [Recording, BreaksLater]
  assert "broken did not start (ConnectionError: no server)" in caplog.text
  writer = MetricsWriter(tmp_path, tensorboard=False, trackers=started)
  with caplog.at_level(logging.WARNING, logger="jaxdl"):
    writer.write(1, "train", {"loss": 0.5})
    writer.write(2, "eval", {"loss": 0.25, "accuracy": 1.0})
  writer.finish({"step": 2})
  writer.close()
  rec = started[0]
  assert rec.started == ("exp", {"seed": 0}, {"devices": 1})
  assert rec.records == [(1, "train", {"loss": 0.5}), (2, "eval", {"loss": 0.25, "accuracy": 1.0})]
  assert rec.summary == {"step": 2}
  assert "quota exceeded" in caplog.text and writer.trackers == []   # dropped after failing
  assert [r["loss"] for r in read_metrics(tmp_path, "eval")] == [0.25]  # jsonl unaffected
  assert not (tmp_path / "tensorboard").exists()


def test_bad_logger_names_and_missing_packages_are_one_line_errors(monkeypatch):
  with pytest.raises(ValueError, match=r"^train.loggers: unknown logger 'tensorbord'"):
    trackers.check(("tensorbord",))
  # The test extra installs both packages; the check is what a user without them meets.
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
  for name in ("wandb", "mlflow"):
    with pytest.raises(ValueError, match=rf'needs the {name} package: pip install -e ".\[{name}'):
      trackers.check((name,))


def test_a_tracker_failing_with_a_long_error_is_one_warning_line_and_loses_no_record(
    tmp_path, caplog):
  class Verbose:
    def log(self, step, split, metrics):
      raise RuntimeError("store unreachable\nTraceback (remote):\n  line 1\n  line 2")

  writer = MetricsWriter(tmp_path, tensorboard=False, trackers=[Verbose()])
  with caplog.at_level("WARNING"):
    for step in (1, 2):
      writer.write(step, "train", {"loss": 1.0 / step})
  (message,) = [r.getMessage() for r in caplog.records if "Verbose" in r.getMessage()]
  assert message == ("logger Verbose failed (RuntimeError: store unreachable); dropped for the "
                     "rest of the run")
  assert [r["step"] for r in read_metrics(tmp_path, "train")] == [1, 2] and not writer.trackers
