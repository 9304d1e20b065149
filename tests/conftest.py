"""Shared fixtures: real `dlfs-server` processes on 127.0.0.1:0, real files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from dlfs import Client

STARTUP_TIMEOUT_S = 30.0


class DaemonProcess:
    """A `dlfs-server` subprocess on a data dir; restartable on the same dir."""

    def __init__(self, data_dir: str, log_path: str, extra_args: list[str] | None = None):
        self.data_dir = data_dir
        self.log_path = log_path
        self.extra_args = list(extra_args or [])
        self.process: subprocess.Popen | None = None
        self.address = ""
        self._address_file = os.path.join(os.path.dirname(log_path),
                                          f"address-{uuid.uuid4().hex[:8]}")

    def start(self, listen: str = "127.0.0.1:0") -> str:
        assert self.process is None or self.process.poll() is not None
        if os.path.exists(self._address_file):
            os.unlink(self._address_file)
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dlfs.server.main", "--data-dir", self.data_dir,
             "--listen", listen, "--address-file", self._address_file, *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not os.path.exists(self._address_file):
            if self.process.poll() is not None:
                raise RuntimeError(f"dlfs-server exited with {self.process.returncode}:\n"
                                   + self.log())
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("dlfs-server did not start in time:\n" + self.log())
            time.sleep(0.02)
        with open(self._address_file) as f:
            self.address = f.read().strip()
        return self.address

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit status."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as in a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def restart(self) -> str:
        """Stop cleanly and start again on the same port and data dir."""
        port = self.address.rpartition(":")[2]
        self.stop()
        return self.start(f"127.0.0.1:{port}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")


@pytest.fixture
def daemon_factory(tmp_path):
    """Start daemons on fresh (or given) data dirs; all are killed at teardown."""
    started: list[DaemonProcess] = []

    def make(data_dir: str | None = None, extra_args: list[str] | None = None,
             start: bool = True) -> DaemonProcess:
        index = len(started)
        data_dir = data_dir or str(tmp_path / f"data{index}")
        daemon = DaemonProcess(data_dir, str(tmp_path / f"daemon{index}.log"), extra_args)
        started.append(daemon)
        if start:
            daemon.start()
        return daemon

    yield make
    for daemon in started:
        daemon.kill()


@pytest.fixture
def daemon(daemon_factory) -> DaemonProcess:
    return daemon_factory()


@pytest.fixture
def client(daemon):
    with Client(daemon.address, reconnect_timeout_s=5.0) as c:
        yield c


@pytest.fixture(scope="module")
def shared_daemon(tmp_path_factory):
    """One daemon per test module, for tests that only add uniquely named datasets."""
    root = tmp_path_factory.mktemp("shared")
    d = DaemonProcess(str(root / "data"), str(root / "daemon.log"))
    d.start()
    yield d
    d.kill()


@pytest.fixture
def shared_client(shared_daemon):
    with Client(shared_daemon.address, reconnect_timeout_s=5.0) as c:
        yield c


def write_tree(root, files: dict[str, bytes]) -> None:
    """Create `files` (relative path -> contents) below `root`."""
    for rel, data in files.items():
        path = os.path.join(root, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def unique_name(prefix: str = "ds") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def addresses(daemons) -> list[str]:
    return [d.address for d in daemons]


def local_samples(address: str, name: str) -> int:
    """Samples of dataset `name` the daemon at `address` stores itself (not remote)."""
    import grpc
    import numpy as np

    from dlfs.proto import dlfs_pb2 as pb
    from dlfs.proto import dlfs_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = dlfs_pb2_grpc.DlfsStub(channel)
        extents = b"".join(c.extent for c in stub.GetIndex(pb.GetIndexRequest(dataset=name),
                                                           timeout=10))
    return int((np.frombuffer(extents, "<u4") != 0xFFFFFFFF).sum())


def store_ingest(store, name: str, files: dict[str, bytes], replace: bool = False):
    """Ingest `files` (path -> bytes) into an in-process `Store` and commit."""
    session = store.begin_ingest(name, replace)
    for path, data in files.items():
        session.start_file(path, len(data), 0o100644, 1)
        session.write(data)
    return store.commit_ingest(session)


def store_read(store, dataset, ids) -> list[bytes]:
    """Samples `ids` of `dataset` read through an in-process `Store`, in request order."""
    _, plan = store.plan(dataset, ids=list(ids))
    payload = bytearray(plan.payload_bytes)
    for start, window in store.read(dataset, plan):
        payload[start:start + len(window)] = window
    return [bytes(payload[o:o + n]) for o, n in zip(plan.request_offsets.tolist(),
                                                   plan.request_lengths.tolist())]
