"""Running a sweep on a SLURM cluster through submitit: one array task per run.

Each run is the `jaxdl train` command line the local scheduler would start
(`scheduler.train_command`), run by an array task in the directory the sweep was submitted from,
its output appended to the run's log; so a run on the cluster is the same workdir, the same
bit-exact resume, the same statuses as on this machine. A run with several processes
(`tasks_per_run` > 1 or `nodes` > 1) is started by submitit's `srun` with one task per process
and `--distributed`, and `jaxdl train` finds its coordinator from SLURM's variables
(`jax.distributed.initialize`'s SLURM detection).

The sweep waits for its jobs through the local sweep's scheduler (`scheduler.execute`, each job
standing where a run's process stands), asking `squeue` (jobs still queued or running) and
reading the result each task leaves in DIR/slurm (its exit code, wall and CPU seconds): no
`sacct`, so a cluster without accounting works. sweep.json records each run's job id and last
SLURM state. On a rerun:

  finished  (summary.json) skipped;
  queued or running (its job still in `squeue`) waited for, not submitted again; a job that is
            ending (just cancelled: its run saves its step) is waited out, then counted below;
  failed    (exit 1 or 2) skipped unless `retry_failed`;
  otherwise (never submitted; cancelled, timed out, preempted or lost; stopped by a signal)
            submitted again, and `jaxdl train` resumes it from its checkpoints.
A job that ends unfinished while the sweep waits (`scancel`, a time limit, a node failure) leaves
its run `pending` with the job's state as its error; the sweep names it and exits 1, and the next
rerun submits it again. A run whose process was killed by another signal (SIGKILL: the OOM
killer) is submitted once more at once, as on this machine. SLURM sends SIGTERM 90 s before a
run's time limit (and on `scancel`), so the run saves its current step before it is killed.
Stopping the sweep itself (SIGINT, SIGTERM) stops only the waiting: the jobs keep running, and a
rerun waits for them.

What a run asks for (partition, time, GPUs, CPUs, nodes, processes, other sbatch options) is
`jaxdl.sweep.resources`. The submitting process must see the sweep directory at the same
path as the nodes (a shared filesystem) and the nodes the same Python environment
(`sys.executable`). This module's own imports are light: every array task unpickles `run_task`
from it, and the sweep's other modules import jax (1.9 CPU-s a task); they are imported inside
the functions of the submitting side.
"""

from __future__ import annotations

import os
import pathlib
import resource
import shutil
import subprocess
import sys
import time

from jaxdl.config import ConfigError
from jaxdl.sweep.resources import Resources

# Job states after which nothing of the job runs any more (squeue's long names).
FINAL = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE", "OUT_OF_MEMORY", "REVOKED"}
TERM_BEFORE_LIMIT_S = 90
_POLL_S = 0.5
_LOCK_GRACE_S = 120  # how long a left job's workdir lock may outlive it (another host's lock)
_SUBMITIT_LOG = "SUBMITIT_LOG_LEVEL"
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def import_submitit():
  """submitit, imported without its logging setup: its import calls `logging.config.dictConfig`,
  which closes every logging handler the process has (a test's log capture among them). Its
  array tasks, separate processes, keep it."""
  if "submitit" in sys.modules:
    return sys.modules["submitit"]
  before = os.environ.get(_SUBMITIT_LOG)
  os.environ[_SUBMITIT_LOG] = "NOCONFIG"
  try:
    import submitit
  finally:
    if before is None:
      del os.environ[_SUBMITIT_LOG]
    else:
      os.environ[_SUBMITIT_LOG] = before
  return submitit


def check_cluster(partition: str | None = None) -> None:
  """ConfigError (one line) unless submitit imports, SLURM's commands are on PATH and the
  cluster has `partition` (when given)."""
  try:
    import_submitit()
  except ImportError:
    raise ConfigError("--executor slurm: needs submitit (pip install 'jaxdl[slurm]')") from None
  missing = [c for c in ("sbatch", "squeue", "srun", "sinfo") if shutil.which(c) is None]
  if missing:
    raise ConfigError(f"--executor slurm: no {missing[0]} on PATH (this machine is no SLURM "
                      f"submit host; `sudo bash scripts/slurm_cluster.sh` starts a one-node "
                      f"cluster here)")
  if partition:
    try:
      names = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True,
                             timeout=60, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError) as e:
      raise ConfigError(f"--executor slurm: sinfo failed (is slurmctld up?): "
                        f"{(getattr(e, 'stderr', None) or str(e)).strip()[:200]}") from None
    if partition not in names:
      raise ConfigError(f"--partition {partition}: no such partition; the cluster has "
                        f"{', '.join(sorted(set(names))) or 'none'}")


def run_task(command: list, log: str) -> dict:
  """One process of a run, in its array task: `command` with its output appended to `log` (the
  run's log for process 0, `<log>.rank<k>` for process k); returns its exit code and the wall
  and CPU seconds of this task (the submitit process and the run)."""
  rank = int(os.environ.get("SLURM_PROCID", "0"))
  path = log if rank == 0 else f"{log}.rank{rank}"
  env = dict(os.environ, PYTHONUNBUFFERED="1")  # the log shows how far a killed run got
  cpus = os.environ.get("SLURM_CPUS_PER_TASK")
  for var in _THREAD_VARS:  # no more threads than the CPUs SLURM gave this process
    if cpus:
      try:
        env[var] = str(min(int(env[var]), int(cpus)))
      except (KeyError, ValueError):
        env[var] = cpus
  t0 = time.monotonic()
  with open(path, "a") as f:
    returncode = subprocess.call(command, stdin=subprocess.DEVNULL, stdout=f,
                                 stderr=subprocess.STDOUT, env=env)
  used = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
  return {"returncode": returncode, "seconds": round(time.monotonic() - t0, 2),
          "cpu_s": round(sum(u.ru_utime + u.ru_stime for u in used), 2)}


def task_command(plan, record: dict, workdir, res: Resources) -> list:
  """The run's command in its array task: the local runner's, `--distributed` for a run of
  several processes (each of them finds the others from SLURM's variables)."""
  from jaxdl.sweep import scheduler
  command = scheduler.train_command(plan, record, workdir)
  return [*command, "--distributed"] if res.distributed else command


def queue_states() -> dict[str, str] | None:
  """{job id: state} of this user's jobs slurmctld still knows (array tasks one by one, e.g.
  '12_3'; finished ones for its MinJobAge), or None when squeue fails."""
  try:
    out = subprocess.run(["squeue", "--me", "-h", "-r", "-t", "all", "-o", "%i|%T"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
  except (OSError, subprocess.SubprocessError):
    return None
  return dict(line.split("|", 1) for line in out.split() if "|" in line)


def _default_time(partition: str | None) -> str:
  """The partition's default time limit, else its maximum (sinfo), else 'infinite': submitit
  would otherwise ask for its own default of 5 minutes."""
  cmd = ["sinfo", "-h", "-o", "%P|%L|%l", *(["-p", partition] if partition else [])]
  try:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
  except (OSError, subprocess.SubprocessError):
    return "infinite"
  for line in out.splitlines():
    name, default, maximum = (line.split("|") + ["", ""])[:3]
    if partition or name.endswith("*"):
      return next((t for t in (default, maximum) if t and t != "n/a"), "infinite")
  return "infinite"


def make_executor(folder, res: Resources, name: str, parallelism: int):
  """A submitit executor for `res`: one array task per run, `parallelism` at once."""
  submitit = import_submitit()
  executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
  extra = {"time": res.time or _default_time(res.partition),
           "signal": f"TERM@{TERM_BEFORE_LIMIT_S}", **dict(res.sbatch)}
  params = {"slurm_job_name": name, "slurm_array_parallelism": parallelism,
            "nodes": res.nodes, "tasks_per_node": res.tasks_per_run // res.nodes,
            "slurm_additional_parameters": extra}
  if res.partition:
    params["slurm_partition"] = res.partition
  if res.account:
    params["slurm_account"] = res.account
  if res.cpus_per_run:
    params["cpus_per_task"] = res.cpus_per_run // res.tasks_per_run
  if res.gpus_per_run:
    params["gpus_per_node"] = res.gpus_per_run // res.nodes
  executor.update_parameters(**params)
  return executor


def run(sweep_dir, plan, res: Resources, jobs: int | None = None, retry_failed: bool = False,
        wait: bool = True, echo=print) -> tuple[dict, str]:
  """Submits `plan`'s unfinished runs from `sweep_dir` and (when `wait`) waits for every job,
  through the local sweep's scheduler (`scheduler.execute`: its queue, its judgement of how a
  run ended, a vanished run submitted once more); returns (the index, how it ended: 'done', the
  signal that stopped the waiting, or 'submitted' without `wait`). ValueError (one line) when
  sbatch refuses."""
  from jaxdl.sweep import index as jindex
  from jaxdl.sweep import runner, scheduler
  sweep_dir = pathlib.Path(sweep_dir).resolve()
  with scheduler.invocation(sweep_dir, ("logs", "runs", "slurm")) as preempt:
    index = jindex.merge(jindex.read(sweep_dir), plan)
    states = queue_states()
    if states is None:
      raise ValueError("--executor slurm: squeue failed (is slurmctld up? `sinfo` tells)")
    queue = _Queue(states)
    # Jobs of an earlier invocation first: still queued or running (watched again), or ended
    # (or ending: a cancelled job's run saves its step) while nobody watched: their runs'
    # statuses are settled now, so the cancelled ones are submitted again below.
    adopted = []
    for r in plan.runs:
      record = index["runs"][r.name]
      if record["status"] != jindex.RUNNING or not record.get("slurm"):
        continue
      run = scheduler.Active(r.name, _Job(sweep_dir, index, r.name, queue), None,
                             time.monotonic())
      t0 = time.monotonic()
      while (run.proc.poll() is None and _ending(queue.states, record["slurm"]["job"])
             and time.monotonic() - t0 < _LOCK_GRACE_S):
        time.sleep(_POLL_S)
      if run.proc.returncode is None:
        adopted.append(run)
        continue
      status, error = scheduler.conclude(sweep_dir, index, run)
      record.update(status=status, error=error)
      echo(f"  {status:<8} {r.name}" + (f": {error}" if error else ""))
    watched = [a.name for a in adopted]
    todo, finished, skipped = runner.classify(sweep_dir, plan, index, retry_failed,
                                              skip=watched)
    jindex.write(sweep_dir, index)
    echo(f"jaxdl sweep: {sweep_dir}: {len(plan.runs)} runs: {finished} finished, {skipped} "
         f"failed before{' (--retry-failed reruns them)' if skipped else ''}, "
         f"{len(watched)} in the SLURM queue, {len(todo)} to submit")
    executor = make_executor(sweep_dir / "slurm", res, f"jaxdl-sweep-{sweep_dir.name}",
                             jobs or max(1, len(todo)))

    def launch(pairs):
      names = [name for name, _ in pairs]
      _submit(sweep_dir, plan, index, executor, res, names, echo)
      now = time.monotonic()
      return [scheduler.Active(n, _Job(sweep_dir, index, n, queue, now), None, now)
              for n in names]

    # One slot per run: SLURM queues them all, `jobs` at a time (the array's parallelism).
    slots = [None] * max(1, len(todo) + len(adopted))
    source = runner.GridSource(sweep_dir, index, todo, echo, announce=False)  # `_submit` does
    ended = scheduler.execute(sweep_dir, plan, index, source, slots, preempt, echo, launch,
                              adopted=adopted, leave=True, once=not wait, poll_s=_POLL_S)
    if ended == "submitted":
      held = sum(r["status"] == jindex.RUNNING for r in index["runs"].values())
      echo(f"jaxdl sweep: {held} run(s) in the SLURM queue; rerun the same command to wait for "
           f"them and collect their results")
    return index, ended


class _Queue:
  """squeue's states of this user's jobs, asked at most every `_POLL_S` (one call for all)."""

  def __init__(self, states: dict):
    self.states, self.asked = states, time.monotonic()

  def refresh(self) -> dict:
    if time.monotonic() - self.asked >= _POLL_S:
      states = queue_states()
      if states is not None:  # slurmctld did not answer: ask again later
        self.states, self.asked = states, time.monotonic()
    return self.states


class _Job:
  """A run's SLURM job where the scheduler keeps a run's process: `poll()` is None while it is
  queued or running, else its exit code (a job that left without a result: 128 + SIGTERM, a
  stop, with `error` naming the job's state; a task that raised: 1). Its signals are SLURM's:
  stopping the sweep leaves it running (`scancel` stops it)."""

  def __init__(self, sweep_dir, index, name, queue: _Queue, submitted: float = 0.0):
    self.dir, self.index, self.name, self.queue = sweep_dir, index, name, queue
    self.submitted = submitted  # when this invocation submitted it (0: an earlier one did)
    self.returncode, self.error, self.left_since = None, None, None

  def poll(self):
    states = self.queue.refresh()
    if self.returncode is None and self.queue.asked > self.submitted:  # squeue has seen it
      self.returncode, self.error = _collect(self.dir, self.index, self.name, states, self)
    return self.returncode

  def wait(self):
    return self.returncode

  def send_signal(self, sig) -> None:
    del sig


def _ending(states: dict, job: str) -> bool:
  """Whether `job` is over or ending (COMPLETING: its processes are being stopped)."""
  return states.get(job, "gone") in (*FINAL, "COMPLETING", "gone")


def _submit(sweep_dir, plan, index, executor, res, names, echo) -> None:
  """One sbatch call for `names` (an array when several); their records say so."""
  import datetime
  import shlex

  from jaxdl.sweep import index as jindex
  from jaxdl.sweep import scheduler
  commands = {}
  for name in names:
    record = index["runs"][name]
    commands[name] = task_command(plan, record, sweep_dir / record["workdir"], res)
    now = datetime.datetime.now().isoformat(timespec="seconds")
    with open(sweep_dir / record["log"], "a") as log:  # before the job can write to it
      log.write(f"{scheduler.HEADER}{now} "  # the scheduler's header: its errors read after it
                f"attempt {record['attempts'] + 1} (SLURM): {shlex.join(commands[name])}\n")
  try:
    with executor.batch():
      jobs = [executor.submit(run_task, commands[n], str(sweep_dir / index["runs"][n]["log"]))
              for n in names]
  except Exception as e:  # noqa: BLE001 -- submitit raises sbatch's error as it comes
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    said = [ln for ln in lines if "error" in ln.lower()]
    raise ValueError(f"--executor slurm: sbatch refused the runs: {(said or lines or ['?'])[-1]}")
  for name, job in zip(names, jobs):
    record = index["runs"][name]
    record.update(status=jindex.RUNNING, attempts=record["attempts"] + 1, returncode=None,
                  error=None, git=index["provenance"]["git"],
                  slurm={"job": job.job_id, "tasks": res.tasks_per_run, "state": "PENDING"})
    echo(f"  submit   {name}: SLURM job {job.job_id}")
  jindex.write(sweep_dir, index)


def _collect(sweep_dir, index, name, states, job: _Job) -> tuple[int | None, str | None]:
  """(None, None) while the run's job is queued or running (its state recorded); else (its exit
  code, an error of its own or None): the task's result, or for a job that left without one
  128 + SIGTERM (a stop: a rerun resumes it) and 'SLURM job ... without finishing'."""
  import signal

  from jaxdl.sweep import index as jindex
  from jaxdl.sweep import scheduler
  submitit = import_submitit()
  record = index["runs"][name]
  slurm = record["slurm"]
  state = states.get(slurm["job"], "gone")
  handle = submitit.SlurmJob(folder=sweep_dir / "slurm", job_id=slurm["job"],
                             tasks=tuple(range(slurm["tasks"])))
  results = [handle.task(k).paths.result_pickle for k in range(slurm["tasks"])]
  done = all(p.exists() for p in results)
  if not done and state not in FINAL and state != "gone":
    if state != slurm["state"]:
      slurm["state"] = state
      jindex.write(sweep_dir, index)
    return None, None
  if not done:
    # Left the queue: its processes may still be saving (SIGTERM on scancel); the run is over
    # when no live process holds the workdir, or after a grace period (another host's lock).
    job.left_since = job.left_since or time.monotonic()
    workdir = sweep_dir / record["workdir"]
    if (scheduler.lock_holder(workdir)
        and time.monotonic() - job.left_since < _LOCK_GRACE_S):
      return None, None
    done = all(p.exists() for p in results)
  gone = state == "gone"
  if not gone:  # a task that returned its result: the job ends now
    slurm["state"] = state if state in FINAL or not done else "COMPLETING"
  if done:
    try:
      outs = handle.results()
    except Exception as e:  # noqa: BLE001 -- the task itself raised (it could not start the run)
      return 1, f"SLURM job {slurm['job']}: {_raised(e)}"
    record["cpu_s"] = round(record.get("cpu_s", 0.0) + sum(o["cpu_s"] for o in outs), 2)
    return next((o["returncode"] for o in outs if o["returncode"]), 0), None
  how = f"left the queue (last seen {slurm['state']})" if gone else f"ended {slurm['state']}"
  return (128 + signal.SIGTERM,
          f"SLURM job {slurm['job']} {how} without finishing; a rerun resumes it")


def _raised(error: Exception) -> str:
  """The last line of the traceback submitit reports for a task that raised, at most 300
  characters (its message ends with log paths, after a line of dashes)."""
  lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
  dashes = [i for i, ln in enumerate(lines) if set(ln) == {"-"}]
  body = lines[dashes[-2] + 1:dashes[-1]] if len(dashes) >= 2 else lines
  return (body or ["?"])[-1][:300]
