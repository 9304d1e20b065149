"""Start `dlfs-server` and `dlfs-mount` as subprocesses and wait until they serve.

One launcher for the tests and the benchmarks.  Both programs run as real
processes, started as an operator starts them (``python -m dlfs.server.server_cli``,
``python -m dlfs.fuse.mount_cli --foreground``), with stdout and stderr appended to
a log file; this module imports neither.

Readiness is a file each program writes once it serves: the daemon's
``--address-file`` (its bound HOST:PORT, so port 0 works) and the mount's
``--ready-file`` (written once a stat of the mount point answered).  A
process that exits before that, or does not get there within
`STARTUP_TIMEOUT_S`, raises `LaunchError` carrying the tail of its log.

    with DaemonProcess(data_dir, log_path) as daemon:
        with MountProcess(daemon.address, mountpoint, mount_log_path) as mount:
            ...  # files under mount.mountpoint
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from dlfs.version import install_line

# Generous: a daemon replays its catalog before it binds, and a loaded 2-core
# machine can take seconds to start Python and gRPC.
STARTUP_TIMEOUT_S = 60.0
# SIGTERM to SIGKILL: the daemon flushes its catalog, a mount drains requests.
STOP_GRACE_S = 30.0
# A SIGKILLed process is reaped within this; longer means it is stuck in the kernel.
KILL_WAIT_S = 10.0
# How often the readiness file is looked for: well below any startup time.
POLL_INTERVAL_S = 0.02
# Lines of the log an error message quotes.
LOG_TAIL_LINES = 40

MOUNT_MODULE = "dlfs.fuse.mount_cli"
SERVER_MODULE = "dlfs.server.server_cli"


class LaunchError(RuntimeError):
    """A daemon or mount did not start, or exited on its own; the message ends with its log."""


def log_tail(log_path: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of `log_path` ("" if it does not exist).  Cost: reads the file."""
    try:
        with open(log_path, "rb") as f:
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.rstrip("\n").split("\n")[-lines:])


def _failure(what: str, log_path: str) -> LaunchError:
    return LaunchError(f"{what}; the end of {log_path}:\n{log_tail(log_path)}")


def wait_for_file(path: str, process: subprocess.Popen, name: str, log_path: str) -> None:
    """Return once `path` exists (a readiness file `process` writes).

    Raises LaunchError, with the tail of `log_path`, if `process` exits first
    or STARTUP_TIMEOUT_S pass; the caller stops the process.  Polls every
    POLL_INTERVAL_S.
    """
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not os.path.exists(path):
        if process.poll() is not None:
            raise _failure(f"{name} exited with status {process.returncode} before serving",
                           log_path)
        if time.monotonic() > deadline:
            raise _failure(f"{name} did not serve within {STARTUP_TIMEOUT_S:.0f} s "
                           "(STARTUP_TIMEOUT_S)", log_path)
        time.sleep(POLL_INTERVAL_S)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _kill(process: subprocess.Popen) -> int:
    """SIGKILL `process` if it still runs and reap it; its exit status."""
    if process.poll() is None:
        process.kill()
    return process.wait(KILL_WAIT_S)


class _Launched:
    """What a launched daemon, mount and etcd have in common: a subprocess, its log file,
    and how it is stopped."""

    process: subprocess.Popen | None
    log_path: str

    @property
    def pid(self) -> int:
        assert self.process is not None, "never started"
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        """Everything the process wrote to its log so far, over all its starts."""
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self, grace_s: float = STOP_GRACE_S) -> int:
        """SIGTERM, SIGKILL after `grace_s`; the exit status (-9 if it had to
        be killed, 0 if it was never started)."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        return _kill(self.process)

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as in a crash."""
        if self.process is not None:
            _kill(self.process)


class DaemonProcess(_Launched):
    """`dlfs-server --data-dir DATA_DIR` as a subprocess; restartable on the same data dir.

    `address` is HOST:PORT once started.  `log_path` collects stdout and
    stderr of every start.  Not thread-safe.
    """

    def __init__(self, data_dir: str, log_path: str, extra_args: list[str] | None = None,
                 extra_env: dict[str, str] | None = None):
        self.data_dir = data_dir
        self.log_path = log_path
        self.extra_args = list(extra_args or [])
        # Environment added to this process's for the next starts (e.g. DLFS_FAULT).
        self.extra_env = dict(extra_env or {})
        self.process: subprocess.Popen | None = None
        self.address = ""
        self.startup_s = 0.0  # how long the last start took, until the daemon served
        self._address_file = log_path + ".address"

    def __enter__(self) -> "DaemonProcess":
        if not self.alive():
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, listen: str = "127.0.0.1:0") -> str:
        """Start on `listen` and wait until the daemon serves; its address.

        Raises LaunchError (with the log's tail) if it exits first or does
        not serve within STARTUP_TIMEOUT_S (then it is killed).
        """
        assert not self.alive(), "the daemon is running; stop or kill it first"
        _remove(self._address_file)
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", SERVER_MODULE, "--data-dir", self.data_dir,
                 "--listen", listen, "--address-file", self._address_file, *self.extra_args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, **self.extra_env} if self.extra_env else None)
        try:
            wait_for_file(self._address_file, self.process, "dlfs-server", self.log_path)
        except LaunchError:
            _kill(self.process)
            raise
        self.startup_s = time.monotonic() - started
        with open(self._address_file) as f:
            self.address = f.read().strip()
        os.unlink(self._address_file)
        return self.address

    def restart(self) -> str:
        """Stop cleanly and start again on the same port and data dir; the address."""
        self.stop()
        return self.start_again()

    def start_again(self) -> str:
        """Start (after `stop` or `kill`) on 127.0.0.1 and the port of the last start,
        so clients and cluster member lists that name it reach it again."""
        return self.start(f"127.0.0.1:{self.address.rpartition(':')[2]}")


def fuse_unavailable() -> str:
    """"" when `dlfs-mount` can run here, else why not."""
    if importlib.util.find_spec("trio") is None:
        return f"trio is not installed ({install_line('fuse')} in a checkout of DLFS)"
    if ctypes.util.find_library("fuse3") is None:
        return "libfuse3 is not installed (the fuse3 package)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse (load the fuse kernel module)"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (the fuse3 package)"
    return ""


def is_mounted(path: str) -> bool:
    """Whether a file system is mounted on `path` (/proc/self/mounts)."""
    path = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


def unmount(path: str) -> None:
    """`fusermount3 -u path` if something is mounted there; lazily (-z) if it is busy."""
    if not is_mounted(path):
        return
    if subprocess.run(["fusermount3", "-u", path], capture_output=True).returncode != 0:
        subprocess.run(["fusermount3", "-u", "-z", path], capture_output=True)


class MountProcess(_Launched):
    """``python -m MODULE [ADDRESS] MOUNTPOINT --foreground --ready-file F [EXTRA_ARGS]``
    as a subprocess: `dlfs-mount` by default (no ADDRESS: a cluster mount, with
    --etcd in EXTRA_ARGS).

    `module` may name another file system with that command line (the
    benchmark's naive mount).  Its stdout and stderr (log lines, libfuse,
    crashes) append to `log_path`.  Not thread-safe.
    """

    def __init__(self, address: str, mountpoint: str, log_path: str,
                 extra_args: list[str] | None = None, module: str = MOUNT_MODULE):
        self.address = address
        self.mountpoint = mountpoint
        self.log_path = log_path
        self.extra_args = list(extra_args or [])
        self.module = module
        self.process: subprocess.Popen | None = None
        self._ready_file = log_path + ".ready"

    def __enter__(self) -> "MountProcess":
        if not self.alive():
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.unmount()

    def start(self) -> "MountProcess":
        """Create the mount point if missing, mount, and wait until the mount answers.

        Raises LaunchError (with the log's tail) if the process exits first
        or the mount is not usable within STARTUP_TIMEOUT_S (then it is
        unmounted and killed).
        """
        assert not self.alive(), "the mount is running; unmount it first"
        os.makedirs(self.mountpoint, exist_ok=True)
        _remove(self._ready_file)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", self.module, *([self.address] if self.address else []),
                 self.mountpoint, "--foreground", "--ready-file", self._ready_file, *self.extra_args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        try:
            wait_for_file(self._ready_file, self.process, self.module, self.log_path)
        except LaunchError:
            unmount(self.mountpoint)
            _kill(self.process)
            raise
        os.unlink(self._ready_file)
        assert is_mounted(self.mountpoint), f"{self.module} is ready but nothing is mounted"
        return self

    def request_counts(self, timeout_s: float = STARTUP_TIMEOUT_S, *,
                       label: str = "requests") -> dict[str, int]:
        """The requests the mount's Python code has answered so far, by kind
        (``{"read": 12, "lookup": 3, ...}``), or with ``label="daemon calls"``
        the calls it made to the daemon (``{"stat": 2, "read": 12, ...}``):
        SIGUSR1 makes `dlfs-mount` log both as ``LABEL: {...}`` lines.
        Raises LaunchError if no new line comes within `timeout_s`."""
        assert self.alive(), "the mount is not running"
        marker = f"{label}: {{"

        def lines() -> list[str]:
            with open(self.log_path, errors="replace") as f:
                return [line for line in f if marker in line]

        before = len(lines())
        self.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout_s
        while len(found := lines()) == before:
            if time.monotonic() > deadline or not self.alive():
                raise _failure(f"{self.module} logged no request counts after SIGUSR1",
                               self.log_path)
            time.sleep(POLL_INTERVAL_S)
        line = found[-1]
        if line.lstrip().startswith("{"):  # --log-format json: the counts are in "message"
            line = json.loads(line)["message"]
        return json.loads(line.split(f"{label}: ", 1)[1])

    def unmount(self, timeout_s: float = STOP_GRACE_S) -> int:
        """`fusermount3 -u` (lazily if busy), then wait for the process; its
        exit status (-9 if it did not exit within `timeout_s` and was killed,
        0 if it was never started)."""
        unmount(self.mountpoint)
        if self.process is None:
            return 0
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return _kill(self.process)


# --- etcd: the cluster's control plane (docs/cluster.md) -------------------------------------

ETCD_BINARY = "etcd"  # Debian's etcd-server package (3.4.23 is what the tests ran on)
# Raft timings of the etcd members launched here (etcd's defaults: 100 ms and 1000 ms).
# A shorter election timeout elects a new leader after a kill, or a first one at start,
# in about half the time; 5 heartbeats per timeout still ride out a busy machine.
ETCD_HEARTBEAT_MS = 100
ETCD_ELECTION_TIMEOUT_MS = 500


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (etcd needs its ports named
    before it starts: a cluster's members list each other's)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def etcd_unavailable() -> str:
    """"" when `etcd` can run here, else why not."""
    if shutil.which(ETCD_BINARY) is None:
        return "etcd is not installed (Debian's etcd-server package: apt-get install etcd-server)"
    return ""


class EtcdProcess(_Launched):
    """One etcd member on loopback ports, as a subprocess; restartable on its data dir.

    `url` is its client URL.  `cluster` is the --initial-cluster list
    (name=peer URL, ...); empty: a one-member cluster of its own.  Ready
    when its /health says true (a member of several: once they elected a
    leader).  Not thread-safe.
    """

    def __init__(self, data_dir: str, log_path: str, name: str = "n0",
                 client_port: int = 0, peer_port: int = 0, cluster: str = ""):
        self.data_dir = data_dir
        self.log_path = log_path
        self.name = name
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        self.peer_url = f"http://127.0.0.1:{self.peer_port}"
        self.cluster = cluster or f"{name}={self.peer_url}"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "EtcdProcess":
        if not self.alive():
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.kill()

    def launch(self) -> None:
        """Start the process without waiting (a cluster starts every member first)."""
        assert not self.alive(), "etcd is running; stop or kill it first"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [ETCD_BINARY, "--name", self.name, "--data-dir", self.data_dir,
                 "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                 "--listen-peer-urls", self.peer_url,
                 "--initial-advertise-peer-urls", self.peer_url,
                 "--initial-cluster", self.cluster, "--initial-cluster-state", "new",
                 "--heartbeat-interval", str(ETCD_HEARTBEAT_MS),
                 "--election-timeout", str(ETCD_ELECTION_TIMEOUT_MS),
                 "--logger", "zap", "--log-outputs", "stderr"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        """Return once /health says true.  Raises LaunchError (the log's tail) if the
        process exits first or STARTUP_TIMEOUT_S pass."""
        import urllib.request

        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise _failure(f"etcd exited with status {self.process.returncode}",
                               self.log_path)
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as reply:
                    if json.loads(reply.read()).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise _failure(f"etcd was not healthy within {STARTUP_TIMEOUT_S:.0f} s",
                               self.log_path)
            time.sleep(POLL_INTERVAL_S * 5)

    def start(self) -> str:
        """Start and wait until it is healthy; its client URL."""
        self.launch()
        try:
            self.wait_ready()
        except LaunchError:
            _kill(self.process)
            raise
        return self.url

    start_again = start  # the same ports and data dir: members and clients find it again


class EtcdCluster:
    """`size` etcd members on loopback, each in `root/etcdN` with log `root/etcdN.log`.

    `urls` is every client URL joined by ',' (what --etcd takes).  `leader()`
    names the member that leads now.  Not thread-safe.
    """

    def __init__(self, root: str, size: int = 1):
        os.makedirs(root, exist_ok=True)
        peers = [(f"n{i}", free_port(), free_port()) for i in range(size)]
        cluster = ",".join(f"{name}=http://127.0.0.1:{peer}" for name, _, peer in peers)
        self.members = [EtcdProcess(os.path.join(root, f"etcd{i}"),
                                    os.path.join(root, f"etcd{i}.log"), name, client, peer,
                                    cluster)
                        for i, (name, client, peer) in enumerate(peers)]
        self.urls = ",".join(member.url for member in self.members)

    def __enter__(self) -> "EtcdCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.kill()

    def start(self) -> str:
        """Start every member, wait until all are healthy; `urls`."""
        for member in self.members:
            member.launch()
        try:
            for member in self.members:
                member.wait_ready()
        except LaunchError:
            self.kill()
            raise
        return self.urls

    def leader(self, timeout_s: float = STARTUP_TIMEOUT_S) -> EtcdProcess:
        """The member that leads now, asked of the live members (Maintenance.Status), once
        one knows a leader (during an election none does).  Raises LaunchError when
        none knows one within `timeout_s`."""
        from dlfs.coord.etcd_grpc import EtcdClient
        from dlfs.errors import DlfsError

        deadline = time.monotonic() + timeout_s
        while True:
            ids, leaders = {}, set()
            for member in self.members:
                if not member.alive():
                    continue
                client = EtcdClient(member.url)
                try:
                    own, leader = client.status(member.url.removeprefix("http://"))
                except DlfsError:
                    continue
                finally:
                    client.close()
                ids[own] = member
                leaders.add(leader)
            known = [ids[leader] for leader in leaders if leader in ids]
            if len(leaders) == 1 and known:
                return known[0]
            if time.monotonic() > deadline:
                raise LaunchError(f"no etcd member knew a leader within {timeout_s:.0f} s")
            time.sleep(POLL_INTERVAL_S * 5)

    def kill(self) -> None:
        for member in self.members:
            member.kill()
