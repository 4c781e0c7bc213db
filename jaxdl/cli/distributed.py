"""`jaxdl train --distributed`: the multi-host flags checked before `jax.distributed.initialize`,
whose own failures are C++ aborts or waits on a coordinator that never answers."""

from __future__ import annotations

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


def cluster_detected() -> bool:
  """Whether jax.distributed.initialize can find the coordinator itself (SLURM, Open MPI,
  TPU VMs), using jax's own detectors minus the opt-in ones."""
  try:
    from jax._src import clusters
    return any(env.is_env_present() for env in clusters.ClusterEnv._cluster_types
               if not getattr(env, "opt_in_only_method", None)
               and env.__name__ not in ("Mpi4pyCluster", "K8sCluster"))
  except Exception:  # noqa: BLE001 -- a private API; without it, ask for the flags
    return False


def check(args) -> str | None:
  """Why the multi-host flags cannot work, as one line, or None."""
  n, pid = args.num_processes, args.process_id
  if n is not None and n < 1:
    return f"--num-processes: must be >= 1, got {n}"
  if pid is not None and n is None:
    return "--process-id: needs --num-processes"
  if pid is not None and not 0 <= pid < n:
    return f"--process-id: must be in 0..{n - 1} for --num-processes {n}, got {pid}"
  if args.coordinator is None and not cluster_detected():
    return ("--distributed: no --coordinator HOST:PORT given and no cluster environment "
            "(SLURM, Open MPI, TPU VM) to find one; pass --coordinator, --num-processes and "
            "--process-id")
  if args.coordinator is not None and (n is None or pid is None) and not cluster_detected():
    return ("--coordinator: needs --num-processes and --process-id outside a cluster "
            "environment")
  return None


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
  finally:
    watchdog.cancel()
