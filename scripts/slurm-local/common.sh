# shellcheck shell=bash
# Shared by start.sh and stop.sh (sourced, not run).

# shellcheck disable=SC2034  # used by the scripts that source this file
STATE=/run/slurm-local          # PIDs of the daemons start.sh started (+ fake GPU devices)
T0=${EPOCHREALTIME/./}
took() { printf '%d.%ds' $(((${EPOCHREALTIME/./} - T0) / 1000000)) $(((${EPOCHREALTIME/./} - T0) / 100000 % 10)); }
log() { echo "slurm-local: $*" >&2; }

# The daemon a record in $STATE names: slurmd@NODE is the slurmd of NODE
comm_of() { echo "${1%@*}"; }
# The slurmds start.sh recorded (slurmd alone: the single-node layout's)
recorded_slurmds() {
  local f
  for f in "$STATE"/slurmd.pid "$STATE"/slurmd@*.pid; do
    if [ -e "$f" ]; then f=${f##*/} && echo "${f%.pid}"; fi
  done
}

# alive PID COMM: PID runs (zombies count as dead) and is named COMM
alive() {
  local stat
  [[ $1 =~ ^[0-9]+$ ]] || return 1
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != [ZX] ]] && [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ]
}
