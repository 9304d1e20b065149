"""The processes a benchmark run starts: the DLFS daemon and, when it exists, the FUSE mount.

Both are real subprocesses, started the way an operator starts them, and
always stopped (SIGTERM, then SIGKILL after a grace period) by the caller's
`with` block.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time

from bench.measure import proc_status_kib

STARTUP_TIMEOUT_S = 60.0


class Daemon:
    """`python -m dlfs.server.main` on a data dir, on 127.0.0.1 with a free port."""

    def __init__(self, data_dir: str, log_path: str, extra_args: list[str] | None = None):
        self.data_dir = data_dir
        self.log_path = log_path
        self.extra_args = list(extra_args or [])
        self.process: subprocess.Popen | None = None
        self.address = ""
        self.startup_s = 0.0

    def __enter__(self) -> "Daemon":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> str:
        address_file = os.path.join(os.path.dirname(os.path.abspath(self.log_path)),
                                    f"daemon-{os.getpid()}.addr")
        if os.path.exists(address_file):
            os.unlink(address_file)
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "dlfs.server.main", "--data-dir", self.data_dir,
                 "--listen", "127.0.0.1:0", "--address-file", address_file, "--log-level",
                 "WARNING", *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = started + STARTUP_TIMEOUT_S
        while not os.path.exists(address_file):
            if self.process.poll() is not None:
                raise RuntimeError(f"dlfs-server exited with {self.process.returncode}; "
                                   f"see {self.log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"dlfs-server did not start in {STARTUP_TIMEOUT_S} s; "
                                   f"see {self.log_path}")
            time.sleep(0.01)
        self.startup_s = time.monotonic() - started
        with open(address_file) as f:
            self.address = f.read().strip()
        os.unlink(address_file)
        return self.address

    def rss_kib(self) -> int:
        return proc_status_kib(self.pid, "VmRSS")

    def hwm_kib(self) -> int:
        return proc_status_kib(self.pid, "VmHWM")

    def stop(self, grace_s: float = 20.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def fuse_available() -> str:
    """"" when `dlfs-mount` can run here, else why not."""
    try:
        spec = importlib.util.find_spec("dlfs.fuse.main")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return "not available: dlfs.fuse.main does not exist yet"
    if not os.path.exists("/dev/fuse"):
        return "not available: no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "not available: fusermount3 not installed"
    return ""


class FuseMount:
    """`dlfs-mount --foreground ADDRESS MOUNTPOINT` as a subprocess; unmounted on exit.

    Every dataset appears as MOUNTPOINT/<dataset name>/<sample path>.
    """

    def __init__(self, address: str, mountpoint: str, log_path: str):
        self.address = address
        self.mountpoint = mountpoint
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "FuseMount":
        os.makedirs(self.mountpoint, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "dlfs.fuse.main", "--foreground", self.address,
                 self.mountpoint],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not os.path.ismount(self.mountpoint):
            if self.process.poll() is not None:
                raise RuntimeError(f"dlfs-mount exited with {self.process.returncode}; "
                                   f"see {self.log_path}")
            if time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"dlfs-mount did not mount in {STARTUP_TIMEOUT_S} s")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        if os.path.ismount(self.mountpoint):
            subprocess.run(["fusermount3", "-u", self.mountpoint], capture_output=True)
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
