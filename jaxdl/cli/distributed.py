"""`jaxdl train --distributed`: the multi-host flags checked before `jax.distributed.initialize`,
whose own failures are C++ aborts or waits on a coordinator that never answers."""

from __future__ import annotations

import importlib.util
import os
import sys
import threading


def add_arguments(parser) -> None:
  dist = parser.add_argument_group("multi-host")
  dist.add_argument("--distributed", action="store_true",
                    help="call jax.distributed.initialize (auto-detects SLURM, TPU pods, ...)")
  dist.add_argument("--coordinator", help="host:port of process 0")
  dist.add_argument("--num-processes", type=int)
  dist.add_argument("--process-id", type=int)


def check(args) -> str | None:
  """Why the multi-host flags cannot work, as one line, or None."""
  n, pid = args.num_processes, args.process_id
  if n is not None and n < 1:
    return f"--num-processes: must be >= 1, got {n}"
  if pid is not None and n is None:
    return "--process-id: needs --num-processes"
  if pid is not None and not 0 <= pid < n:
    return f"--process-id: must be in 0..{n - 1} for --num-processes {n}, got {pid}"
  if args.coordinator is None and not cluster_may_supply_settings():
    return ("--distributed: no --coordinator HOST:PORT given and no cluster environment "
            "(SLURM, Open MPI, TPU VM) to find one; pass --coordinator, --num-processes and "
            "--process-id")
  if args.coordinator is not None and (n is None or pid is None) and (
      not cluster_may_supply_settings()):
    return ("--coordinator: needs --num-processes and --process-id outside a cluster "
            "environment")
  return None


def cluster_may_supply_settings() -> bool:
  """Whether `jax.distributed.initialize()` may find what the flags leave out itself: a SLURM
  job (SLURM_JOB_ID), an Open MPI launch (OMPI_MCA_orte_hnp_uri) or a Cloud TPU VM (libtpu
  installed), the environments jax detects. Conservative, from public signs only (jax's
  detectors are private): where it says yes, jax decides, and its refusal is one line too
  (`initialize`)."""
  return ("SLURM_JOB_ID" in os.environ or "OMPI_MCA_orte_hnp_uri" in os.environ
          or importlib.util.find_spec("libtpu") is not None)


def initialize(args) -> None:
  """`jax.distributed.initialize` with the flags, under a watchdog that exits 2 with one line
  when the processes do not all connect within JAXDL_DIST_TIMEOUT seconds."""
  import jax
  kwargs = {}
  if args.coordinator:
    kwargs["coordinator_address"] = args.coordinator
  if args.num_processes is not None:
    kwargs["num_processes"] = args.num_processes
  if args.process_id is not None:
    kwargs["process_id"] = args.process_id
  timeout = int(os.environ.get("JAXDL_DIST_TIMEOUT", "120"))
  kwargs["initialization_timeout"] = timeout + 30  # the watchdog below speaks first

  def give_up():
    # jax would abort with a C++ fatal log when a process or the coordinator never answers.
    print(f"jaxdl: error: --distributed: the processes did not all connect through coordinator "
          f"{args.coordinator or '(auto-detected)'} within {timeout} s (JAXDL_DIST_TIMEOUT); "
          f"check that all {args.num_processes or ''} processes were started and that the "
          f"address is reachable", file=sys.stderr, flush=True)
    os._exit(2)

  watchdog = threading.Timer(timeout, give_up)
  watchdog.daemon = True
  watchdog.start()
  try:
    jax.distributed.initialize(**kwargs)
  except ValueError as e:
    # jax fills what the flags leave out from a cluster environment (SLURM, Open MPI, TPU VM)
    # and raises a ValueError, before connecting, for what none supplies.
    from jaxdl.schema import ConfigError
    raise ConfigError(f"--distributed: {str(e).splitlines()[0]} (no cluster environment "
                      "supplies it; pass --coordinator HOST:PORT, --num-processes and "
                      "--process-id)") from None
  finally:
    watchdog.cancel()
