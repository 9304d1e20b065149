"""No dead or hung data path worker reaches the reader (issue 55 item 3, the call policy).

Real daemons with several workers (`--datapath-workers`), real signals: a worker
SIGSTOPped or SIGKILLed while readers use it, readers through `Client`, through a
torch DataLoader with worker processes, and through the mount.  Each reader checks
every byte and counts its reads; the test waits for every reader to have read on
after the signal, and asserts that none saw an error (through the mount, a file
of a replaced version may give ESTALE, as documented).  The client's stall bound
is lowered in this process (and so in the loader's forked workers) to keep the
hung case short; the mount runs with its default.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import threading

import numpy as np
import pytest

from helpers.trees import write_tree
from helpers.waiting import wait_until
from dlfs import Client, limits
from helpers.mounts import pread_of_a_version

WORKERS = ["--datapath-workers", "2"]
READERS = 8
STALL_S = 1.0


@pytest.fixture
def short_stalls(monkeypatch):
    monkeypatch.setattr(limits, "data_reply_stall_s", STALL_S)


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(55)
    made = {f"s/{i:03d}.bin": rng.bytes(int(rng.integers(1000, 60000))) for i in range(64)}
    write_tree(tmp_path / "src", made)
    return tmp_path / "src", made


def busiest_worker(status_client) -> object:
    """The serving worker with the most data connections (readers on it will meet the
    signal)."""
    workers = [w for w in status_client.status().data_workers if w.state == "serving"]
    return max(workers, key=lambda w: w.connections)


class Readers:
    """`count` threads reading batches and checking each sample; `reads[k]`: batches
    reader k finished, `failures`: anything one of them raised."""

    def __init__(self, read_batch, expected: list[bytes], count: int):
        self.reads = [0] * count
        self.failures: list[BaseException] = []
        self.stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(k, read_batch, expected))
                         for k in range(count)]
        for thread in self._threads:
            thread.start()

    def _run(self, k: int, read_batch, expected: list[bytes]) -> None:
        rng = random.Random(k)
        try:
            while not self.stop.is_set():
                ids = rng.sample(range(len(expected)), 8)
                got = read_batch(k, ids)
                assert [bytes(s) for s in got] == [expected[i] for i in ids]
                self.reads[k] += 1
        except BaseException as exc:  # noqa: BLE001 - the test thread raises it
            self.failures.append(exc)

    def read_on(self, what: str, batches: int = 3, timeout_s: float = 90) -> None:
        """Wait until every reader finished `batches` more batches (or one failed)."""
        start = list(self.reads)
        wait_until(lambda: self.failures or all(r >= s + batches
                                                for r, s in zip(self.reads, start)),
                   what, timeout_s)
        assert not self.failures, self.failures

    def close(self) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(60)
        assert not self.failures, self.failures


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["hung", "killed"])
def test_readers_through_client_never_see_a_worker_that_hangs_or_dies(
        daemon_factory, files, short_stalls, sig):
    root, made = files
    daemon = daemon_factory(extra_args=WORKERS)
    paths = sorted(made)
    expected = [made[p] for p in paths]
    with Client(daemon.address, data_path=False) as control:
        control.ingest(str(root), "ds")
        clients = [Client(daemon.address, data_path=socket) for socket in
                   ("tcp", "unix") * (READERS // 2)]
        datasets = [c.dataset("ds") for c in clients]
        readers = Readers(lambda k, ids: datasets[k].get_batch(ids), expected, READERS)
        try:
            readers.read_on("every reader reads")
            victim = busiest_worker(control)
            assert victim.connections >= 1
            os.kill(victim.pid, sig)
            readers.read_on(f"every reader reads on after the worker got {sig.name}")
        finally:
            if sig == signal.SIGSTOP:
                os.kill(victim.pid, signal.SIGKILL)  # as the daemon would, at a replace
            readers.close()
            for client in clients:
                client.close()
    wait_until(lambda: all(w.state == "serving" and w.pid != victim.pid
                           for w in Client(daemon.address, data_path=False).status()
                           .data_workers), "the victim's slot serves again", 60)


def test_dataloader_workers_read_through_a_worker_that_hangs(daemon_factory, files,
                                                             short_stalls):
    """Forked loader workers cannot use gRPC: the data path is their only way."""
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from dlfs.torch import DLFSDataset

    root, made = files
    contents = set(made.values())
    daemon = daemon_factory(extra_args=WORKERS)
    with Client(daemon.address, data_path=False) as control:
        control.ingest(str(root), "ds")
        loader = DataLoader(DLFSDataset(daemon.address, "ds"), batch_size=4, num_workers=2,
                            timeout=120, collate_fn=lambda batch: batch)
        victim = None
        seen = 0
        try:
            for _epoch in range(3):
                for batch in loader:
                    assert all(bytes(sample) in contents for sample, _label in batch)
                    seen += len(batch)
                    if victim is None and seen >= 8:
                        victim = busiest_worker(control)
                        assert victim.connections >= 1
                        os.kill(victim.pid, signal.SIGSTOP)
        finally:
            if victim is not None:
                os.kill(victim.pid, signal.SIGKILL)
        assert victim is not None and seen == 3 * len(made)


@pytest.mark.mount
@pytest.mark.parametrize("replacement", ["same", "other"], ids=["same-files", "other-bytes"])
def test_preads_through_the_mount_get_no_eio_when_a_worker_dies_or_hangs(
        daemon_factory, files, mount_factory, tmp_path, replacement):
    """16 threads of preads through `--extent-reads off` (every read reaches a worker)
    while a worker is killed, the dataset replaced (by the same files, or by others
    under the same paths) and a worker hung.  No read fails with EIO or returns bytes
    of no version.  Until the mount shows the new version (the kernel keeps the
    dataset's directory entry a few seconds), a file opened through the old one is the
    old version's: the kernel's cached pages of it, or ESTALE once a READ reaches the
    daemon (docs/mount.md); after that, no read fails."""
    root, made = files
    source, replaced = root, made
    if replacement == "other":
        other_bytes = np.random.default_rng(56)
        source = tmp_path / "other"
        replaced = {p: other_bytes.bytes(int(other_bytes.integers(1000, 60000))) for p in made}
        write_tree(source, replaced)
    daemon = daemon_factory(extra_args=WORKERS)
    with Client(daemon.address, data_path=False) as control:
        control.ingest(str(root), "ds")
        mount = mount_factory(daemon.address, "--extent-reads", "off")
        base = os.path.join(mount.mountpoint, "ds")
        paths = sorted(made)
        versions = [made]  # what a read may find
        stop = threading.Event()
        reads = [0] * 16
        stale = [0] * 16
        failures: list[BaseException] = []

        def pread(k: int) -> None:
            rng = random.Random(k)
            try:
                while not stop.is_set():
                    path = rng.choice(paths)
                    datas = [version[path] for version in versions]
                    offset = rng.randrange(max(map(len, datas)))
                    try:
                        with open(os.path.join(base, path), "rb", buffering=0) as f:
                            outcome = pread_of_a_version(f.fileno(), datas, offset, 4096)
                    except OSError as exc:  # the open's lookup in the old version
                        assert exc.errno == errno.ESTALE, exc
                        outcome = "estale"
                    if outcome == "estale":
                        stale[k] += 1
                    else:
                        reads[k] += 1
            except BaseException as exc:  # noqa: BLE001 - the test thread raises it
                failures.append(exc)

        def read_on(what: str) -> None:
            start = list(reads)
            wait_until(lambda: failures or all(r >= s + 20 for r, s in zip(reads, start)),
                       what, 120)
            assert not failures, failures

        threads = [threading.Thread(target=pread, args=(k,)) for k in range(len(reads))]
        for thread in threads:
            thread.start()
        try:
            read_on("the mount reads")
            killed = busiest_worker(control)
            os.kill(killed.pid, signal.SIGKILL)
            read_on("the mount reads on after a worker's kill")
            old_directory = os.stat(base).st_ino
            versions.append(replaced)
            control.ingest(str(source), "ds", replace=True)
            wait_until(lambda: os.stat(base).st_ino != old_directory,
                       "the mount shows the new version", 120)
            read_on("the mount reads on after a replace")
            versions[:] = [replaced]  # every reader opened its file anew since
            stale_while_old = sum(stale)
            stopped = busiest_worker(control)
            os.kill(stopped.pid, signal.SIGSTOP)
            read_on("the mount reads on while a worker hangs")
            os.kill(stopped.pid, signal.SIGKILL)
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
        assert not failures, failures
        assert sum(stale) == stale_while_old, "ESTALE after the mount showed the new version"
        assert "EIO" not in open(mount.log_path).read()
