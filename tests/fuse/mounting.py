"""Helpers for the FUSE tests: real `dlfs-mount` processes on real daemons.

Test modules import `mount_factory` (a fixture) and `requires_fuse` from
here; a conftest.py in this directory would shadow tests/conftest.py's
helpers (`from conftest import write_tree`), hence a plain module.

`mount_factory` starts ``python -m dlfs.fuse.main ADDR MNT --foreground`` as
a user would under systemd, waits until the mount answers, and at teardown
unmounts with ``fusermount3 -u`` (lazily if busy) and reaps the process,
even when the test failed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

MOUNT_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 30.0

# Skipped on a developer machine without FUSE; under CI (.ci/run sets CI=true)
# a missing FUSE is a failure, not a skip.
requires_fuse = pytest.mark.skipif(
    not os.environ.get("CI") and (shutil.which("fusermount3") is None
                                  or not os.path.exists("/dev/fuse")),
    reason="FUSE is not available (needs the fuse3 package and /dev/fuse)")


def is_mounted(path: str) -> bool:
    path = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


def unmount(path: str) -> None:
    """Unmount `path` if it is a mount; lazily if the normal way fails."""
    if not is_mounted(path):
        return
    if subprocess.run(["fusermount3", "-u", path], capture_output=True).returncode != 0:
        subprocess.run(["fusermount3", "-u", "-z", path], capture_output=True)


class Mount:
    """One `dlfs-mount --foreground` process and its mount point."""

    def __init__(self, path: str, log_path: str, process: subprocess.Popen):
        self.path = path
        self.log_path = log_path
        self.process = process

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while "serving" not in self.log():
            if self.process.poll() is not None:
                raise RuntimeError(f"dlfs-mount exited with {self.process.returncode}:\n"
                                   + self.log())
            if time.monotonic() > deadline:
                raise RuntimeError("dlfs-mount did not become ready:\n" + self.log())
            time.sleep(0.02)
        assert is_mounted(self.path)

    def unmount(self) -> int:
        """fusermount3 -u, then wait for the process; its exit status."""
        unmount(self.path)
        try:
            return self.process.wait(EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


@pytest.fixture
def mount_factory(tmp_path):
    """mount(address, *args) -> Mount: a foreground mount on a fresh directory."""
    mounts: list[Mount] = []

    def mount(address: str, *args: str) -> Mount:
        path = str(tmp_path / f"mnt{len(mounts)}")
        os.mkdir(path)
        log_path = str(tmp_path / f"mount{len(mounts)}.log")
        with open(log_path, "ab") as log:  # libfuse and crashes write to stderr
            process = subprocess.Popen(
                [sys.executable, "-m", "dlfs.fuse.main", address, path, "--foreground",
                 "--log-file", log_path, *args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        m = Mount(path, log_path, process)
        mounts.append(m)
        m.wait_ready()
        return m

    yield mount
    for m in mounts:
        unmount(m.path)
        if m.process.poll() is None:
            try:
                m.process.wait(EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                m.process.kill()
                m.process.wait()
