"""Non-finite state is never saved, logs survive a torn line, a full disk is one line (issue 13).

In-process and tiny: moons_mlp, 200-row batches, at most 20 steps.
"""

import errno
import json
import logging
import math
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdl import cli
from jaxdl.config import load_config
from jaxdl.doctor.diagnoses import diagnose_workdir
from jaxdl import train
from jaxdl.train import loop, run, step as jstep, writers
from jaxdl.train.checkpoint import Checkpointer, load_state
from jaxdl.train.step import TrainState

TINY = ["train.steps=20", "train.plot=False", "data.batch_size=200"]


def _config(*overrides):
  return load_config("moons_mlp", [*TINY, *overrides])[0]


def _all_finite(tree) -> bool:
  return all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(tree))


class _Records(logging.Handler):
  def __init__(self):
    super().__init__()
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage())


def test_huge_lr_stops_on_grad_norm_and_saves_no_nonfinite_state(tmp_path):
  # lr 1e6: the loss stays finite while |g| overflows (and Adam's second moment with it).
  with pytest.raises(train.NonFiniteLossError) as e:
    run(_config("optim.lr=1e6", "train.ckpt_every=1"), tmp_path, progress=False)
  assert e.value.what in ("grad_norm", "state") and e.value.what in str(e.value).replace(
      "parameters / optimizer state", "state")
  steps = Checkpointer(tmp_path / "checkpoints").all_steps()
  assert steps and max(steps) < e.value.step
  for s in steps:
    assert _all_finite(load_state(tmp_path, s)[1])


# The overflow is the point: numpy warns as the 1e39 learning rate becomes float32.
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_step_reports_a_nonfinite_state_with_finite_loss_and_gradients():
  # d loss / d p = 1, and an lr of 1e39 overflows float32 in the update alone.
  params = {"p": jnp.ones([])}
  state = TrainState(step=jnp.zeros([], jnp.int32), params=params,
                     opt_state=optax.sgd(1e39).init(params), model_state={})
  loss_fn = lambda apply_fn, params, model_state, batch, rngs, train: (  # noqa: E731
      params["p"], ({}, model_state))
  step = jstep.make_train_step(None, loss_fn, optax.sgd(1e39), lambda s: 1e39,
                               jax.random.PRNGKey(0), jit=True)
  _, metrics = step(state, {})
  metrics = {k: float(v) for k, v in metrics.items()}
  assert metrics["grad_norm"] == 1.0 and metrics["state_finite"] == 0.0
  assert train.NonFiniteLossError.find(metrics) == "state"


def test_fp16_skipped_step_is_not_a_failure():
  # Loss scaling reports grads_finite: an overflowing (skipped) step keeps the old state.
  skipped = {"loss": 0.7, "grad_norm": math.inf, "grads_finite": 0.0, "state_finite": 1.0}
  assert train.NonFiniteLossError.find(skipped) is None
  assert train.NonFiniteLossError.find({**skipped, "loss": math.nan}) == "loss"
  assert train.NonFiniteLossError.find({"loss": 0.7, "grad_norm": math.inf}) == "grad_norm"


def test_torn_metrics_line_is_skipped_once_and_a_resumed_run_appends_after_it(tmp_path):
  run(_config("train.steps=4", "train.ckpt_every=2", "train.log_every=1"), tmp_path,
      progress=False)
  path = tmp_path / "metrics.jsonl"
  with path.open("a") as f:
    f.write('{"step": 5, "split": "tr')  # a crash mid-write
  torn_line = len(path.read_text().splitlines())
  handler = _Records()
  logging.getLogger("jaxdl").addHandler(handler)
  try:
    run(_config("train.steps=8", "train.ckpt_every=2", "train.log_every=1"), tmp_path,
        progress=False)
    train = writers.read_metrics(tmp_path, "train")
    diagnose_workdir(tmp_path)
    writers.read_metrics(tmp_path, "eval")
  finally:
    logging.getLogger("jaxdl").removeHandler(handler)
  assert [r["step"] for r in train] == list(range(1, 9))
  warned = [m for m in handler.messages if "torn" in m]
  assert warned == [f"{path}:{torn_line} is not a complete JSON record (a torn write?); skipped"]


def test_nonfinite_values_are_written_as_null(tmp_path, monkeypatch, capsys):
  w = writers.MetricsWriter(tmp_path, enabled=True)
  w.write(3, "train", {"loss": 0.5, "grad_norm": float("inf"), "x": np.float32("nan")})
  w.close()
  line = (tmp_path / "metrics.jsonl").read_text()
  assert json.loads(line) == {"step": 3, "split": "train", "loss": 0.5, "grad_norm": None,
                              "x": None}
  # The CLI's summary: a non-finite metric prints as null, never as Infinity.
  monkeypatch.setattr(loop, "run", lambda *a, **k: {"step": 20, "train": {
      "grad_norm": np.float32("inf"), "loss": 0.1}, "eval": {"loss": float("nan")}})
  assert cli.main(["train", "moons_mlp", "--workdir", str(tmp_path / "w"), "--no-progress"]) == 0
  summary = json.loads(capsys.readouterr().out)
  assert summary["train"]["grad_norm"] is None and summary["eval"]["loss"] is None


def _full_disk_after(n_writes: int):
  """A stand-in for `os` in jaxdl.train.writers whose write fails with ENOSPC from the n-th on."""
  calls = {"n": 0}

  def write(fd, data):
    calls["n"] += 1
    if calls["n"] >= n_writes:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return os.write(fd, data)

  fake = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
  fake.write = write
  return fake


def test_full_disk_during_training_is_one_line_exit_1_and_keeps_the_checkpoint(
    tmp_path, monkeypatch, capsys):
  # Steps 1..12 fit (a train record each, and a throughput record from step 2 on): past step 10.
  monkeypatch.setattr(writers, "os", _full_disk_after(24))
  workdir = tmp_path / "w"
  rc = cli.main(["train", "moons_mlp", "--workdir", str(workdir), "--no-progress",
                 *[f"--set={kv}" for kv in (*TINY, "train.ckpt_every=5", "train.log_every=1")]])
  err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
  assert rc == 1
  assert len(err) == 1 and "no space left on device" in err[0], err
  assert str(workdir / "metrics.jsonl") in err[0]
  step, state = load_state(workdir)
  assert step == 10 and _all_finite(state)
