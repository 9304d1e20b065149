"""A source with a fixed extra latency per open: `latencyfs.c`, built and mounted.

`LatencyMount(backing, mountpoint, delay_us, build_dir)` compiles
bench/latencyfs.c once (gcc and the fuse3 headers, which `./dev setup`
installs; the binary is cached in `build_dir` by the source's hash), mounts
it in the foreground as a child process and unmounts it when the `with`
block ends.  `unavailable()` says why it cannot run here ("" when it can).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time

from dlfs.tools.launch import fuse_unavailable

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "latencyfs.c")


def unavailable() -> str:
    """Why the latency file system cannot be used here, or ""."""
    reason = fuse_unavailable()
    if reason:
        return reason
    if shutil.which("gcc") is None:
        return "gcc is not installed (./dev setup installs it)"
    if subprocess.run(["pkg-config", "--exists", "fuse3"], capture_output=True).returncode:
        return "the fuse3 headers are not installed (apt-get install libfuse3-dev)"
    return ""


def build(build_dir: str) -> str:
    """The path of the compiled latencyfs binary (built when its source changed)."""
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    binary = os.path.join(build_dir, f"latencyfs-{digest}")
    if os.path.exists(binary):
        return binary
    os.makedirs(build_dir, exist_ok=True)
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], check=True,
                           capture_output=True, text=True).stdout.split()
    tmp = binary + ".tmp"
    subprocess.run(["gcc", "-O2", "-Wall", "-o", tmp, SOURCE, *flags], check=True,
                   capture_output=True, text=True)
    os.rename(tmp, binary)
    return binary


class LatencyMount:
    """`backing` mounted read-only at `mountpoint`, every open delayed by `delay_us`."""

    def __init__(self, backing: str, mountpoint: str, delay_us: int, build_dir: str,
                 threads: int = 128):
        self.backing = backing
        self.mountpoint = mountpoint
        self.delay_us = delay_us
        self.binary = build(build_dir)
        self.threads = threads
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> "LatencyMount":
        os.makedirs(self.mountpoint, exist_ok=True)
        subprocess.run(["fusermount3", "-u", "-q", self.mountpoint], capture_output=True)
        self._process = subprocess.Popen(
            [self.binary, self.backing, self.mountpoint, str(self.delay_us), "-f",
             "-o", f"max_threads={self.threads}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while not os.path.ismount(self.mountpoint):
            if self._process.poll() is not None or time.monotonic() > deadline:
                error = self._process.stderr.read().decode(errors="replace") if \
                    self._process.poll() is not None else "timed out"
                self.__exit__()
                raise RuntimeError(f"latencyfs did not mount: {error.strip()[:500]}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(["fusermount3", "-u", "-q", self.mountpoint], capture_output=True)
        if self._process is not None:
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
