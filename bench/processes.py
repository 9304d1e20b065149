"""The processes a benchmark run starts, as `dlfs.tools.launch` starts them, set up for measuring.

Both are real subprocesses, started the way an operator starts them, and
stopped by the caller's `with` block (the daemon: SIGTERM, then SIGKILL
after a grace period; a mount: fusermount3 -u).
"""

from __future__ import annotations

import contextlib

from dlfs.tools.launch import DaemonProcess

# Warnings only: a benchmark measures reads, not the daemon's log.  No
# warm-up on first read: rows measure the read path they name, cold or warm;
# bench/warmup.py measures warm-ups (and turns it on where it says so).
DAEMON_ARGS = ["--log-level", "WARNING", "--warm-on-first-read", "off"]


def daemon(data_dir: str, log_path: str, extra_args: list[str] | None = None) -> DaemonProcess:
    """A daemon on `data_dir` on 127.0.0.1 with a free port; not started (use `with`)."""
    return DaemonProcess(data_dir, log_path, DAEMON_ARGS + list(extra_args or []))


PIPE_MAX_SIZE = "/proc/sys/fs/pipe-max-size"


@contextlib.contextmanager
def splice_pipes():
    """Yields how the mounts of this run read large files: a co-located `dlfs-mount`
    answers them by splice when pipes of 2 MiB can be made (fuse/splicereads.py).
    Where they cannot and this is root, fs.pipe-max-size is raised to 2 MiB for the
    run (the deployment setting README names) and restored after."""
    from dlfs.fuse import splicereads

    reason = splicereads.pipe_bytes_available()
    if not reason:
        yield "splice (pipes of 2 MiB allowed)"
        return
    try:
        with open(PIPE_MAX_SIZE) as f:
            before = f.read().strip()
        with open(PIPE_MAX_SIZE, "w") as f:
            f.write(str(2 << 20))
    except OSError:
        yield f"through the daemon ({reason})"
        return
    try:
        yield f"splice (fs.pipe-max-size raised from {before} to {2 << 20} for the run)"
    finally:
        with open(PIPE_MAX_SIZE, "w") as f:
            f.write(before)
