"""Several real daemons: striping, replication, failover under SIGKILL, recovery."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest

import dlfs
from conftest import addresses, local_samples, write_tree
from dlfs import Client, limits
from dlfs.proto import dlfs_pb2 as pb
from dlfs.proto import dlfs_pb2_grpc

SAMPLES = 600


@pytest.fixture
def three(daemon_factory):
    return [daemon_factory() for _ in range(3)]


@pytest.fixture
def tree(tmp_path):
    rng = np.random.default_rng(9)
    files = {f"train/c{i % 4}/{i:04d}.bin": rng.bytes(int(rng.integers(0, 6000)))
             for i in range(SAMPLES)}
    files["big/volume.raw"] = rng.bytes(3 * 1024 * 1024)
    write_tree(tmp_path / "src", files)
    return tmp_path / "src", files


def test_striped_ingest_places_balanced_replicas_and_reads_back(three, tree):
    source, files = tree
    paths = sorted(files)
    with Client(addresses(three)) as client:
        info = client.ingest(str(source), "ds", replicas=2)
        assert (info.samples, info.bytes) == (len(files), sum(map(len, files.values())))
        ds = client.dataset("ds")
        assert ds.info.members == tuple(addresses(three)) and ds.info.replicas == 2
        rng = random.Random(1)
        ids = [rng.randrange(len(paths)) for _ in range(900)]
        assert [bytes(s) for s in ds.get_batch(ids)] == [files[paths[i]] for i in ids]
        some = rng.sample(paths, 50)
        assert [bytes(s) for s in ds.get_batch(some)] == [files[p] for p in some]
        big = ds.index("big/volume.raw")
        assert bytes(ds.read(big, 1000, 5000)) == files["big/volume.raw"][1000:6000]
        assert b"".join(bytes(c) for _, c in ds.read_chunks(big)) == files["big/volume.raw"]
        assert ds.paths() == paths
    counts = [local_samples(a, "ds") for a in addresses(three)]
    assert sum(counts) == 2 * len(files)  # every sample exactly twice
    for count in counts:  # 2/3 of the samples each, within a loose binomial bound
        assert abs(count - 2 * len(files) / 3) < 0.15 * len(files)
    # Every member has the whole directory: metadata calls work on each alone.
    for address in addresses(three):
        with Client(address) as single:
            assert single.stat("ds", paths[5]).size == len(files[paths[5]])
            assert [e.name for e in single.listdir("ds", "train")] == ["c0", "c1", "c2", "c3"]


def test_a_member_refuses_samples_it_does_not_store(three, tree):
    source, _files = tree
    with Client(addresses(three)) as client:
        client.ingest(str(source), "ds", replicas=1)
    with grpc.insecure_channel(three[0].address) as channel:
        stub = dlfs_pb2_grpc.DlfsStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            list(stub.GetBatch(pb.GetBatchRequest(dataset="ds", ids=list(range(SAMPLES))),
                               timeout=10))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is stored on" in info.value.details() and "not on this daemon" in info.value.details()


class ManualClock:
    """A clock that moves only when told to: down marks expire on `advance`."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_failover_to_replicas_when_a_daemon_is_killed(three, tree):
    source, files = tree
    paths = sorted(files)
    with Client(addresses(three)) as client:
        clock = client.transport.clock = ManualClock()
        client.ingest(str(source), "ds", replicas=2)
        ds = client.dataset("ds")
        everything = list(range(len(paths)))
        assert [bytes(s) for s in ds.get_batch(everything)] == [files[p] for p in paths]
        victim = three[1]
        victim.kill()  # SIGKILL mid-epoch
        started = time.monotonic()
        assert [bytes(s) for s in ds.get_batch(everything)] == [files[p] for p in paths]
        # Failed over without waiting out the victim as a lone daemon would be waited for.
        assert time.monotonic() - started < limits.reconnect_timeout_s_default
        statuses = client.statuses()
        assert isinstance(statuses[victim.address], dlfs.Unavailable)
        assert not any(isinstance(statuses[d.address], Exception) for d in (three[0], three[2]))
        # The daemon comes back: after its down mark expires it serves its share again.
        victim.start_again()
        assert client.transport.is_down(victim.address)
        clock.advance(limits.member_down_s)  # its down mark expires
        assert not client.transport.is_down(victim.address)
        assert [bytes(s) for s in ds.get_batch(everything)] == [files[p] for p in paths]
        assert not isinstance(client.statuses()[victim.address], Exception)
    # It really served again: its GetBatch counter moved.
    with Client(victim.address) as single:
        assert single.status().batches_served > 0


def test_without_replicas_a_lost_daemon_is_named(three, tree):
    source, files = tree
    with Client(addresses(three)) as client:
        client.ingest(str(source), "ds", replicas=1)
        three[2].kill()
        with pytest.raises(dlfs.Unavailable, match=f"stored only on {three[2].address}"):
            client.get_batch(list(range(len(files))), dataset="ds")
        # Samples on the surviving daemons still read.
        placement = client.transport.placement("ds")
        alive = [i for i in range(len(files)) if placement.holders[i][0] != 2]
        assert len(client.get_batch(alive, dataset="ds")) == len(alive)


def test_a_failed_striped_ingest_keeps_nothing_anywhere(three, tree):
    source, _files = tree
    three[2].kill()
    with Client(addresses(three), reconnect_timeout_s=1) as client:
        with pytest.raises(dlfs.Unavailable, match="nothing was kept"):
            client.ingest(str(source), "ds", replicas=2)
    # A member notices the cancelled stream on its own thread, unlists the ingest, then
    # removes its extents: allow it a moment for both.
    for daemon in three[:2]:
        extents = os.path.join(daemon.data_dir, "extents")
        deadline = time.monotonic() + 10
        with Client(daemon.address) as single:
            while (single.dataset_infos() or os.listdir(extents)) and \
                    time.monotonic() < deadline:
                time.sleep(0.05)
            assert single.dataset_infos() == [], daemon.log()
        assert os.listdir(extents) == []


def test_replace_and_delete_a_striped_dataset(three, tmp_path):
    write_tree(tmp_path / "v1", {f"{i:03d}": b"one" for i in range(50)})
    write_tree(tmp_path / "v2", {f"{i:03d}": b"two" for i in range(60)})
    with Client(addresses(three)) as client:
        client.ingest(str(tmp_path / "v1"), "ds", replicas=2)
        with pytest.raises(dlfs.AlreadyExists):
            client.ingest(str(tmp_path / "v2"), "ds", replicas=2)
        client.ingest(str(tmp_path / "v2"), "ds", replicas=2, replace=True)
        assert {bytes(s) for s in client.get_batch(range(60), dataset="ds")} == {b"two"}
        client.delete("ds")
        assert client.datasets() == []
        with pytest.raises(dlfs.NotFound):
            client.get_batch([0], dataset="ds")


def test_cli_with_several_daemons(three, tree):
    source, files = tree
    server = ",".join(addresses(three))
    run = [sys.executable, "-m", "dlfs.cli", "--server", server]
    out = subprocess.run(run + ["ingest", "--replicas", "2", str(source), "ds"],
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().startswith(f"ingested ds: {len(files)} samples")
    cat = subprocess.run(run + ["cat", "ds/train/c1/0001.bin"], capture_output=True, timeout=60)
    assert cat.stdout == files["train/c1/0001.bin"]
    three[0].kill()
    status = subprocess.run(run + ["status"], capture_output=True, timeout=60)
    text = status.stdout.decode()
    assert status.returncode == 1 and f"daemon {three[0].address}: DOWN" in text
    assert text.count(": up ") == 2


def test_no_member_answering_is_unavailable_not_empty(three):
    for daemon in three:
        daemon.kill()
    with Client(addresses(three), reconnect_timeout_s=0) as client:
        with pytest.raises(dlfs.Unavailable, match="none of the DLFS daemons"):
            client.datasets()
