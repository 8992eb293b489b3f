#!/usr/bin/env bash
# A throwaway one-node SLURM cluster on this machine, for tests/workflow/test_slurm.py (and for trying
# configs/slurm by hand): MUNGE, MariaDB + slurmdbd (job accounting: sacct, sacctmgr), slurmctld and
# slurmd, with every config file, socket, log, database and spool folder under one folder, DIR.
#
#   scripts/slurm_local.sh start DIR      # bring it up; writes DIR/env (SLURM_CONF=..., ...) and returns
#   scripts/slurm_local.sh stop DIR       # cancel its jobs, stop every daemon, leave nothing running
#   scripts/slurm_local.sh run DIR -- CMD # start, run CMD with SLURM_CONF set, stop (whatever CMD does)
#   scripts/slurm_local.sh status DIR     # sinfo + squeue of that cluster
#
# Clients find the cluster through SLURM_CONF=DIR/etc/slurm.conf (source DIR/env). The Debian packages
# come from scripts/system-packages.txt (scripts/setup_system.sh). Runs as root in a container without
# systemd: the daemons are started directly in the background, each with its pid file under DIR.
#
# The cluster: one node (this machine, NodeAddr 127.0.0.1) with 2 CPUs and the machine's memory
# (RealMemory from `slurmd -C`), one partition `local` (default, MaxTime 120 min), one account
# `minite` holding the user who starts it. Accounts are enforced (AccountingStorageEnforce) and
# partition limits are checked at submission (EnforcePartLimits=ALL), so a wrong partition or account,
# or a request above the node, is refused by sbatch the way a real site refuses it.
#
# Plugins chosen to work in a container without cgroup control (no systemd, cgroupfs not delegated):
#   ProctrackType=proctrack/linuxproc  tracks a job's processes through the /proc parent-pid tree, so
#                                      scancel reaches everything a job started (torchrun's ranks too);
#                                      proctrack/cgroup needs a writable cgroup hierarchy, and
#                                      proctrack/pgid loses processes that start their own group.
#   TaskPlugin=task/none               no CPU binding/containment (task/affinity would pin, task/cgroup
#                                      needs cgroups); the jobs' OMP_NUM_THREADS keeps them to their CPUs.
#   JobAcctGatherType=jobacct_gather/linux  memory/CPU use for sacct from /proc (not cgroup counters).
#   SelectType=select/cons_tres + CR_Core_Memory  CPUs and memory are what jobs ask for and get
#                                      (AllocCPUS, ReqMem in sacct), as on a real cluster.
#   SlurmdParameters=config_overrides  the node is what slurm.conf says (2 CPUs) whatever the hardware.
# SLURM 22.05's daemons have no listen-address setting: slurmctld, slurmd and slurmdbd listen on their
# (free, randomly chosen) ports on every interface, but everything is addressed to 127.0.0.1 and every
# message must carry a MUNGE credential made with this cluster's key (fresh, DIR/munge/munge.key, mode
# 0400), so nothing outside this machine's root can talk to them. MariaDB binds to 127.0.0.1 only.
set -euo pipefail

usage() { sed -n '2,12p' "$0" >&2; exit 2; }
(($# >= 2)) || usage
cmd=$1
DIR=$(realpath -m "$2")
shift 2

CLUSTER=minite
PARTITION=local
ACCOUNT=minite
NODE=localnode
USER_NAME=$(id -un)
CONF=$DIR/etc/slurm.conf
MARK="MINITE_SLURM_LOCAL=$DIR" # in every daemon's environment: how stop finds what this cluster started

log() { echo "slurm_local: $*" >&2; }
die() { log "$*"; exit 1; }

# --- ports: four free TCP ports (slurmctld, slurmd, slurmdbd, mariadb), from /proc/net/tcp* ------------
listening_ports() {
  # column 4 (st) 0A = LISTEN; the port is the hex after the last colon of column 2 (plain awk: no
  # strtonum in Debian's mawk, so bash converts the hex)
  local hex
  for hex in $(awk 'NR > 1 && $4 == "0A" { n = split($2, a, ":"); print a[n] }' /proc/net/tcp /proc/net/tcp6 2>/dev/null); do
    echo $((16#$hex))
  done
}
pick_ports() {
  local used base p ok
  used=" $(listening_ports | tr '\n' ' ') "
  for _ in $(seq 50); do
    base=$((20000 + RANDOM % 40000))
    ok=1
    for p in $base $((base + 1)) $((base + 2)) $((base + 3)); do
      [[ $used == *" $p "* ]] && ok=0
    done
    ((ok)) && { echo "$base"; return 0; }
  done
  die "no four free consecutive TCP ports found"
}

wait_for() { # wait_for SECONDS WHAT CMD...: retry CMD until it succeeds; on timeout show its last output
  local secs=$1 what=$2 out
  shift 2
  local end=$((SECONDS + secs))
  until out=$("$@" 2>&1); do
    ((SECONDS < end)) || { log "timed out after ${secs}s waiting for $what: $out"; return 1; }
    sleep 0.3
  done
}

daemon() { # daemon NAME CMD...: start CMD in the background with the cluster mark, log to DIR/log/NAME.out
  local name=$1
  shift
  env "$MARK" SLURM_CONF="$CONF" "$@" >"$DIR/log/$name.out" 2>&1 &
  echo $! >"$DIR/run/$name.pid"
}

pid_alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# --- start ---------------------------------------------------------------------------------------------
start() {
  local need
  for need in munged mungekey mariadbd mariadb-install-db slurmdbd slurmctld slurmd sbatch sacct sacctmgr; do
    command -v "$need" >/dev/null || [[ -x /usr/sbin/$need ]] ||
      die "$need not found: install the SLURM packages (bash scripts/setup_system.sh)"
  done
  export PATH=$PATH:/usr/sbin
  [[ -e $DIR/run ]] && pid_alive "$DIR/run/slurmctld.pid" && die "a cluster is already running in $DIR"
  mkdir -p "$DIR"/{etc,run,log,munge,db,spool/ctld,spool/d}
  chmod 700 "$DIR" "$DIR/munge"

  local base mem host dbpass
  base=$(pick_ports)
  local P_CTLD=$base P_SLURMD=$((base + 1)) P_DBD=$((base + 2)) P_DB=$((base + 3))
  # the machine's memory, as slurmd itself measures it
  mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  [[ -n $mem ]] || die "slurmd -C did not report RealMemory"
  host=$(hostname -s)
  dbpass=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')

  # MUNGE: a fresh key, a private socket
  mungekey --create --keyfile="$DIR/munge/munge.key" --force 2>/dev/null ||
    head -c 1024 /dev/urandom >"$DIR/munge/munge.key"
  chmod 400 "$DIR/munge/munge.key"
  local SOCK=$DIR/munge/munge.socket
  env "$MARK" munged --force --key-file="$DIR/munge/munge.key" --socket="$SOCK" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/seed" \
    >"$DIR/log/munged.out" 2>&1
  wait_for 20 munged bash -c "munge -S '$SOCK' -n | unmunge -S '$SOCK'"

  # MariaDB for slurmdbd, on 127.0.0.1 only
  mariadb-install-db --no-defaults --datadir="$DIR/db" --user="$USER_NAME" --skip-test-db \
    --auth-root-authentication-method=socket >"$DIR/log/mariadb-install.out" 2>&1
  daemon mariadbd mariadbd --no-defaults --datadir="$DIR/db" --socket="$DIR/run/mysql.sock" \
    --port="$P_DB" --bind-address=127.0.0.1 --user="$USER_NAME" --pid-file="$DIR/run/mariadbd.own.pid" \
    --log-error="$DIR/log/mariadb.log" --skip-name-resolve --innodb-buffer-pool-size=16M
  wait_for 60 mariadb mariadb-admin --no-defaults --socket="$DIR/run/mysql.sock" ping
  mariadb --no-defaults --socket="$DIR/run/mysql.sock" -u root -e "
    CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$dbpass';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"

  # slurmdbd (it reads slurmdbd.conf beside SLURM_CONF; the file holds the password: mode 0600)
  (
    umask 077
    cat >"$DIR/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$SOCK
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$P_DBD
SlurmUser=$USER_NAME
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$P_DB
StorageUser=slurm
StoragePass=$dbpass
StorageLoc=slurm_acct_db
PidFile=$DIR/run/slurmdbd.own.pid
LogFile=$DIR/log/slurmdbd.log
DebugLevel=info
EOF
  )

  cat >"$CONF" <<EOF
# written by scripts/slurm_local.sh: a throwaway one-node cluster (see the comments there)
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$P_CTLD
SlurmdPort=$P_SLURMD
SlurmUser=$USER_NAME
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$SOCK
CredType=cred/munge
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/d
SlurmctldPidFile=$DIR/run/slurmctld.own.pid
SlurmdPidFile=$DIR/run/slurmd.own.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=10
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
MpiDefault=none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$P_DBD
AccountingStoragePass=$SOCK
AccountingStorageEnforce=associations,limits
AccountingStoreFlags=job_comment
JobCompType=jobcomp/none
EnforcePartLimits=ALL
ReturnToService=2
SchedulerType=sched/backfill
KillWait=5
InactiveLimit=0
MinJobAge=300
SlurmctldTimeout=60
SlurmdTimeout=120
NodeName=$NODE NodeHostname=$host NodeAddr=127.0.0.1 CPUs=2 RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=120 State=UP
EOF

  daemon slurmdbd slurmdbd -D
  wait_for 60 slurmdbd env SLURM_CONF="$CONF" sacctmgr -n list cluster
  {
    env SLURM_CONF="$CONF" sacctmgr -i add cluster "$CLUSTER"
    env SLURM_CONF="$CONF" sacctmgr -i add account "$ACCOUNT" Cluster="$CLUSTER" \
      Description="miniTE test account" Organization=minite
    env SLURM_CONF="$CONF" sacctmgr -i add user "$USER_NAME" Account="$ACCOUNT" DefaultAccount="$ACCOUNT"
  } >"$DIR/log/sacctmgr.out"

  daemon slurmctld slurmctld -D -f "$CONF"
  wait_for 60 slurmctld env SLURM_CONF="$CONF" scontrol ping
  # Inside a job, snakemake-executor-plugin-slurm-jobstep starts the rule with `srun` after removing
  # every SLURM_* variable but the job's ids, SLURM_CONF included, so that srun reads the default
  # /etc/slurm/slurm.conf (a real site's node has its config there). slurmd (and so every job) runs in
  # a private mount namespace that shows this cluster's etc/ at /etc/slurm; the machine's own
  # /etc/slurm is untouched. Where namespaces are not allowed (no CAP_SYS_ADMIN), DIR/bin/srun (put
  # first on PATH by DIR/env) sets SLURM_CONF and runs the real srun.
  local view
  if unshare --mount --propagation private true 2>/dev/null; then
    view=namespace
    daemon slurmd unshare --mount --propagation private -- sh -c \
      'mount --bind "$1" /etc/slurm && shift && exec "$@"' sh "$DIR/etc" slurmd -D -f "$CONF" -N "$NODE"
  else
    view=srun-wrapper
    mkdir -p "$DIR/bin"
    printf '#!/bin/sh\nSLURM_CONF=%q exec %q "$@"\n' "$CONF" "$(command -v srun)" >"$DIR/bin/srun"
    chmod +x "$DIR/bin/srun"
    daemon slurmd slurmd -D -f "$CONF" -N "$NODE"
  fi
  wait_for 60 "node $NODE idle" bash -c \
    "[[ \$(env SLURM_CONF='$CONF' sinfo -h -n '$NODE' -o %t) == idle ]]"

  cat >"$DIR/env" <<EOF
SLURM_CONF=$CONF
MINITE_SLURM_CONF_VIEW=$view
MINITE_SLURM_PARTITION=$PARTITION
MINITE_SLURM_ACCOUNT=$ACCOUNT
MINITE_SLURM_CPUS=2
MINITE_SLURM_MEM_MB=$mem
EOF
  [[ $view == srun-wrapper ]] && echo "PATH=$DIR/bin:$PATH" >>"$DIR/env"
  log "up: cluster $CLUSTER, partition $PARTITION (2 CPUs, $mem MB), account $ACCOUNT; SLURM_CONF=$CONF"
}

# --- stop ----------------------------------------------------------------------------------------------
# Processes this cluster started: its daemons and slurmstepd (they carry $MARK in their environment),
# and the jobs' own processes (their environment names this cluster's SLURM_CONF and a SLURM_JOB_ID).
cluster_pids() {
  local f pid env
  for f in /proc/[0-9]*/environ; do
    pid=${f#/proc/}
    pid=${pid%/environ}
    [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
    { env=$(tr '\0' '\n' <"$f"); } 2>/dev/null || continue
    if grep -qxF "$MARK" <<<"$env" ||
      { grep -qxF "SLURM_CONF=$CONF" <<<"$env" && grep -q '^SLURM_JOB_ID=' <<<"$env"; }; then
      echo "$pid"
    fi
  done
}

stop_pidfile() { # stop_pidfile NAME: SIGTERM the daemon, SIGKILL after 15 s
  local f=$DIR/run/$1.pid pid
  [[ -s $f ]] || return 0
  pid=$(cat "$f")
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.3
  done
  log "$1 ($pid) ignored SIGTERM; SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
}

stop() {
  [[ -d $DIR/run ]] || return 0
  export PATH=$PATH:/usr/sbin
  if pid_alive "$DIR/run/slurmctld.pid"; then
    # the jobs first: slurmd leaves running steps alone when it stops
    SLURM_CONF=$CONF timeout 20 scancel --user="$USER_NAME" 2>/dev/null || true
    for _ in $(seq 60); do
      [[ -z $(SLURM_CONF=$CONF timeout 10 squeue -h -o %i 2>/dev/null) ]] && break
      sleep 0.5
    done
  fi
  local name
  for name in slurmd slurmctld slurmdbd mariadbd; do stop_pidfile "$name"; done
  # munged was started with --pid-file (it forks itself)
  [[ -s $DIR/run/munged.pid ]] && stop_pidfile munged
  # anything left (a slurmstepd or a job process that outlived its daemon)
  local left
  left=$(cluster_pids | tr '\n' ' ')
  if [[ -n ${left// /} ]]; then
    log "killing leftover processes of this cluster: $left"
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null || true
    sleep 0.5
  fi
  left=$(cluster_pids | tr '\n' ' ')
  [[ -z ${left// /} ]] || die "processes still running after stop: $left"
  log "down: $DIR"
}

# a start that fails half-way, or a signal, stops what was started: nothing is left behind
on_exit() {
  local rc=$?
  if ((rc != 0)); then
    log "failed (exit $rc); stopping what was started (logs: $DIR/log)"
    stop || true
  fi
}
case $cmd in
start)
  trap on_exit EXIT
  trap 'exit 143' TERM INT HUP
  start
  trap - EXIT
  ;;
stop) stop ;;
status)
  SLURM_CONF=$CONF sinfo
  SLURM_CONF=$CONF squeue
  ;;
run)
  [[ ${1:-} == -- ]] && shift
  (($#)) || usage
  trap stop EXIT
  trap 'exit 143' TERM INT HUP
  start
  SLURM_CONF=$CONF "$@"
  ;;
*) usage ;;
esac
