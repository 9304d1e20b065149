"""Several real daemons in a cluster found in a real etcd: striping, replication, failover
under SIGKILL, a killed member routed around once its lease expires, recovery."""

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
from dlfs import Client, limits
from dlfs.proto import dlfs_pb2 as pb
from dlfs.proto import dlfs_pb2_grpc
from helpers.daemons import addresses, local_samples, read_dataset
from helpers.trees import write_tree
from helpers.waiting import wait_until

SAMPLES = 600
# Tests that kill a member and then expect it to be asked (and fail) give it a
# lease that outlives them; the lease test below uses etcd's shortest.
LONG_LEASE = ["--member-lease-ttl-s", "60"]
SHORT_LEASE_TTL_S = 2


@pytest.fixture
def three(cluster):
    return cluster.start(3, LONG_LEASE)


@pytest.fixture
def tree(tmp_path):
    rng = np.random.default_rng(9)
    files = {f"train/c{i % 4}/{i:04d}.bin": rng.bytes(int(rng.integers(0, 6000)))
             for i in range(SAMPLES)}
    files["big/volume.raw"] = rng.bytes(3 * 1024 * 1024)
    write_tree(tmp_path / "src", files)
    return tmp_path / "src", files


def test_striped_ingest_places_balanced_replicas_and_reads_back(cluster, three, tree):
    source, files = tree
    paths = sorted(files)
    with cluster.client() as client:
        info = client.ingest(str(source), "ds", replicas=2)
        assert (info.samples, info.bytes) == (len(files), sum(map(len, files.values())))
        ds = client.dataset("ds")
        assert ds.info.members == tuple(sorted(addresses(three))) and ds.info.replicas == 2
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


def test_a_member_refuses_samples_it_does_not_store(cluster, three, tree):
    source, _files = tree
    with cluster.client() as client:
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


def test_failover_to_replicas_when_a_daemon_is_killed(cluster, three, tree):
    source, files = tree
    paths = sorted(files)
    with cluster.client() as client:
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
        wait_until(lambda: victim.address in client.transport.view.state.members,
                   "the restarted member's new lease to reach the client", 30)
        assert client.transport.is_down(victim.address)
        clock.advance(limits.member_down_s)  # its down mark expires
        assert not client.transport.is_down(victim.address)
        assert [bytes(s) for s in ds.get_batch(everything)] == [files[p] for p in paths]
        assert not isinstance(client.statuses()[victim.address], Exception)
    # It really served again: its GetBatch counter moved.
    with Client(victim.address) as single:
        assert single.status().batches_served > 0


def test_without_replicas_a_lost_daemon_is_named(cluster, three, tree):
    source, files = tree
    with cluster.client() as client:
        client.ingest(str(source), "ds", replicas=1)
        three[2].kill()
        with pytest.raises(dlfs.Unavailable, match=f"stored only on {three[2].address}"):
            client.get_batch(list(range(len(files))), dataset="ds")
        # Samples on the surviving daemons still read.
        placement = client.transport.placement("ds")
        lost = placement.members.index(three[2].address)
        alive = [i for i in range(len(files)) if placement.holders[i][0] != lost]
        assert len(client.get_batch(alive, dataset="ds")) == len(alive)


def test_a_failed_striped_ingest_keeps_nothing_anywhere(cluster, three, tree):
    source, _files = tree
    # A member whose disk fails mid-ingest (a killed one is left out instead:
    # tests/e2e/test_cluster_silent_member.py).
    three[2].stop()
    three[2].extra_env = {"DLFS_FAULT": "write:20:EIO"}
    three[2].start_again()
    with cluster.client(reconnect_timeout_s=1) as client:
        with pytest.raises(dlfs.StorageFailed, match="nothing was kept"):
            client.ingest(str(source), "ds", replicas=2)
    assert "fault injected" in three[2].log()
    # A member notices the cancelled stream on its own thread, unlists the ingest, then
    # removes its extents: allow it a moment for both.
    for daemon in three:
        extents = os.path.join(daemon.data_dir, "extents")
        deadline = time.monotonic() + 10
        with Client(daemon.address) as single:
            while (single.dataset_infos() or os.listdir(extents)) and \
                    time.monotonic() < deadline:
                time.sleep(0.05)
            assert single.dataset_infos() == [], daemon.log()
        assert os.listdir(extents) == []


def test_replace_and_delete_a_striped_dataset(cluster, three, tmp_path):
    write_tree(tmp_path / "v1", {f"{i:03d}": b"one" for i in range(50)})
    write_tree(tmp_path / "v2", {f"{i:03d}": b"two" for i in range(60)})
    with cluster.client() as client:
        client.ingest(str(tmp_path / "v1"), "ds", replicas=2)
        with pytest.raises(dlfs.AlreadyExists):
            client.ingest(str(tmp_path / "v2"), "ds", replicas=2)
        client.ingest(str(tmp_path / "v2"), "ds", replicas=2, replace=True)
        assert {bytes(s) for s in client.get_batch(range(60), dataset="ds")} == {b"two"}
        client.delete("ds")
        assert client.datasets() == []
        with pytest.raises(dlfs.NotFound):
            client.get_batch([0], dataset="ds")
    for daemon in three:  # every member removes its copy as it reads etcd
        wait_until(lambda: not os.listdir(os.path.join(daemon.data_dir, "extents")),
                   f"{daemon.address} to remove the deleted dataset", 30)


def test_cli_with_several_daemons(cluster, three, tree):
    source, files = tree
    run = [sys.executable, "-m", "dlfs.cli", *cluster.cli()]
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
    for daemon in three:  # the members as etcd lists them
        assert f"member {daemon.address}: serving" in text


def test_no_member_answering_is_unavailable_not_empty(cluster, three):
    for daemon in three:
        daemon.kill()
    with cluster.client(reconnect_timeout_s=0) as client:
        with pytest.raises(dlfs.Unavailable, match="none of the DLFS daemons"):
            client.datasets()


def test_a_static_member_list_points_to_etcd(three):
    with pytest.raises(dlfs.InvalidArgument, match="form a cluster through etcd"):
        Client(addresses(three))


def test_a_member_killed_is_routed_around_once_its_lease_expires(cluster, tree, capsys):
    """kill -9 a member: readers stop sending to it within its lease's TTL plus one read."""
    source, files = tree
    three = cluster.start(3, ["--member-lease-ttl-s", str(SHORT_LEASE_TTL_S)])
    with cluster.client() as writer:
        writer.ingest(str(source), "ds", replicas=2)
    victim = three[1]
    with cluster.client() as reader:
        assert read_dataset(reader, "ds") == files
        asked_while_dead: list[str] = []
        mark_down = reader.transport.mark_down
        reader.transport.mark_down = lambda address, error: (asked_while_dead.append(address),
                                                             mark_down(address, error))
        victim.kill()  # no goodbye: the lease expires by itself
        killed = time.monotonic()
        wait_until(lambda: victim.address not in reader.transport.addresses,
                   "the dead member's lease to expire", 60)
        gone_s = time.monotonic() - killed
        started = time.monotonic()
        assert read_dataset(reader, "ds") == files  # one read after the expiry
        read_s = time.monotonic() - started
        assert asked_while_dead == []  # the read never tried the dead member
    print(f"member lease TTL {SHORT_LEASE_TTL_S} s: left the member list {gone_s:.2f} s after "
          f"kill -9; the next read took {read_s:.2f} s and asked only live members")
    # etcd checks leases every 0.5 s: the member is gone within TTL + that.
    assert gone_s <= SHORT_LEASE_TTL_S + 1.0, gone_s
