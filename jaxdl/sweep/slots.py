"""What each concurrent run of a local sweep gets, and how its process takes it.

A slot is a share of the sweep's CPUs (pinned by affinity, the OpenMP/BLAS thread variables set
to the share) and, where GPUs are visible, one GPU (`CUDA_VISIBLE_DEVICES`; round-robin, without
preallocation, when there are more slots than GPUs).

The run's process applies its slot itself, first thing (`enter_slot`, called by `jaxdl.cli.main`
when `PARENT_VAR` is set, before the library is imported): the CPUs to pin and the sweep's pid
travel in its environment (`child_env`). The sweep does not set them between fork and exec
(`Popen`'s `preexec_fn`): a process that has started jax holds native threads, and Python code
run in a forked copy of it may deadlock on a lock one of them held (Python warns of it; the sweep
is called from notebooks and tests where jax runs). With the environment the sweep starts its
runs by a plain fork-exec, each in a session of its own (`start_new_session`, done by the C code
between fork and exec).

On Linux the run asks the kernel for SIGTERM when the sweep dies (`PR_SET_PDEATHSIG`), so even a
SIGKILLed sweep stops its runs cleanly, each saving its current step. A sweep that died before
the request is seen at once: the run's parent is no longer the sweep, and it stops itself.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import sys

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
CPUS_VAR = "JAXDL_SWEEP_CPUS"  # the slot's CPUs, comma-separated
PARENT_VAR = "JAXDL_SWEEP_PARENT"  # the sweep's pid
_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass(frozen=True)
class Slot:
  """What one concurrent run gets: CPUs to pin (None: all, shared), thread count, a GPU."""
  cpus: tuple | None
  threads: int
  gpu: str | None
  gpu_shared: bool

  def describe(self) -> dict:
    """What the run got, for its record in sweep.json (its thread count decides which CPU
    kernels XLA picks: a run of `--jobs J` > 1 may differ from the same command run alone in
    the last bits)."""
    return {"cpus": list(self.cpus) if self.cpus else None, "threads": self.threads,
            "gpu": self.gpu}


def visible_gpus() -> list[str]:
  """The GPU ids a child may be given: `CUDA_VISIBLE_DEVICES` when set, else the NVIDIA driver's
  GPUs (none where there is no driver). Read without jax, which would take GPU memory here."""
  env = os.environ.get("CUDA_VISIBLE_DEVICES")
  if env is not None:
    return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
  try:
    return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
  except OSError:
    return []


def make_slots(jobs: int, cpus=None, gpus=None) -> list[Slot]:
  """`jobs` slots splitting `cpus` (default: this process's affinity) into equal disjoint
  shares, and one GPU each from `gpus` (default `visible_gpus()`)."""
  if cpus is None:
    cpus = (sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else list(range(os.cpu_count() or 1)))
  gpus = visible_gpus() if gpus is None else list(gpus)
  share = len(cpus) // jobs
  return [Slot(cpus=tuple(cpus[i * share:(i + 1) * share]) if share else None,
               threads=max(1, share), gpu=gpus[i % len(gpus)] if gpus else None,
               gpu_shared=bool(gpus) and jobs > len(gpus)) for i in range(jobs)]


def child_env(slot: Slot, base: dict | None = None) -> dict:
  """The environment of a run in `slot`: thread variables at most its CPU share, its GPU, and
  what `enter_slot` applies in the run (its CPUs, this sweep's pid)."""
  env = dict(os.environ if base is None else base)
  for var in _THREAD_VARS:
    try:
      env[var] = str(min(int(env[var]), slot.threads))
    except (KeyError, ValueError):
      env[var] = str(slot.threads)
  if slot.gpu is not None:
    env["CUDA_VISIBLE_DEVICES"] = slot.gpu
    if slot.gpu_shared:  # several runs on one GPU: none may take most of its memory up front
      env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  env.pop(CPUS_VAR, None)
  if slot.cpus:
    env[CPUS_VAR] = ",".join(map(str, slot.cpus))
  env[PARENT_VAR] = str(os.getpid())
  env["PYTHONUNBUFFERED"] = "1"  # the log shows how far a killed run got
  return env


def _prctl():
  """libc's prctl, or None off Linux."""
  if not sys.platform.startswith("linux"):
    return None
  try:
    return ctypes.CDLL(None, use_errno=True).prctl
  except (OSError, AttributeError):
    return None


def enter_slot(environ=None) -> None:
  """In a run a sweep started: pins this process to its slot's CPUs and asks for SIGTERM when the
  sweep dies (stopping now if it has died already). Takes both variables out of `environ` (the
  process's environment), so a process this run starts does not act on them; with neither set
  it does nothing. Called before jax is imported, so XLA sizes its thread pools to the CPUs."""
  environ = os.environ if environ is None else environ
  cpus, parent = environ.pop(CPUS_VAR, None), environ.pop(PARENT_VAR, None)
  if cpus and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, [int(c) for c in cpus.split(",")])
  prctl = _prctl() if parent else None
  if prctl is not None:
    prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):  # the sweep died before the request
      os.kill(os.getpid(), signal.SIGTERM)
