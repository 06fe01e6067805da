#!/usr/bin/env bash
# Start a local Slurm cluster (with slurmdbd accounting) on loopback, without
# systemd. Run as root. Safe to re-run: daemons already up are kept, daemons it
# started itself are restarted when the generated config changes.
#
# Nodes: "localhost" (127.0.0.1, slurmd port 6818) alone in the default
# partition, plus "localhost2".. (127.0.0.2.., ports 6820..), all of them in the
# multi-node partition, and one more node alone in the faults partition (tests
# set it DOWN under their own job); each its own slurmd on this machine (`slurmd -N NAME`),
# with the same CPUs and fake GPUs. Debian's Slurm is built without
# --enable-multiple-slurmd (slurmctld rejects two nodes with one NodeHostname),
# so each node has a NodeHostname and a loopback NodeAddr of its own; per-node
# Port=, %n in the slurmd pid/spool/log paths and `slurmd -N` work all the same.
#
# Every daemon started here has its PID recorded in /run/slurm-local/;
# stop.sh stops exactly those. Daemons found running are reused, not recorded.
#
# Environment knobs:
#   SLURM_LOCAL_CPUS=8              CPUs advertised (may exceed the real cores)
#   SLURM_LOCAL_GPUS=4              fake GPUs (gres/gpu backed by /dev/null)
#   SLURM_LOCAL_MEM_MB=<MemTotal-1024>
#   SLURM_LOCAL_PARTITION=debug      the default partition: node localhost only
#   SLURM_LOCAL_NODES=2              nodes in all (1: no second node, no multi partition)
#   SLURM_LOCAL_MULTI_PARTITION=multi  the partition of all the nodes
#   SLURM_LOCAL_FAULTS_PARTITION=faults  a partition with a node of its own (localhost<NODES+1>) that tests
#                                    set DOWN under their job; "" for none
#   SLURM_LOCAL_CLUSTER=localcluster
#   SLURM_LOCAL_ACCOUNTS="ultra3"   accounts created, each with an association for root
#   SLURM_LOCAL_TIMEOUT=60          seconds to wait for each daemon and for the node
set -euo pipefail
# shellcheck source=scripts/slurm-local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

CPUS=${SLURM_LOCAL_CPUS:-8}
GPUS=${SLURM_LOCAL_GPUS:-4}
MEM_MB=${SLURM_LOCAL_MEM_MB:-$(awk '/^MemTotal:/ {print int($2 / 1024) - 1024}' /proc/meminfo)}
PARTITION=${SLURM_LOCAL_PARTITION:-debug}
NODES=${SLURM_LOCAL_NODES:-2}
MULTI=${SLURM_LOCAL_MULTI_PARTITION:-multi}
FAULTS=${SLURM_LOCAL_FAULTS_PARTITION-faults}
CLUSTER=${SLURM_LOCAL_CLUSTER:-localcluster}
ACCOUNTS=${SLURM_LOCAL_ACCOUNTS-ultra3}
TIMEOUT=${SLURM_LOCAL_TIMEOUT:-60}

RUN=/run/slurm                  # pidfiles written by the slurm daemons themselves
CONF=/etc/slurm
LOGS=/var/log/slurm
DB_DIR=/var/lib/slurm-local/mysql
DB_SOCK=/run/mysqld/mysqld.sock # libmariadb's default, which slurmdbd uses
NODE=localhost                  # node 1; node k is localhost<k> on 127.0.0.<k>, slurmd port 6818+k
PACKAGES=(munge slurm-client slurmctld slurmd slurmdbd mariadb-server)

# die REASON [LOGFILE]: one-line reason, then the end of the relevant log
die() {
  log "ERROR: $1"
  if [ -n "${2:-}" ] && [ -f "$2" ]; then tail -n 15 "$2" | sed 's/^/    /' >&2; fi
  exit 1
}

[ "$(id -u)" -eq 0 ] || die "must run as root"
for v in CPUS GPUS MEM_MB TIMEOUT NODES; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "SLURM_LOCAL_$v must be a whole number, not '${!v}'"
done
((NODES >= 1 && NODES <= 8)) || die "SLURM_LOCAL_NODES must be 1 to 8, not '$NODES'"
names=("$NODE")
for ((k = 2; k <= NODES; k++)); do names+=("$NODE$k"); done
all_nodes=$(IFS=,; echo "${names[*]}")
if [ -n "$FAULTS" ]; then names+=("$NODE$((NODES + 1))"); fi
every_node=$(IFS=,; echo "${names[*]}")

pid_in() { cat "$1" 2>/dev/null || true; }
ours() { alive "$(pid_in "$STATE/$1.pid")" "$(comm_of "$1")"; }
# wait_for WHAT LOGFILE CMD...: poll CMD until it succeeds or TIMEOUT expires
wait_for() {
  local what=$1 logf=$2 end=$((SECONDS + TIMEOUT)) last
  shift 2
  until "$@" >"$STATE/probe.out" 2>&1; do
    if [ "$SECONDS" -ge "$end" ]; then
      last=$(tail -n 1 "$STATE/probe.out")
      die "timed out after ${TIMEOUT}s waiting for $what${last:+ (last: $last)}" "$logf"
    fi
    sleep 0.1
  done
}

# --- packages --------------------------------------------------------------
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  mkdir -p "$LOGS"
  # keep package scripts from starting services where an init system exists
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } \
    >"$LOGS/apt.log" 2>&1 || die "package installation failed" "$LOGS/apt.log"
  log "packages installed ($(took))"
fi

# --- configuration ---------------------------------------------------------
gres_node='' gres_types=''
if [ "$GPUS" -gt 0 ]; then gres_node=" Gres=gpu:$GPUS" gres_types='GresTypes=gpu'; fi

slurm_conf="# Generated by scripts/slurm-local/start.sh
ClusterName=$CLUSTER
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
# one slurmd per node on this machine: %n is the node name
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
MailProg=/bin/true
MpiDefault=none
# no cgroups in containers; pgid also kills job children that stay in the job's process group
ProctrackType=proctrack/pgid
TaskPlugin=task/none
# allow more CPUs/GPUs than the hardware has
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
SchedulerType=sched/backfill
# the default (3s) delays every batch job; a requeued job, once its hold is over, waits for the next
# scheduling pass (60 s by default, backfill's 30 s)
SchedulerParameters=batch_sched_delay=0,sched_interval=5,bf_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# keep finished jobs visible in scontrol for 5 minutes
MinJobAge=300
KillWait=5
# a requeued job waits cred_expire seconds before it may start again (default 120): the continuation tests
# requeue jobs at their time limit
AuthInfo=cred_expire=10
$gres_types
NodeName=DEFAULT CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM_MB$gres_node State=UNKNOWN
# the other nodes first: while \"localhost\" is the only node, Slurm takes any unknown node name for it
# (and would reject the next node as a duplicate)"
for ((k = 2; k <= ${#names[@]}; k++)); do slurm_conf+="
NodeName=$NODE$k NodeAddr=127.0.0.$k NodeHostname=$NODE$k Port=$((6818 + k))"; done
slurm_conf+="
NodeName=$NODE NodeAddr=127.0.0.1 NodeHostname=localhost
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP"
if [ "$NODES" -gt 1 ]; then slurm_conf+="
PartitionName=$MULTI Nodes=$all_nodes MaxTime=INFINITE State=UP"; fi
if [ -n "$FAULTS" ]; then slurm_conf+="
PartitionName=$FAULTS Nodes=${names[-1]} MaxTime=INFINITE State=UP"; fi

# gres/gpu File= must be a device: symlinks to /dev/null pass the check
gres_conf=''
if [ "$GPUS" -gt 0 ]; then gres_conf="NodeName=$every_node Name=gpu File=$STATE/gpu[0-$((GPUS - 1))]"; fi

# root reaches MariaDB through the socket (unix_socket auth): no password needed
dbd_conf="# Generated by scripts/slurm-local/start.sh
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
LogFile=$LOGS/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db"

# put FILE CONTENT MODE: write only when different; return 0 if written
put() {
  if [ -z "$2" ]; then
    [ -e "$1" ] || return 1
    rm -f "$1"
    return 0
  fi
  [ "$(cat "$1" 2>/dev/null)" != "$2" ] || return 1
  printf '%s\n' "$2" >"$1"
  chmod "$3" "$1"
}

mkdir -p "$STATE" "$RUN" "$CONF" "$LOGS" /var/spool/slurmctld
for n in "${names[@]}"; do mkdir -p "/var/spool/slurmd/$n"; done
mapfile -t slurmds < <(recorded_slurmds)  # also of nodes since removed
for n in "${names[@]}"; do [[ " ${slurmds[*]} " == *" slurmd@$n "* ]] || slurmds+=("slurmd@$n"); done
restart=()
if put "$CONF/slurm.conf" "$slurm_conf" 644; then restart+=("${slurmds[@]}" slurmctld); fi
if put "$CONF/gres.conf" "$gres_conf" 644; then restart+=("${slurmds[@]}" slurmctld); fi
if put "$CONF/slurmdbd.conf" "$dbd_conf" 600; then restart+=(slurmdbd); fi
for ((i = 0; i < GPUS; i++)); do ln -sfn /dev/null "$STATE/gpu$i"; done
for d in "${restart[@]}"; do
  if ours "$d"; then
    log "config changed: restarting the daemons started here"
    SLURM_LOCAL_KEEP_JOBS=1 bash "$(dirname "$0")/stop.sh" "${restart[@]}"
    break
  fi
done

# --- daemons ---------------------------------------------------------------
# up NAME LOGFILE PIDFILE PROBE LAUNCH...: reuse a running NAME or launch it,
# then wait until PROBE succeeds
up() {
  local name=$1 logf=$2 pidfile=$3 probe=$4
  shift 4
  if ! ours "$name"; then
    if "$probe" >/dev/null 2>&1 || alive_from "$pidfile" "$(comm_of "$name")"; then
      log "$name is already running (not started here): reusing it"
    else
      rm -f "$pidfile"
      "$@" </dev/null >"$STATE/$name.out" 2>&1 || die "$name failed to start" "$STATE/$name.out"
      wait_for "$name to write $pidfile" "$logf" alive_from "$pidfile" "$(comm_of "$name")"
      pid_in "$pidfile" >"$STATE/$name.pid"
    fi
  fi
  wait_for "$name to answer" "$logf" "$probe"
}
alive_from() { alive "$(pid_in "$1")" "$2"; }
munge_ok() { munge -n | unmunge; }
db_ok() { mariadb-admin --no-defaults --socket="$DB_SOCK" ping; }
ctld_ok() { [[ $(scontrol ping) == *UP* ]]; }
slurmd_ok() { alive_from "$RUN/slurmd-$node.pid" slurmd; }  # $node: the node being started
start_mariadbd() {
  setsid /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$DB_DIR" \
    --socket="$DB_SOCK" --pid-file=/run/mysqld/mysqld.pid --skip-networking \
    --log-error="$LOGS/mariadb.log" --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 &
}

# munged (the package creates the key; recreate it if it went missing)
[ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /etc/munge/munge.key /run/munge /var/log/munge /var/lib/munge
chmod 400 /etc/munge/munge.key
up munged /var/log/munge/munged.log /run/munge/munged.pid munge_ok runuser -u munge -- /usr/sbin/munged

# MariaDB: private datadir, unix socket only
mkdir -p /run/mysqld "$DB_DIR"
touch "$LOGS/mariadb.log"
chown mysql:mysql /run/mysqld "$DB_DIR" "$LOGS/mariadb.log"
if ! ours mariadbd && ! db_ok >/dev/null 2>&1 && [ ! -d "$DB_DIR/mysql" ]; then
  mariadb-install-db --no-defaults --user=mysql --datadir="$DB_DIR" --skip-test-db \
    --auth-root-authentication-method=socket >>"$LOGS/mariadb.log" 2>&1 \
    || die "mariadb-install-db failed" "$LOGS/mariadb.log"
fi
up mariadbd "$LOGS/mariadb.log" /run/mysqld/mysqld.pid db_ok start_mariadbd

# slurmdbd, then the cluster, accounts and root's associations it must know;
# the probe keeps the association list (cluster|account|user) for the checks
dbd_ok() { assocs=$(sacctmgr -nP list assoc format=cluster,account,user); }
assocs=''
up slurmdbd "$LOGS/slurmdbd.log" "$RUN/slurmdbd.pid" dbd_ok /usr/sbin/slurmdbd
has() { grep -qxF "$1" <<<"$assocs"; }
has "$CLUSTER|root|" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
for a in $ACCOUNTS; do
  has "$CLUSTER|$a|" || sacctmgr -i add account "$a" cluster="$CLUSTER" >/dev/null
  has "$CLUSTER|$a|root" || sacctmgr -i add user root account="$a" cluster="$CLUSTER" >/dev/null
done

up slurmctld "$LOGS/slurmctld.log" "$RUN/slurmctld.pid" ctld_ok /usr/sbin/slurmctld
for node in "${names[@]}"; do
  up "slurmd@$node" "$LOGS/slurmd-$node.log" "$RUN/slurmd-$node.pid" slurmd_ok /usr/sbin/slurmd -N "$node"
done

# --- wait until every node takes jobs ---------------------------------------
end=$((SECONDS + TIMEOUT)) resumed=''
for node in "${names[@]}"; do
  while :; do
    state=$(sinfo -h -N -n "$node" -o %T 2>/dev/null | head -n 1 || true)
    case $state in
      idle | mixed | allocated | completing) break ;;
      *down* | *drain* | *inval* | *fail*)
        # e.g. left down by an earlier run; resume once
        if [[ " $resumed " != *" $node "* ]]; then
          scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
          resumed+=" $node"
        fi
        ;;
    esac
    [ "$SECONDS" -lt "$end" ] || die "node $node is '$state', not idle, after ${TIMEOUT}s" "$LOGS/slurmd-$node.log"
    sleep 0.1
  done
done
echo "slurm-local: cluster $CLUSTER up in $(took): $(sinfo -h -o 'partition %P: %N %T, %c CPUs, %m MB, gres %G each' | paste -sd ';' | sed 's/;/; /g')"
