#!/usr/bin/env bash
# The job's own etcd, on the job's first node, for the length of a Slurm job step.
#
# dlfs-job.sbatch starts this as one task on its first node when the job has
# several nodes and DLFS_ETCD names no etcd of the site: the daemons of the
# job form a cluster through it (docs/cluster.md).  It is not meant to be run
# by hand.  It
#   1. creates its node-local dir $DLFS_LOCAL_ROOT/dlfs-$SLURM_JOB_ID.NODE.etcd
#      (refusing one that already exists: it only ever deletes what it created),
#   2. starts a one-member etcd there, listening on $DLFS_LISTEN_HOST: on
#      DLFS_ETCD_PORT, or on a free port (it tries another if one is taken),
#   3. once etcd says it is healthy, publishes its client URL in
#      $DLFS_JOB_DIR/etcd-url (atomically) and the step id in
#      $DLFS_JOB_DIR/etcd-step,
#   4. waits; on SIGTERM/SIGINT/SIGHUP it stops etcd (2 s for the signal the
#      step got, then SIGTERM, SIGKILL after DLFS_STOP_TIMEOUT_S) and removes
#      its node-local dir.
# Exit status: 0 after a clean stop; etcd's if it exits by itself; 1 for a
# setup error.
#
# Environment (exported by dlfs-job.sbatch; srun passes it on):
#   DLFS_JOB_DIR          shared directory of the job (required)
#   DLFS_LOCAL_ROOT       node-local file system (required)
#   DLFS_ETCD_BIN         the etcd program (default: etcd in PATH; Debian's
#                         etcd-server package)
#   DLFS_LISTEN_HOST      host to listen on (default: `hostname`); 0.0.0.0
#                         listens everywhere and publishes `hostname`
#   DLFS_ETCD_PORT        client port (default: a free one); the peer port
#                         is the next one
#   DLFS_START_TIMEOUT_S  seconds etcd may take to be healthy (default 120)
#   DLFS_STOP_TIMEOUT_S   seconds it may take to stop (default 30)
set -euo pipefail

node=${SLURMD_NODENAME:-}
log() { echo "dlfs-etcd[${node:-?}]: $*" >&2; }
die() { log "error: $*"; exit 1; }

if [ -z "$node" ] || [ -z "${SLURM_JOB_ID:-}" ]; then
    die "SLURMD_NODENAME or SLURM_JOB_ID is not set: run this only as a task of an srun step (dlfs-job.sbatch does)"
fi
job_dir=${DLFS_JOB_DIR:?DLFS_JOB_DIR must name the shared directory of the job}
local_root=${DLFS_LOCAL_ROOT:?DLFS_LOCAL_ROOT must name the node-local file system}
local_dir=$local_root/dlfs-$SLURM_JOB_ID.$node.etcd
start_timeout_s=${DLFS_START_TIMEOUT_S:-120}
stop_timeout_s=${DLFS_STOP_TIMEOUT_S:-30}
port_tries=5
listen_host=${DLFS_LISTEN_HOST:-$(hostname)}
publish_host=$listen_host
case "$listen_host" in
    0.0.0.0 | "[::]" | "::") publish_host=$(hostname) ;;   # reachable name, not the wildcard
esac
etcd=${DLFS_ETCD_BIN:-etcd}

command -v "$etcd" >/dev/null || die "$etcd not found on $(hostname) (install etcd-server, or set DLFS_ETCD_BIN; or give the site's etcd in DLFS_ETCD)"
[ -d "$local_root" ] || die "$local_root does not exist on $(hostname): set DLFS_LOCAL_ROOT to the node-local NVMe file system"

child_name=etcd
child_stop_any_status=1   # etcd exits non-zero on the signal that stops it
# shellcheck source-path=SCRIPTDIR source=dlfs-step.sh
source "$(dirname "${BASH_SOURCE[0]}")/dlfs-step.sh"

# healthy HOST PORT: etcd's /health says true (plain HTTP through bash's /dev/tcp:
# no curl needed on the node).
healthy() {
    local reply
    reply=$( (exec 3<>"/dev/tcp/$1/$2" && printf 'GET /health HTTP/1.0\r\nHost: %s\r\n\r\n' "$1" >&3 \
        && timeout 2 cat <&3) 2>/dev/null) || return 1
    [[ $reply == *'"health":"true"'* ]]
}

own_local_dir
mkdir -p "$job_dir/logs"
etcd_log="$job_dir/logs/$node.etcd.log"

deadline=$((SECONDS + start_timeout_s))
for try in $(seq 1 "$port_tries"); do
    port=${DLFS_ETCD_PORT:-$((20000 + RANDOM % 40000))}
    url="http://$publish_host:$port"
    "$etcd" --name "$node" --data-dir "$local_dir/data" \
        --listen-client-urls "http://$listen_host:$port" --advertise-client-urls "$url" \
        --listen-peer-urls "http://$listen_host:$((port + 1))" \
        --initial-advertise-peer-urls "http://$publish_host:$((port + 1))" \
        --initial-cluster "$node=http://$publish_host:$((port + 1))" \
        --initial-cluster-state new >>"$etcd_log" 2>&1 &
    child_pid=$!
    until healthy "$publish_host" "$port"; do
        if ! kill -0 "$child_pid" 2>/dev/null; then
            wait "$child_pid" && status=0 || status=$?
            child_pid=""
            break
        fi
        [ "$SECONDS" -lt "$deadline" ] || die "etcd was not healthy within ${start_timeout_s}s (DLFS_START_TIMEOUT_S); see $etcd_log"
        sleep 0.2
    done
    [ -z "$child_pid" ] || break
    if [ -n "${DLFS_ETCD_PORT:-}" ] || [ "$try" = "$port_tries" ]; then
        die "etcd exited with status $status before it was healthy; its log, $etcd_log, ends with:
$(tail -n 20 "$etcd_log")"
    fi
    log "etcd could not start on port $port (taken?); trying another"
    rm -rf -- "$local_dir/data"
done

publish "$url" "$job_dir/etcd-url"
publish_step etcd-step
log "etcd serving at $url, data dir $local_dir/data"
serve_until_exit "$etcd_log"
