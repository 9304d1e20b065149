#!/usr/bin/env bash
# One DLFS daemon on this node, for the length of a Slurm job step.
#
# dlfs-job.sbatch starts this as one task per node (srun --ntasks-per-node=1);
# it is not meant to be run by hand.  It
#   1. creates its node-local dir $DLFS_LOCAL_ROOT/dlfs-$SLURM_JOB_ID.NODE
#      (refusing one that already exists: it only ever deletes what it
#      created; the node name in it lets several slurmd share one host),
#   2. starts dlfs-server on it, listening on $DLFS_LISTEN_HOST:$DLFS_PORT,
#   3. once the daemon serves, publishes "HOST:PORT" in
#      $DLFS_JOB_DIR/nodes/$SLURMD_NODENAME.address (atomically) and the step
#      id in $DLFS_JOB_DIR/daemon-step,
#   4. waits; on SIGTERM/SIGINT/SIGHUP it stops the daemon (which Slurm has
#      usually signalled as well: 2 s for that, then SIGTERM, then SIGKILL
#      after DLFS_STOP_TIMEOUT_S) and removes its node-local dir.
# Exit status: the daemon's (0 after a clean stop); 1 for a setup error.
#
# Environment (exported by dlfs-job.sbatch; srun passes it on):
#   DLFS_JOB_DIR        shared directory of the job (required)
#   DLFS_LOCAL_ROOT     node-local file system, e.g. the NVMe (required)
#   DLFS_BIN_DIR        directory of dlfs-server (default: found in PATH)
#   DLFS_LISTEN_HOST    host to listen on (default: `hostname`); 0.0.0.0 or
#                       :: listen everywhere and publish `hostname`
#   DLFS_PORT           port (default 0: any free port)
#   DLFS_SERVER_ARGS    further dlfs-server flags, split on white space
#   DLFS_ETCD           etcd client URL(s) of the job's cluster: the daemon joins
#                       it as a member (--etcd), in cluster DLFS_CLUSTER (default:
#                       job-$SLURM_JOB_ID); unset: the daemon runs on its own
#   DLFS_INSECURE       1 (default): pass --insecure, so a daemon listening on
#                       the cluster network without TLS and tokens starts; 0: not
#   DLFS_START_TIMEOUT_S  seconds the daemon may take to serve (default 120)
#   DLFS_STOP_TIMEOUT_S   seconds it may take to stop (default 30)
set -euo pipefail

node=${SLURMD_NODENAME:-}
log() { echo "dlfs-node[${node:-?}]: $*" >&2; }
die() { log "error: $*"; exit 1; }

if [ -z "$node" ] || [ -z "${SLURM_JOB_ID:-}" ]; then
    die "SLURMD_NODENAME or SLURM_JOB_ID is not set: run this only as a task of an srun step (dlfs-job.sbatch does)"
fi
job_dir=${DLFS_JOB_DIR:?DLFS_JOB_DIR must name the shared directory of the job}
local_root=${DLFS_LOCAL_ROOT:?DLFS_LOCAL_ROOT must name the node-local file system}
local_dir=$local_root/dlfs-$SLURM_JOB_ID.$node
start_timeout_s=${DLFS_START_TIMEOUT_S:-120}
stop_timeout_s=${DLFS_STOP_TIMEOUT_S:-30}
listen_host=${DLFS_LISTEN_HOST:-$(hostname)}
port=${DLFS_PORT:-0}
server=${DLFS_BIN_DIR:+$DLFS_BIN_DIR/}dlfs-server
read -r -a extra_args <<<"${DLFS_SERVER_ARGS:-}"
if [ -n "${DLFS_ETCD:-}" ]; then
    extra_args+=(--etcd "$DLFS_ETCD" --cluster "${DLFS_CLUSTER:-job-$SLURM_JOB_ID}")
fi
case "${DLFS_INSECURE:-1}" in
    1) extra_args+=(--insecure) ;;
    0) ;;
    *) die "DLFS_INSECURE must be 0 or 1, not '${DLFS_INSECURE}'" ;;
esac

command -v "$server" >/dev/null || die "$server not found on $(hostname) (set DLFS_BIN_DIR or PATH)"
[ -d "$local_root" ] || die "$local_root does not exist on $(hostname): set DLFS_LOCAL_ROOT to the node-local NVMe file system"

child_name=dlfs-server
# shellcheck source-path=SCRIPTDIR source=dlfs-step.sh
source "$(dirname "${BASH_SOURCE[0]}")/dlfs-step.sh"
own_local_dir

mkdir -p "$job_dir/nodes" "$job_dir/logs"
daemon_log="$job_dir/logs/$node.log"
"$server" --data-dir "$local_dir/data" --listen "$listen_host:$port" \
    --address-file "$local_dir/address" ${extra_args[@]+"${extra_args[@]}"} \
    >>"$daemon_log" 2>&1 &
child_pid=$!

deadline=$((SECONDS + start_timeout_s))
while [ ! -s "$local_dir/address" ]; do
    kill -0 "$child_pid" 2>/dev/null || {
        wait "$child_pid" && status=0 || status=$?
        child_pid=""
        die "dlfs-server exited with status $status before serving; its log, $daemon_log, ends with:
$(tail -n 20 "$daemon_log")"
    }
    [ "$SECONDS" -lt "$deadline" ] || die "dlfs-server did not serve within ${start_timeout_s}s (DLFS_START_TIMEOUT_S); see $daemon_log"
    sleep 0.2
done

bound=$(cat "$local_dir/address")
host=${bound%:*}
case "$host" in
    0.0.0.0 | "[::]" | "::") host=$(hostname) ;;   # reachable name, not the wildcard
esac
address="$host:${bound##*:}"
publish "$address" "$job_dir/nodes/$node.address"
publish_step daemon-step
log "serving on $address, data dir $local_dir/data"
serve_until_exit "$daemon_log"
