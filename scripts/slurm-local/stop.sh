#!/usr/bin/env bash
# Stop the local Slurm cluster started by start.sh. Run as root.
#
#   stop.sh [DAEMON...]   default: every slurmd, slurmctld slurmdbd mariadbd munged
#                         (slurmd@NODE: the slurmd of NODE; slurmd: all of them)
#
# Only daemons whose PIDs start.sh recorded in /run/slurm-local/ are signalled,
# and only while /proc/PID/comm still names that daemon. Nothing is killed by name.
# Queued and running jobs are cancelled first (before slurmd goes away) unless
# SLURM_LOCAL_KEEP_JOBS=1. SLURM_LOCAL_STOP_TIMEOUT=20: seconds between SIGTERM and SIGKILL.
set -euo pipefail
# shellcheck source=scripts/slurm-local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

TIMEOUT=${SLURM_LOCAL_STOP_TIMEOUT:-20}
mapfile -t slurmds < <(recorded_slurmds)
ORDER=("${slurmds[@]}" slurmctld slurmdbd mariadbd munged)   # reverse start order

[ "$(id -u)" -eq 0 ] || { log "ERROR: must run as root"; exit 1; }

pid_of() { cat "$STATE/$1.pid" 2>/dev/null || true; }
wanted() { [ $# -eq 1 ] || [[ " ${*:2} " == *" $1 "* || " ${*:2} " == *" $(comm_of "$1") "* ]]; }
slurmd_up=0
for d in "${slurmds[@]}"; do
  if wanted "$d" "$@" && alive "$(pid_of "$d")" slurmd; then slurmd_up=1; fi
done

if [ "${SLURM_LOCAL_KEEP_JOBS:-0}" != 1 ] && [ "$slurmd_up" = 1 ]; then
  jobs=$(timeout 10 squeue -h -o %i 2>/dev/null || true)
  if [ -n "$jobs" ]; then
    log "cancelling jobs ${jobs//$'\n'/ }"
    # shellcheck disable=SC2086  # one argument per job id
    timeout 10 scancel $jobs 2>/dev/null || true
    end=$((SECONDS + TIMEOUT))
    while [ -n "$(timeout 10 squeue -h -o %i 2>/dev/null || true)" ] && [ "$SECONDS" -lt "$end" ]; do
      sleep 0.2
    done
  fi
fi

for name in "${ORDER[@]}"; do
  wanted "$name" "$@" || continue
  pid=$(pid_of "$name")
  [ -n "$pid" ] || continue
  comm=$(comm_of "$name")
  if alive "$pid" "$comm"; then
    kill -TERM "$pid" 2>/dev/null || true
    end=$((SECONDS + TIMEOUT))
    while alive "$pid" "$comm" && [ "$SECONDS" -lt "$end" ]; do sleep 0.1; done
    if alive "$pid" "$comm"; then
      log "$name (pid $pid) ignored SIGTERM for ${TIMEOUT}s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    log "stopped $name (pid $pid)"
  fi
  rm -f "$STATE/$name.pid"
done
t=$((${EPOCHREALTIME/./} - T0))
log "stopped in $((t / 1000000)).$((t / 100000 % 10))s"
