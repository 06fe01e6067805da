# shellcheck shell=bash
# Shared by start.sh and stop.sh (sourced, not run).

# shellcheck disable=SC2034  # used by the scripts that source this file
STATE=/run/slurm-local          # PIDs of the daemons start.sh started (+ fake GPU devices)
T0=${EPOCHREALTIME/./}
took() { printf '%d.%ds' $(((${EPOCHREALTIME/./} - T0) / 1000000)) $(((${EPOCHREALTIME/./} - T0) / 100000 % 10)); }
log() { echo "slurm-local: $*" >&2; }

# alive PID COMM: PID runs (zombies count as dead) and is named COMM
alive() {
  local stat
  [[ $1 =~ ^[0-9]+$ ]] || return 1
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != [ZX] ]] && [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ]
}
