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
signal_grace_s=2
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

daemon_pid=""
stopping=0

# shellcheck disable=SC2317  # runs from a trap; shellcheck 0.9 calls that unreachable
stop_daemon() {
    [ -n "$daemon_pid" ] || return 0
    # A signal to the step (scancel --signal, job cancel) reaches every
    # process of it, the daemon too: give it signal_grace_s to stop on that
    # one before sending another (two signals back to back are redundant, and
    # make today's dlfs-server hang now and then).
    local deadline=$((SECONDS + signal_grace_s))
    while [ "$stopping" = 1 ] && [ "$SECONDS" -lt "$deadline" ] && kill -0 "$daemon_pid" 2>/dev/null; do
        sleep 0.1
    done
    kill -TERM "$daemon_pid" 2>/dev/null || true
    deadline=$((SECONDS + stop_timeout_s))
    while kill -0 "$daemon_pid" 2>/dev/null; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            log "dlfs-server did not stop within ${stop_timeout_s}s (DLFS_STOP_TIMEOUT_S); killing it"
            kill -KILL "$daemon_pid" 2>/dev/null || true
            break
        fi
        sleep 0.2
    done
}

# shellcheck disable=SC2317  # runs from a trap; shellcheck 0.9 calls that unreachable
cleanup() {
    local status=$?
    trap - EXIT
    stop_daemon
    local daemon_status=0
    if [ -n "$daemon_pid" ]; then
        wait "$daemon_pid" 2>/dev/null || daemon_status=$?
    fi
    rm -rf -- "$local_dir"
    if [ "$stopping" = 1 ] && [ "$daemon_status" = 0 ]; then
        log "daemon stopped, $local_dir removed"
        exit 0
    fi
    [ "$status" != 0 ] || status=$daemon_status
    exit "$status"
}
# shellcheck disable=SC2317  # runs from a trap; shellcheck 0.9 calls that unreachable
on_signal() {
    stopping=1
    log "$1: stopping the daemon"
    exit 0   # runs cleanup (EXIT trap)
}

# mkdir without -p fails if the directory exists: never adopt (and later
# delete) a directory this job did not create.  The traps come after it.
mkdir -m 0700 "$local_dir" || die "cannot create $local_dir (exists already, or no permission)"
trap cleanup EXIT
trap 'on_signal SIGTERM' TERM
trap 'on_signal SIGINT' INT
trap 'on_signal SIGHUP' HUP

echo "$SLURM_JOB_ID" >"$local_dir/.dlfs-job"   # marks it as ours for the batch script's cleanup
mkdir -p "$job_dir/nodes" "$job_dir/logs"
daemon_log="$job_dir/logs/$node.log"
"$server" --data-dir "$local_dir/data" --listen "$listen_host:$port" \
    --address-file "$local_dir/address" ${extra_args[@]+"${extra_args[@]}"} \
    >>"$daemon_log" 2>&1 &
daemon_pid=$!

deadline=$((SECONDS + start_timeout_s))
while [ ! -s "$local_dir/address" ]; do
    kill -0 "$daemon_pid" 2>/dev/null || {
        wait "$daemon_pid" && status=0 || status=$?
        daemon_pid=""
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
tmp="$job_dir/nodes/.$node.$$"
echo "$address" >"$tmp" && mv -f "$tmp" "$job_dir/nodes/$node.address"
if [ -n "${SLURM_STEP_ID:-}" ]; then
    tmp="$job_dir/.daemon-step.$node.$$"
    echo "$SLURM_JOB_ID.$SLURM_STEP_ID" >"$tmp" && mv -f "$tmp" "$job_dir/daemon-step"
fi
log "serving on $address, data dir $local_dir/data"

# `wait` returns early when a trapped signal arrives; the trap then exits.
status=0
wait "$daemon_pid" || status=$?
daemon_pid=""
log "dlfs-server exited by itself with status $status; its log: $daemon_log"
exit "$status"
