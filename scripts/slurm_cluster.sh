#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for `jaxdl sweep --executor slurm` and its tests
# (tests/test_slurm.py): Debian's slurm-wlm and munge, slurmctld and slurmd started as root.
#
#   bash scripts/slurm_cluster.sh          install what is missing, start, wait until the node
#                                          is idle; at once when the cluster is already up
#   bash scripts/slurm_cluster.sh stop     stop the daemons this script started
#
# The configuration suits a container: no cgroups (proctrack/linuxproc, task/none), no
# accounting, one partition `debug` holding this node with the CPUs and memory `slurmd -C`
# detects. It is written to /etc/slurm/slurm.conf, where sbatch/srun/sinfo look, and never over
# a slurm.conf that this script did not write. Exit 0: the node is idle (or running jobs);
# exit 1: one line on stderr saying why the cluster cannot start. Needs root (apt, daemons).
# Measured on the 2-core Debian 12 CI machine: the apt install 18 s, the daemons' start 0.2-0.4 s.
set -uo pipefail

CONF=/etc/slurm/slurm.conf
MARK="# written by jaxdl scripts/slurm_cluster.sh"
LOGS=/var/log/slurm
TIMEOUT_S=${SLURM_CLUSTER_TIMEOUT_S:-60}
NODE=$(hostname -s)

fail() {
  echo "slurm_cluster.sh: cannot start the cluster: $*" >&2
  exit 1
}

# The last error-looking line of a daemon's log, for the one-line reason.
last_error() {
  grep -hiE "error|fatal" "$@" 2>/dev/null | tail -n 1
}

node_state() {
  timeout 5 sinfo -h -n "$NODE" -o %T 2>/dev/null | head -n 1
}

healthy() {
  # sinfo retries for seconds when no slurmctld answers: ask it only when ours runs. And a node
  # whose slurmd died stays `idle` in slurmctld's eyes for minutes: check slurmd too.
  local daemon
  for daemon in slurmctld slurmd; do
    [[ -s /run/$daemon.pid ]] && kill -0 "$(cat /run/$daemon.pid)" 2>/dev/null || return 1
  done
  case "$(node_state)" in
    idle|mixed|allocated|completing) return 0 ;;
    *) return 1 ;;
  esac
}

stop() {
  # The pid files this configuration names; slurmctld and slurmd remove theirs on exit.
  for pidfile in /run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid; do
    if [[ -s $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      kill "$(cat "$pidfile")"
      for _ in $(seq 50); do kill -0 "$(cat "$pidfile" 2>/dev/null)" 2>/dev/null || break; \
        sleep 0.1; done
    fi
  done
  echo "slurm_cluster.sh: stopped"
}

if [[ ${1:-start} == stop ]]; then
  stop
  exit 0
elif [[ ${1:-start} != start ]]; then
  echo "usage: bash scripts/slurm_cluster.sh [start|stop]" >&2
  exit 2
fi

if healthy; then
  echo "slurm_cluster.sh: node $NODE is up ($(node_state))"
  exit 0
fi
[[ $(id -u) == 0 ]] || fail "it needs root (apt-get, slurmctld, slurmd), and this is uid $(id -u)"
# One start at a time (.ci/run starts it in the background and the tests call it again): a
# second call waits here for the first, then finds the node up.
exec 9>/run/jaxdl_slurm_cluster.lock
flock 9
if healthy; then
  echo "slurm_cluster.sh: node $NODE is up ($(node_state))"
  exit 0
fi

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || fail "slurm-wlm and munge are not installed and there is no apt-get"
  export DEBIAN_FRONTEND=noninteractive
  # The package lists may be missing in a fresh container: update them once and retry.
  apt-get install -y -q slurm-wlm munge >/tmp/slurm_cluster_apt.log 2>&1 ||
    { apt-get update -q >>/tmp/slurm_cluster_apt.log 2>&1 &&
      apt-get install -y -q slurm-wlm munge >>/tmp/slurm_cluster_apt.log 2>&1; } ||
    fail "apt-get install slurm-wlm munge failed: $(tail -n 1 /tmp/slurm_cluster_apt.log)"
fi

if [[ -e $CONF ]] && ! head -n 1 "$CONF" | grep -qF "$MARK"; then
  fail "$CONF exists and was not written by this script; this machine has its own SLURM"
fi
node_line=$(slurmd -C 2>/dev/null | head -n 1)
[[ $node_line == NodeName=* ]] || fail "slurmd -C did not describe this node: $node_line"
mkdir -p /etc/slurm "$LOGS" /var/spool/slurmctld /var/spool/slurmd
cat >"$CONF.tmp" <<EOF
$MARK; rewritten on each start.
ClusterName=jaxdl
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
# A container without cgroups: processes tracked through /proc, no task binding or accounting.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
# A node that was down comes back as soon as its slurmd registers.
ReturnToService=2
# A cancelled job has SLURM's default 30 s between SIGTERM and SIGKILL to save its checkpoint
# (5 s can be too short on a loaded machine).
KillWait=30
MinJobAge=600
SchedulerType=sched/builtin
$node_line State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
mv "$CONF.tmp" "$CONF"

# munged as its own user, the way its service unit starts it.
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  mkdir -p /run/munge && chown munge:munge /run/munge && chmod 0755 /run/munge
  [[ -s /etc/munge/munge.key ]] || mungekey --create >/dev/null 2>&1 ||
    fail "no /etc/munge/munge.key and mungekey --create failed"
  runuser -u munge -- /usr/sbin/munged 9>&- 2>/tmp/slurm_cluster_munged.log ||
    fail "munged did not start: $(tail -n 1 /tmp/slurm_cluster_munged.log)"
fi

# A daemon left over from an earlier start reads the configuration again; else start it (without
# the lock's descriptor, which it would hold for its whole life: `9>&-`).
for daemon in slurmctld slurmd; do
  pidfile=/run/$daemon.pid
  if [[ -s $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    kill -HUP "$(cat "$pidfile")"
  else
    "$daemon" 9>&- 2>>"$LOGS/$daemon.log" || fail "$daemon did not start: $(last_error "$LOGS/$daemon.log")"
  fi
done

for _ in $(seq $((TIMEOUT_S * 5))); do
  if healthy; then
    echo "slurm_cluster.sh: node $NODE is up ($(node_state)): $node_line"
    exit 0
  fi
  sleep 0.2
done
why=$(last_error "$LOGS/slurmd.log" "$LOGS/slurmctld.log")
fail "node $NODE is '$(node_state)' after ${TIMEOUT_S} s${why:+; last log error: $why}"
