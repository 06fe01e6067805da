#!/usr/bin/env bash
# Stop the local Slurm cluster started by start.sh. Run as root.
#
#   stop.sh [DAEMON...]   default: slurmd slurmctld slurmdbd mariadbd munged
#
# Only daemons whose PIDs start.sh recorded in /run/slurm-local/ are signalled,
# and only while /proc/PID/comm still names that daemon. Nothing is killed by name.
# Queued and running jobs are cancelled first (before slurmd goes away) unless
# SLURM_LOCAL_KEEP_JOBS=1. SLURM_LOCAL_STOP_TIMEOUT=20: seconds between SIGTERM and SIGKILL.
set -euo pipefail
# shellcheck source=scripts/slurm-local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

TIMEOUT=${SLURM_LOCAL_STOP_TIMEOUT:-20}
ORDER=(slurmd slurmctld slurmdbd mariadbd munged)   # reverse start order

[ "$(id -u)" -eq 0 ] || { log "ERROR: must run as root"; exit 1; }

pid_of() { cat "$STATE/$1.pid" 2>/dev/null || true; }
wanted() { [ $# -eq 1 ] || [[ " ${*:2} " == *" $1 "* ]]; }

if [ "${SLURM_LOCAL_KEEP_JOBS:-0}" != 1 ] && wanted slurmd "$@" && alive "$(pid_of slurmd)" slurmd; then
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
  if alive "$pid" "$name"; then
    kill -TERM "$pid" 2>/dev/null || true
    end=$((SECONDS + TIMEOUT))
    while alive "$pid" "$name" && [ "$SECONDS" -lt "$end" ]; do sleep 0.1; done
    if alive "$pid" "$name"; then
      log "$name (pid $pid) ignored SIGTERM for ${TIMEOUT}s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    log "stopped $name (pid $pid)"
  fi
  rm -f "$STATE/$name.pid"
done
t=$((${EPOCHREALTIME/./} - T0))
log "stopped in $((t / 1000000)).$((t / 100000 % 10))s"
