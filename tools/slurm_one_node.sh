#!/usr/bin/env bash
# A one-node Slurm cluster on this machine from Debian's packages, with accounting (slurmdbd on
# MariaDB), as the Slurm launcher needs it: submitit reads job states with `sacct`.
#   sudo bash tools/slurm_one_node.sh          # install if missing, configure, start; idempotent
#   sudo bash tools/slurm_one_node.sh stop     # stop the daemons it started
# The node is this host with the CPUs and memory `slurmd -C` finds, in partition `debug` (the
# default). Runs as root (SlurmUser=root); meant for a test machine or a container, not a cluster.
set -euo pipefail
conf=/etc/slurm
node=$(hostname -s)
if [[ "${1:-}" == stop ]]; then
    for d in slurmd slurmctld slurmdbd; do pkill -x "$d" 2>/dev/null || true; done
    exit 0
fi
[[ $(id -u) == 0 ]] || { echo "slurm_one_node.sh: run as root (it installs packages and starts daemons)" >&2; exit 1; }
pkgs=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
mkdir -p "$conf" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /run/mysqld
chown munge:munge /run/munge 2>/dev/null || true
chown mysql:mysql /run/mysqld 2>/dev/null || true
[[ -s /etc/munge/munge.key ]] || { mungekey -c -f -k /etc/munge/munge.key 2>/dev/null \
    || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null; }
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged

# accounting: MariaDB for slurmdbd
if ! mysqladmin ping --silent >/dev/null 2>&1; then
    (mysqld_safe --skip-networking=0 --bind-address=127.0.0.1 >/dev/null 2>&1 &)
    for _ in $(seq 60); do mysqladmin ping --silent >/dev/null 2>&1 && break; sleep 0.5; done
fi
mysql -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db; CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
          GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
cat > "$conf/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurmdbd.pid
EOF
chmod 600 "$conf/slurmdbd.conf"

read -r cpus mem < <(slurmd -C | awk '/^NodeName/ {for (i = 1; i <= NF; i++) {split($i, kv, "=");
    if (kv[1] == "CPUs") c = kv[2]; if (kv[1] == "RealMemory") m = kv[2]}} END {print c, m}')
cat > "$conf/slurm.conf" <<EOF
ClusterName=onenode
SlurmctldHost=$node
SlurmUser=root
AuthType=auth/munge
# a requeued job (preemption, USR2) may start again once its credential expires: 10 s instead of 120
AuthInfo=cred_expire=10
# and the scheduler looks at it (and at any pending job) every 2 s, not every 60 (backfill: 30)
SchedulerParameters=sched_interval=2,bf_interval=2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
KillWait=5
MinJobAge=300
NodeName=$node CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
for _ in $(seq 60); do   # (re)start slurmdbd once one that was stopped has exited, until it answers
    sacctmgr -n list cluster >/dev/null 2>&1 && break
    pgrep -x slurmdbd >/dev/null || /usr/sbin/slurmdbd
    sleep 0.5
done
sacctmgr -i add cluster onenode >/dev/null 2>&1 || true
pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd
for _ in $(seq 60); do
    state=$(sinfo -h -n "$node" -o %t 2>/dev/null || true)
    [[ "$state" == idle* || "$state" == mix* || "$state" == alloc* ]] && break
    [[ "$state" == down* || "$state" == drain* ]] && scontrol update nodename="$node" state=resume 2>/dev/null || true
    sleep 0.5
done
sinfo -h -o "%P %D %c %m %t" | sed "s/^/slurm one node: partition nodes cpus mem_mb state = /"
sacct -n -X -S now >/dev/null || {   # submitit reads job states with sacct
    echo "slurm_one_node.sh: Slurm accounting (slurmdbd) is not answering: see /var/log/slurm/slurmdbd.log" >&2; exit 1; }
