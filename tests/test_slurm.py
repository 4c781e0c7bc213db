"""`jaxdl sweep --executor slurm` and `jaxdl train --distributed` under a real SLURM: a one-node
cluster (slurmctld + slurmd, scripts/slurm_cluster.sh) started once for the module, or found up.
Where its daemons cannot start (not root, no apt, a machine with a SLURM of its own) the cluster
tests skip with the script's one-line reason; the flag checks run everywhere.

On the cluster (slow): the 2 x 2 sweep of moons_mlp:smoke submitted with --no-wait, one of its
runs cancelled by `scancel` mid-run, the rerun waits for the others and resubmits that one, which
resumes and ends bit-identical to the same run trained locally; `srun -n 2 ... --distributed`
(SLURM's variables find the coordinator; gloo CPU collectives) equals 1 process x 2 devices; a
run of two processes is one srun of two tasks, each with its own log.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from jaxdl import cli
from jaxdl.config import ConfigError, load_config
from jaxdl.sweep import grid, resources, scheduler, slurm
from jaxdl.train import run
from jaxdl.train.checkpoint import load_state
from jaxdl.train.writers import read_metrics
from test_sweep_kills import _final  # what a run ends with: summary metrics and eval curve

EXP = "moons_mlp:smoke"
BASE = load_config(EXP)[0]  # the config the CLI hands a sweep (`jaxdl.cli.sweep`)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 40 steps, a checkpoint every 10: the cancelled run has a checkpoint and steps left to resume.
SHARED = ["train.steps=40", "train.ckpt_every=10", "train.eval_every=10", "train.plot=False",
          "train.loggers=()", "train.count_flops=False"]
TIMEOUT_S = 300


def _need_submitit():
  # Not pytest.importorskip: submitit's own import would close pytest's log capture.
  try:
    slurm.import_submitit()
  except ImportError:
    pytest.skip("submitit is not installed (pip install -e '.[slurm]')")


# --- flags and files (no cluster) ---

def test_resources_come_from_a_file_and_the_flags_override_it(tmp_path):
  config = tmp_path / "executor.json"
  config.write_text(json.dumps({"partition": "gpu", "time": "1:00:00", "cpus-per-run": 8,
                                "sbatch": {"qos": "high", "exclusive": True}}))
  res = resources.parse({"time": "30", "tasks_per_run": 2, "sbatch": ["constraint=a100"]},
                        config)
  assert (res.partition, res.time, res.cpus_per_run, res.tasks_per_run) == ("gpu", "30", 8, 2)
  assert res.sbatch == (("qos", "high"), ("exclusive", True), ("constraint", "a100"))
  assert res.distributed and not resources.parse({}).distributed
  plan = grid.plan(EXP, BASE, ["optim.lr=1e-3"])
  record = {"overrides": list(plan.runs[0].overrides)}
  local = scheduler.train_command(plan, record, tmp_path / "w")
  assert slurm.task_command(plan, record, tmp_path / "w", res) == [*local, "--distributed"]
  assert slurm.task_command(plan, record, tmp_path / "w", resources.parse({})) == local


def test_an_executor_config_may_be_yaml(tmp_path):
  pytest.importorskip("yaml")
  config = tmp_path / "executor.yaml"
  config.write_text("partition: gpu\ngpus_per_run: 4\nnodes: 2\nsbatch:\n  qos: high\n")
  res = resources.parse({"nodes": None}, config)
  assert (res.partition, res.gpus_per_run, res.nodes, res.sbatch) == ("gpu", 4, 2,
                                                                       (("qos", "high"),))


@pytest.mark.parametrize("flags, text, message", [
    ({"nodes": 0}, None, r"^--nodes: expected a count >= 1, got 0$"),
    ({"tasks_per_run": 3, "nodes": 2}, None, r"^--tasks-per-run 3: must be a multiple of "
                                             r"--nodes 2"),
    ({"cpus_per_run": 3, "tasks_per_run": 2}, None, r"^--cpus-per-run 3: must be a multiple"),
    ({"time": "soon"}, None, r"^--time 'soon': expected minutes, \[D-\]HH:MM\[:SS\]"),
    ({"sbatch": ["array=0-3"]}, None, r"^--sbatch array: the sweep sets it itself$"),
    ({"sbatch": ["cpus-per-task=4"]}, None, r"^--sbatch cpus-per-task: give it as "
                                            r"--cpus-per-run$"),
    ({"sbatch": ["qos="]}, None, r"^--sbatch 'qos=': expected KEY=VALUE"),
    ({}, '{"partition": "gpu", "gpus": 2}', r"executor\.json: unknown key 'gpus'; expected"),
    ({}, '{"partition": ', r"executor\.json: not valid JSON"),
    ({}, '["gpu"]', r"executor\.json: expected an object of partition, time"),
])
def test_bad_resources_are_one_config_error(tmp_path, flags, text, message):
  config = None
  if text is not None:
    config = tmp_path / "executor.json"
    config.write_text(text)
  with pytest.raises(ConfigError, match=message):
    resources.parse(flags, config)


def test_slurm_flags_without_the_executor_are_refused(tmp_path, capsys):
  out = tmp_path / "sweep"
  assert cli.main(["sweep", EXP, "--partition", "gpu", "--out", str(out)]) == 2
  assert capsys.readouterr().err.strip() == (
      "jaxdl: error: sweep: --partition belongs to --executor slurm")
  assert cli.main(["sweep", EXP, "--executor", "slurm", "--search", "random", "--space",
                   "optim.lr=loguniform:1e-4:1e-1", "--trials", "2", "--out", str(out)]) == 2
  assert "--executor slurm runs a grid" in capsys.readouterr().err
  assert not out.exists()


def test_no_sbatch_is_one_line_naming_the_script(tmp_path, monkeypatch, capsys):
  _need_submitit()
  monkeypatch.setenv("PATH", str(tmp_path))  # no SLURM command on it
  out = tmp_path / "sweep"
  assert cli.main(["sweep", EXP, "--grid", "optim.lr=1e-3", "--executor", "slurm", "--out",
                   str(out)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == ["jaxdl: error: --executor slurm: no sbatch on PATH (this machine is no SLURM "
                 "submit host; `sudo bash scripts/slurm_cluster.sh` starts a one-node cluster "
                 "here)"]
  assert not out.exists()


# --- on a one-node cluster ---

@pytest.fixture(scope="module")
def cluster():
  """The cluster up (the script returns at once when it is), else the module's cluster tests
  skip with its reason."""
  _need_submitit()
  try:
    p = subprocess.run(["bash", os.path.join(REPO, "scripts", "slurm_cluster.sh")],
                       capture_output=True, text=True, timeout=600)
  except (OSError, subprocess.TimeoutExpired) as e:
    pytest.skip(f"scripts/slurm_cluster.sh: {e}")
  if p.returncode != 0:
    pytest.skip((p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1])


def _wait_for(condition, what, poll=0.01, timeout=TIMEOUT_S):
  t0 = time.monotonic()
  while not (found := condition()):
    assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
    time.sleep(poll)
  return found


def _lock_pid(workdir):
  try:
    return json.loads((workdir / ".lock").read_text())["pid"]
  except (OSError, ValueError, KeyError):
    return None  # not there yet, or half written


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


@pytest.mark.slow
def test_a_cancelled_run_resumes_and_the_sweep_ends_with_the_local_results(cluster, tmp_path,
                                                                            capsys):
  """--no-wait submits the array; once a run has its first checkpoint it is held (SIGSTOP, so
  the cancel lands mid-run however fast the toy trains) and `scancel`ed: SLURM's SIGCONT and
  SIGTERM make it save its step and stop. The rerun waits for the three others, submits the
  cancelled one again, and it resumes to the numbers of the same run trained here in one go."""
  out = tmp_path / "sweep"
  command = ["sweep", EXP, "--grid", "optim.lr=1e-3,1e-2", "--seeds", "2", "--executor", "slurm",
             "--out", str(out), *[a for s in SHARED for a in ("--set", s)]]
  assert cli.main([*command, "--no-wait"]) == 0
  assert "4 run(s) in the SLURM queue" in capsys.readouterr().err
  workdirs = [out / "runs" / f"optim.lr={lr},seed={s}" for lr in ("0.001", "0.01") for s in (0, 1)]
  victim, pid = _wait_for(lambda: next(((w, _lock_pid(w)) for w in workdirs if _lock_pid(w)),
                                       None), "a run to start")
  job = json.loads((out / "sweep.json").read_text())["runs"][victim.name]["slurm"]["job"]
  try:
    _wait_for(lambda: (victim / "checkpoints" / "10").is_dir(), "its first checkpoint", 0.001)
    os.kill(pid, signal.SIGSTOP)
    subprocess.run(["scancel", job], check=True, timeout=60)
  finally:
    with contextlib.suppress(ProcessLookupError):
      os.kill(pid, signal.SIGCONT)  # SLURM sends it too; never leave it held
  # The process's exit, not the lock's release: the run lets its lock go before the CLI prints
  # the line read below.
  _wait_for(lambda: not _alive(pid), "the cancelled run to save and stop")
  assert scheduler.lock_holder(victim) is None and not (victim / "summary.json").exists()
  log = (out / "logs" / f"{victim.name}.log").read_text()
  assert "jaxdl: stopped by SIGTERM at step " in log, log[-3000:]
  stopped_at = int(log.split("jaxdl: stopped by SIGTERM at step ")[1].split(";")[0])
  assert 10 <= stopped_at < 40

  assert cli.main(command) == 0
  captured = capsys.readouterr()
  assert captured.out.count("2/0/0/0") == 2, captured.out + captured.err
  assert f"pending  {victim.name}" in captured.err and f"submit   {victim.name}" in captured.err
  idx = json.loads((out / "sweep.json").read_text())
  assert all(r["status"] == "finished" for r in idx["runs"].values())
  assert idx["runs"][victim.name]["attempts"] == 2
  assert {r["attempts"] for n, r in idx["runs"].items() if n != victim.name} == {1}
  resumed = json.loads((victim / "summary.json").read_text())
  assert resumed["start_step"] == stopped_at
  # The resumed run and one run of the other point against the same runs trained here.
  other = next(w for w in workdirs if w.name.split(",")[0] != victim.name.split(",")[0])
  for w in (victim, other):
    config, _ = load_config(EXP, [*SHARED, *idx["runs"][w.name]["overrides"]])
    run(config, tmp_path / f"local-{w.name}", progress=False)
    assert _final(w) == _final(tmp_path / f"local-{w.name}"), w.name


DIST = ["train.plot=False", "train.loggers=()", "train.count_flops=False"]


@pytest.mark.slow
def test_srun_two_processes_equal_one_process_with_two_devices(cluster, tmp_path):
  """`srun -n 2 jaxdl train --distributed`, one CPU device each, against this process on 2 of
  its 4 devices: the same losses and parameters (gloo's sums may round apart: 1e-5)."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  env = dict(os.environ, JAXDL_DIST_TIMEOUT="60",
             XLA_FLAGS=" ".join(flags + ["--xla_force_host_platform_device_count=1"]))
  two = tmp_path / "two"
  p = subprocess.run(["srun", "-n", "2", "--time", "10", sys.executable, "-m", "jaxdl", "train",
                      EXP, "--workdir", str(two), "--no-progress",
                      *[a for s in DIST for a in ("--set", s)], "--distributed"],
                     env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
  assert p.returncode == 0, p.stderr[-3000:]
  steps = load_config(EXP)[0].train.steps
  manifest = json.loads((two / "checkpoints" / str(steps) / "manifest" / "metadata").read_text())
  assert (manifest["process_count"], manifest["device_count"]) == (2, 2)
  config, _ = load_config(EXP, [*DIST, "parallel.devices=2"])
  run(config, tmp_path / "one", progress=False)
  losses = [[r["loss"] for r in read_metrics(w, "train")] for w in (two, tmp_path / "one")]
  assert len(losses[1]) == steps
  np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5, atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5,
                                                       atol=1e-6),
               load_state(two)[1]["params"], load_state(tmp_path / "one")[1]["params"])


@pytest.mark.slow
def test_a_run_of_two_processes_is_one_srun_of_two_tasks(cluster, tmp_path):
  """What `--tasks-per-run 2` submits: one job whose srun starts two tasks, each running the
  command with SLURM's process variables, process 0 into the run's log, process 1 beside it."""
  res = resources.parse({"tasks_per_run": 2, "cpus_per_run": 2, "time": "10"})
  executor = slurm.make_executor(tmp_path / "slurm", res, "jaxdl-test", 1)
  log = tmp_path / "run.log"
  show = "import os; print(os.environ['SLURM_PROCID'], os.environ['SLURM_NTASKS'])"
  job = executor.submit(slurm.run_task, [sys.executable, "-c", show], str(log))
  results = [job.task(k).paths.result_pickle for k in range(2)]
  _wait_for(lambda: all(r.exists() for r in results), "the job's two results")
  assert [o["returncode"] for o in job.results()] == [0, 0]
  assert log.read_text().split() == ["0", "2"]
  assert (tmp_path / "run.log.rank1").read_text().split() == ["1", "2"]


@pytest.mark.slow
def test_an_unknown_partition_is_refused_before_anything(cluster, tmp_path, capsys):
  out = tmp_path / "sweep"
  assert cli.main(["sweep", EXP, "--executor", "slurm", "--partition", "nope", "--out",
                   str(out)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("jaxdl: error: --partition nope: no such partition;")
  assert not out.exists()
