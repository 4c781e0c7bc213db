"""Multi-host: 2 processes x 2 emulated CPU devices (jax.distributed on 127.0.0.1, gloo CPU
collectives) against 1 process x 4 devices: same losses and parameters, checkpoints that restore
on the other layout, the process count in the manifest, and a clear error when no coordinator
answers.

The 2-process runs are real `python -m jaxdl train ... --distributed` processes (two jobs of
two processes each, run at once, forked from tests/warm_python.py's warm interpreter); every
one is killed in a `finally`.
"""

import json
import os
import shutil
import socket
import sys

import jax
import numpy as np
import pytest

from jaxdl.config import load_config
from jaxdl.train import run
from jaxdl.train.checkpoint import load_state
from jaxdl.train.writers import read_metrics

import warm_python

STEPS = 8
OVERRIDES = ["data.batch_size=200", f"train.steps={STEPS}", "train.eval_every=4",
             "train.ckpt_every=4", "train.plot=False", "optim.lr=0.01"]
TIMEOUT_S = 240

pytestmark = pytest.mark.slow


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(timeout: int = 60) -> dict:
  """The test environment (conftest's XLA flags) with 2 devices per process instead of 4."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  return dict(os.environ, JAX_PLATFORMS="cpu", OMP_NUM_THREADS="1",
              JAXDL_DIST_TIMEOUT=str(timeout),
              XLA_FLAGS=" ".join(flags + ["--xla_force_host_platform_device_count=2"]))


def _command(workdir, port: int, process_id: int) -> list[str]:
  sets = [a for o in OVERRIDES for a in ("--set", o)]
  return [sys.executable, "-m", "jaxdl", "train", "moons_mlp:plain", "--workdir", str(workdir),
          "--no-progress", *sets, "--distributed", "--coordinator", f"127.0.0.1:{port}",
          "--num-processes", "2", "--process-id", str(process_id)]


def _launch_jobs(workdirs) -> dict:
  """Runs one 2-process training job per workdir, all at once; returns {workdir: [outputs]}."""
  procs = []
  try:
    for workdir in workdirs:
      port = _free_port()
      for i in range(2):
        procs.append((workdir, warm_python.Popen(_command(workdir, port, i), env=_env())))
    outputs = {w: [] for w in workdirs}
    for workdir, p in procs:
      out, err = p.communicate(timeout=TIMEOUT_S)
      assert p.returncode == 0, f"{workdir}: exit {p.returncode}\n{err[-3000:]}"
      outputs[workdir].append(out)
    return outputs
  finally:
    for _, p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()


def _summary(stdout: str) -> dict:
  return json.loads(stdout[stdout.index("{"):])


def _one_process(workdir) -> dict:
  config, _ = load_config("moons_mlp:plain", OVERRIDES)
  return run(config, workdir, progress=False)


def _resume_copy(src, dst):
  """A copy of run `src` whose latest checkpoint is removed: resuming it starts at step 4."""
  shutil.copytree(src, dst)
  shutil.rmtree(dst / "checkpoints" / str(STEPS))
  return dst


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  assert jax.device_count() == 4 and jax.process_count() == 1
  tmp = tmp_path_factory.mktemp("dist")
  _one_process(tmp / "one")                                # 1 process x 4 devices
  from_one = _resume_copy(tmp / "one", tmp / "one_then_two")
  outputs = _launch_jobs([tmp / "two", from_one])          # 2 processes x 2 devices
  from_two = _resume_copy(tmp / "two", tmp / "two_then_one")
  resumed_on_one = _one_process(from_two)
  return tmp, outputs, resumed_on_one


def _params(workdir):
  return load_state(workdir)[1]["params"]


def _close(a, b):
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_two_processes_match_one_process(runs):
  tmp, outputs, _ = runs
  losses_one = [r["loss"] for r in read_metrics(tmp / "one", "train")]
  losses_two = [r["loss"] for r in read_metrics(tmp / "two", "train")]
  assert len(losses_one) == STEPS
  np.testing.assert_allclose(losses_two, losses_one, rtol=1e-5, atol=1e-6)
  jax.tree.map(_close, _params(tmp / "two"), _params(tmp / "one"))
  # Both processes report the same final metrics (process 0 logs; all take part).
  first, second = (_summary(o) for o in outputs[tmp / "two"])
  assert first["train"] == second["train"] and first["step"] == STEPS


def test_manifest_records_process_count(runs):
  tmp, _, _ = runs
  manifest = json.loads((tmp / "two" / "checkpoints" / str(STEPS) / "manifest" / "metadata")
                        .read_text())
  assert manifest["process_count"] == 2 and manifest["local_device_count"] == 2
  assert manifest["device_count"] == 4


def test_checkpoint_from_one_process_restores_on_two(runs):
  tmp, outputs, _ = runs
  assert all(_summary(o)["start_step"] == STEPS // 2 for o in outputs[tmp / "one_then_two"])
  jax.tree.map(_close, _params(tmp / "one_then_two"), _params(tmp / "one"))


def test_checkpoint_from_two_processes_restores_on_one(runs):
  tmp, _, resumed = runs
  assert resumed["start_step"] == STEPS // 2
  jax.tree.map(_close, _params(tmp / "two_then_one"), _params(tmp / "two"))


def test_unanswered_coordinator_is_a_clear_error(tmp_path):
  # Process 1 of 2 with nobody listening at the coordinator's port.
  p = warm_python.Popen(_command(tmp_path / "w", _free_port(), 1), env=_env(timeout=2))
  try:
    _, err = p.communicate(timeout=120)
  finally:
    if p.poll() is None:
      p.kill()
      p.wait()
  assert p.returncode == 2
  assert "did not all connect through coordinator 127.0.0.1:" in err
  assert "within 2 s (JAXDL_DIST_TIMEOUT)" in err
  assert not (tmp_path / "w").exists()


def test_no_coordinator_and_no_cluster_is_one_line_exit_2_before_anything_is_written(
    tmp_path, capsys, monkeypatch):
  """`--distributed` with nothing to find the coordinator from (no flag, no SLURM / Open MPI /
  TPU environment): one line, exit 2, no workdir, before jax is asked (in this process jax has
  long computed, which `jax.distributed.initialize` refuses with a RuntimeError of its own)."""
  from jaxdl import cli
  for var in [v for v in os.environ if v.startswith(("SLURM_", "OMPI_", "TPU_"))]:
    monkeypatch.delenv(var)
  workdir = tmp_path / "w"
  assert cli.main(["train", "moons_mlp:smoke", "--workdir", str(workdir), "--distributed"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("jaxdl: error: --distributed: "), err
  assert "--coordinator HOST:PORT" in err[0] and not workdir.exists()
