#!/usr/bin/env bash
# Stop what tests/slurm/start.sh started: cancel this cluster's jobs, kill
# exactly the recorded pids (TERM, then KILL after SLURM_STOP_TIMEOUT s),
# remove the state directory. Safe to run twice.
set -uo pipefail

state=${SLURM_STATE_DIR:-/tmp/distrank-slurm}
wait_s=${SLURM_STOP_TIMEOUT:-20}
export SLURM_CONF=$state/slurm.conf

[[ -d $state ]] || { echo "stop.sh: nothing at $state"; exit 0; }
if [[ ! -e $state/.distrank-slurm ]]; then
  echo "stop.sh: $state was not made by start.sh; refusing to touch it" >&2
  exit 1
fi

# Same test as start.sh: the recorded pid still runs that program, no zombie.
alive() {
  local pid
  pid=$(cat "$state/pids/$1" 2>/dev/null) || return 1
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$1" ]] &&
    [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]
}

# Jobs first, so no job step outlives its slurmd.
if alive slurmctld && [[ -n $(timeout 10 squeue --noheader 2>/dev/null) ]]; then
  timeout 10 scancel --partition=debug 2>/dev/null
  for _ in $(seq 20); do
    [[ -z $(timeout 10 squeue --noheader --states=PENDING,RUNNING,COMPLETING 2>/dev/null) ]] && break
    sleep 0.5
  done
fi

daemons=(slurmd slurmctld munged)
for d in "${daemons[@]}"; do
  alive "$d" && kill -TERM "$(cat "$state/pids/$d")"
done
deadline=$((SECONDS + wait_s))
for d in "${daemons[@]}"; do
  while alive "$d" && ((SECONDS < deadline)); do sleep 0.2; done
  if alive "$d"; then
    echo "stop.sh: $d ignored SIGTERM for ${wait_s}s, sending SIGKILL" >&2
    kill -KILL "$(cat "$state/pids/$d")"
  fi
done
rm -rf -- "$state"
echo "stop.sh: stopped, removed $state"
