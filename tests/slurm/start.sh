#!/usr/bin/env bash
# Start a throwaway single-node SLURM on localhost (munged, slurmctld, slurmd)
# for tests/test_slurm.py and for trying profiles/slurm by hand. Root only.
#
#   tests/slurm/start.sh
#   export SLURM_CONF=/tmp/distrank-slurm/slurm.conf PATH=/tmp/distrank-slurm/bin:$PATH
#   tests/slurm/stop.sh                    # kills exactly the daemons started here
#
# Everything lives in $SLURM_STATE_DIR (default /tmp/distrank-slurm): config,
# spool, logs, pid files, and munged's socket; only /etc/munge/munge.key is read.
# Knobs: SLURM_CTLD_PORT (6817), SLURMD_PORT (6818), SLURM_START_TIMEOUT (60 s),
# SLURM_NODE_CPUS (nproc), SLURM_NODE_MEM_MB (MemTotal minus max(1 GiB, 1/8)).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
state=${SLURM_STATE_DIR:-/tmp/distrank-slurm}
ctld_port=${SLURM_CTLD_PORT:-6817}
slurmd_port=${SLURMD_PORT:-6818}
wait_s=${SLURM_START_TIMEOUT:-60}
conf=$state/slurm.conf
# The real binaries, never our own shims from $state/bin (see below).
PATH=$(tr : '\n' <<<"$PATH" | grep -vxF "$state/bin" | paste -sd:):/usr/sbin:/sbin
sock=$state/munge/munge.socket
export SLURM_CONF=$conf

started=0
die() {
  echo "start.sh: $*" >&2
  for f in "$state"/munge/munged.log "$state"/log/*.log; do
    [[ -s $f ]] && { echo "--- tail $f" >&2; tail -n 15 "$f" >&2; }
  done
  # Leave nothing half-started behind (the logs above are all that is kept).
  ((started)) && "$here/stop.sh" >&2
  exit 1
}

[[ $(id -u) == 0 ]] || die "must run as root (slurmd runs jobs as their user)"
for bin in munged munge unmunge slurmctld slurmd sinfo scontrol runuser; do
  command -v "$bin" >/dev/null ||
    die "'$bin' not found; ./setup.sh --test installs munge slurm-wlm slurmctld slurmd slurm-client"
done
[[ -e /etc/munge/munge.key ]] || die "/etc/munge/munge.key missing (created by the munge package)"

# A pid counts as alive only if it runs the expected program (pids get reused)
# and is not a zombie (nothing may reap a daemon whose parent was this script).
alive() {
  local pid
  pid=$(cat "$state/pids/$1" 2>/dev/null) || return 1
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$1" ]] &&
    [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]
}
node_state() { timeout 10 sinfo --noheader --nodes=localhost --format=%t 2>/dev/null || true; }

if [[ -e $state/.distrank-slurm ]]; then
  if alive munged && alive slurmctld && alive slurmd && [[ $(node_state) =~ ^(idle|mix|alloc)$ ]]; then
    echo "start.sh: already running"
    echo "SLURM_CONF=$conf PATH=$state/bin:\$PATH"
    exit 0
  fi
  echo "start.sh: stale state in $state, cleaning up first" >&2
  "$here/stop.sh"
fi
if [[ -e $state ]]; then
  die "$state exists but was not made by start.sh; set SLURM_STATE_DIR elsewhere"
fi

cpus=${SLURM_NODE_CPUS:-$(nproc)}
total_mb=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
headroom_mb=$((total_mb / 8 > 1024 ? total_mb / 8 : 1024))
mem_mb=${SLURM_NODE_MEM_MB:-$((total_mb - headroom_mb))}

started=1
mkdir -p "$state"/{bin,ctld,slurmd,run,log,pids}
touch "$state/.distrank-slurm"
# Client shims that pin SLURM_CONF: snakemake-executor-plugin-slurm-jobstep
# (0.6.1) drops every SLURM_* variable, SLURM_CONF included, before its nested
# `srun`, which then finds no config. Put $state/bin first on PATH (sbatch
# --export=ALL carries PATH into the job) and no global slurm.conf is needed.
for bin in srun sbatch squeue scancel sinfo scontrol sacct sacctmgr sshare; do
  real=$(command -v "$bin") || continue
  printf '#!/bin/sh\nSLURM_CONF=%s exec %s "$@"\n' "$conf" "$real" >"$state/bin/$bin"
  chmod +x "$state/bin/$bin"
done
sed -e "s|@STATE_DIR@|$state|g" -e "s|@MUNGE_SOCKET@|$sock|g" \
  -e "s|@CTLD_PORT@|$ctld_port|g" -e "s|@SLURMD_PORT@|$slurmd_port|g" \
  -e "s|@CPUS@|$cpus|g" -e "s|@REAL_MEMORY@|$mem_mb|g" \
  "$here/slurm.conf" >"$conf"

# munged with a private socket (slurm.conf: AuthInfo=socket=...), so an
# existing munged at /run/munge is neither needed nor disturbed.
install -d -o munge -g munge -m 0755 "$state/munge"
runuser -u munge -- munged --socket="$sock" --pid-file="$state/munge/munged.pid" \
  --log-file="$state/munge/munged.log" --seed-file="$state/munge/munged.seed" ||
  die "munged failed to start"
for _ in $(seq 50); do [[ -s $state/munge/munged.pid ]] && break; sleep 0.1; done
cp "$state/munge/munged.pid" "$state/pids/munged" 2>/dev/null || die "munged wrote no pid file"
munge -n -S "$sock" | unmunge -S "$sock" >/dev/null || die "munge round trip failed"

# Foreground daemons (-D) in their own session: $! is the daemon's own pid.
setsid slurmctld -D -i -f "$conf" >"$state/log/slurmctld.out" 2>&1 </dev/null &
echo $! >"$state/pids/slurmctld"
setsid slurmd -D -N localhost -f "$conf" >"$state/log/slurmd.out" 2>&1 </dev/null &
echo $! >"$state/pids/slurmd"

deadline=$((SECONDS + wait_s))
until [[ $(node_state) == idle ]]; do
  for d in munged slurmctld slurmd; do alive "$d" || die "$d exited during start-up"; done
  ((SECONDS < deadline)) ||
    die "node not idle after ${wait_s}s (state: '$(node_state)')"
  sleep 0.5
done
echo "start.sh: SLURM up: node localhost, ${cpus} CPUs, ${mem_mb} MB, partition debug (${SECONDS}s)"
echo "SLURM_CONF=$conf PATH=$state/bin:\$PATH"
