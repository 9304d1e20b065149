# Sourced by dlfs-node.sh and dlfs-etcd.sh, not run: what both do to keep one
# child process (dlfs-server, etcd) for the length of a Slurm job step, in a
# node-local directory the step creates and removes.
#
# The sourcing script defines log and die, and sets node, job_dir, local_dir,
# stop_timeout_s and child_name (for messages) before calling own_local_dir; it sets child_pid
# once the child runs.  child_stop_any_status=1: a child stopped by a signal
# counts as a clean stop whatever its exit status (etcd exits non-zero on one).
# shellcheck shell=bash
# shellcheck disable=SC2154  # node, job_dir, local_dir, ...: set by the sourcing script

signal_grace_s=2
child_pid=""
child_stop_any_status=${child_stop_any_status:-0}
stopping=0

# shellcheck disable=SC2317  # runs from a trap; shellcheck 0.9 calls that unreachable
stop_child() {
    [ -n "$child_pid" ] || return 0
    # A signal to the step (scancel --signal, job cancel) reaches every
    # process of it, the child too: give it signal_grace_s to stop on that
    # one before sending another (two signals back to back are redundant, and
    # make today's dlfs-server hang now and then).
    local deadline=$((SECONDS + signal_grace_s))
    while [ "$stopping" = 1 ] && [ "$SECONDS" -lt "$deadline" ] && kill -0 "$child_pid" 2>/dev/null; do
        sleep 0.1
    done
    kill -TERM "$child_pid" 2>/dev/null || true
    deadline=$((SECONDS + stop_timeout_s))
    while kill -0 "$child_pid" 2>/dev/null; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            log "$child_name did not stop within ${stop_timeout_s}s (DLFS_STOP_TIMEOUT_S); killing it"
            kill -KILL "$child_pid" 2>/dev/null || true
            break
        fi
        sleep 0.2
    done
}

# shellcheck disable=SC2317  # runs from a trap; shellcheck 0.9 calls that unreachable
cleanup() {
    local status=$?
    trap - EXIT
    stop_child
    local child_status=0
    if [ -n "$child_pid" ]; then
        wait "$child_pid" 2>/dev/null || child_status=$?
    fi
    rm -rf -- "$local_dir"
    if [ "$stopping" = 1 ] && { [ "$child_status" = 0 ] || [ "$child_stop_any_status" = 1 ]; }; then
        log "$child_name stopped, $local_dir removed"
        exit 0
    fi
    [ "$status" != 0 ] || status=$child_status
    exit "$status"
}

# shellcheck disable=SC2317  # runs from a trap; shellcheck 0.9 calls that unreachable
on_signal() {
    stopping=1
    log "$1: stopping $child_name"
    exit 0   # runs cleanup (EXIT trap)
}

# own_local_dir: create local_dir, and from then on remove it (and stop the child)
# on exit and on SIGTERM, SIGINT, SIGHUP.  mkdir without -p fails if the directory
# exists: never adopt (and later delete) a directory this job did not create.
own_local_dir() {
    mkdir -m 0700 "$local_dir" || die "cannot create $local_dir (exists already, or no permission)"
    trap cleanup EXIT
    trap 'on_signal SIGTERM' TERM
    trap 'on_signal SIGINT' INT
    trap 'on_signal SIGHUP' HUP
    echo "$SLURM_JOB_ID" >"$local_dir/.dlfs-job"   # marks it as ours for the batch script's cleanup
}

# publish VALUE PATH: write VALUE into the shared file PATH atomically (a reader
# sees the old file or the whole new one).
publish() {
    local tmp
    tmp="$(dirname "$2")/.$(basename "$2").$node.$$"   # one per task, whatever the host
    echo "$1" >"$tmp" && mv -f "$tmp" "$2"
}

# publish_step NAME: the job step this task runs in, in $job_dir/NAME, for
# dlfs-job.sbatch to signal it (scancel --signal) at the end of the job.
publish_step() {
    if [ -n "${SLURM_STEP_ID:-}" ]; then
        publish "$SLURM_JOB_ID.$SLURM_STEP_ID" "$job_dir/$1"
    fi
}

# serve_until_exit LOG: wait for the child; a trapped signal ends the wait early
# and its trap exits.  Exits with the child's status when it ends by itself.
serve_until_exit() {
    local status=0
    wait "$child_pid" || status=$?
    child_pid=""
    log "$child_name exited by itself with status $status; its log: $1"
    exit "$status"
}
