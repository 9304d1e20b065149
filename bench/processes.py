"""The processes a benchmark run starts, as `dlfs.launch` starts them, set up for measuring.

Both are real subprocesses, started the way an operator starts them, and
stopped by the caller's `with` block (the daemon: SIGTERM, then SIGKILL
after a grace period; a mount: fusermount3 -u).
"""

from __future__ import annotations

from dlfs.launch import DaemonProcess

# Warnings only: a benchmark measures reads, not the daemon's log.  No
# warm-up on first read: rows measure the read path they name, cold or warm;
# bench/warmup.py measures warm-ups (and turns it on where it says so).
DAEMON_ARGS = ["--log-level", "WARNING", "--warm-on-first-read", "off"]


def daemon(data_dir: str, log_path: str, extra_args: list[str] | None = None) -> DaemonProcess:
    """A daemon on `data_dir` on 127.0.0.1 with a free port; not started (use `with`)."""
    return DaemonProcess(data_dir, log_path, DAEMON_ARGS + list(extra_args or []))
