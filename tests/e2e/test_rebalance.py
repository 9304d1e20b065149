"""Rebalancing a dataset onto a new member list, on real daemons in a cluster found in a real
etcd: only moved copies travel."""

from __future__ import annotations

import subprocess
import sys

import grpc
import numpy as np
import pytest

import dlfs
from dlfs import Client
from dlfs.proto import dlfs_pb2 as pb
from dlfs.proto import dlfs_pb2_grpc
from helpers.daemons import addresses, local_samples
from helpers.trees import write_tree

SAMPLES = 400


@pytest.fixture
def four(cluster):
    """Three members now, a fourth when `add_fourth` starts it (ingests before it stripe
    over three).  A killed member's lease outlives the test: it stays a member."""
    daemons = cluster.start(3, ["--member-lease-ttl-s", "60"])
    return daemons


def add_fourth(cluster, daemons) -> list:
    daemons.append(cluster.start(1, ["--member-lease-ttl-s", "60"])[0])
    return daemons


def members(daemons) -> tuple:
    return tuple(sorted(addresses(daemons)))


@pytest.fixture
def tree(tmp_path):
    rng = np.random.default_rng(5)
    files = {f"train/c{i % 3}/{i:04d}.bin": rng.bytes(int(rng.integers(0, 5000)))
             for i in range(SAMPLES)}
    files["big/volume.raw"] = rng.bytes(3 * 1024 * 1024 + 7)  # several ingest messages
    write_tree(tmp_path / "src", files)
    return tmp_path / "src", files


def assert_reads_back(client: Client, name: str, files: dict[str, bytes]) -> None:
    paths = sorted(files)
    got = client.get_batch(range(len(paths)), dataset=name)
    assert [bytes(sample) for sample in got] == [files[p] for p in paths]


def test_adding_a_daemon_moves_only_its_share(cluster, four, tree):
    source, files = tree
    with cluster.client() as three:
        three.ingest(str(source), "ds", replicas=2)
    add_fourth(cluster, four)
    with cluster.client() as client:
        report = client.rebalance("ds")
        n = len(files)
        assert (report.samples, report.replicas, report.members) == (n, 2, members(four))
        # Every moved copy goes to the new daemon; the old ones keep what they still hold.
        assert report.copies_moved == local_samples(four[3].address, "ds")
        assert report.copies_moved + report.copies_kept == 2 * n
        assert 0.25 * n < report.copies_moved < 0.75 * n  # expected replicas/4 = n/2
        assert sum(local_samples(d.address, "ds") for d in four) == 2 * n
        assert report.removed_from == () and report.not_removed == ()
        info = client.dataset("ds").info
        assert info.members == members(four) and info.samples == n
        assert_reads_back(client, "ds", files)
        # Running it again moves nothing.
        again = client.rebalance("ds")
        assert (again.copies_moved, again.copies_kept) == (0, 2 * n)
    # Another reader learns the new placement from etcd and its members.
    with cluster.client() as other:
        assert_reads_back(other, "ds", files)


def test_removing_a_daemon_deletes_its_copy_and_keeps_every_sample(cluster, four, tree):
    source, files = tree
    add_fourth(cluster, four)
    with cluster.client() as client:
        client.ingest(str(source), "ds", replicas=2)
    leaving = four[1]
    staying = [d for d in four if d is not leaving]
    with cluster.client() as client:
        report = client.rebalance("ds", members=addresses(staying))
        assert report.removed_from == (leaving.address,)
        assert sum(local_samples(d.address, "ds") for d in staying) == 2 * len(files)
        assert_reads_back(client, "ds", files)
    with Client(leaving.address) as single:
        assert single.datasets() == []
    leaving.kill()
    with cluster.client() as client:
        assert_reads_back(client, "ds", files)


def test_a_one_daemon_dataset_is_striped_and_replicated(cluster, four, tree):
    source, files = tree
    for empty in ("valid", "train/c1/empty/deeper"):
        (source / empty).mkdir(parents=True)
    with Client(four[0].address) as single:  # the member's own dataset, not the cluster's
        single.ingest(str(source), "ds")
    with cluster.client() as client:
        report = client.rebalance("ds", replicas=2, source=four[0].address)
        assert report.replicas == 2 and report.copies_moved + report.copies_kept == 2 * len(files)
        assert report.copies_kept == local_samples(four[0].address, "ds")
        assert_reads_back(client, "ds", files)
        for member in four[:3]:  # the empty directories moved along
            with Client(member.address) as one:
                assert one.dataset("ds").stat("valid").children == 0
                assert one.dataset("ds").stat("train/c1/empty/deeper").is_dir
        four[2].kill()  # replicas 2: any one daemon may go
        assert_reads_back(client, "ds", files)


def test_a_failed_rebalance_changes_nothing(cluster, four, tree):
    source, files = tree
    with cluster.client() as client:
        client.ingest(str(source), "ds", replicas=2)
    add_fourth(cluster, four)
    four[3].kill()  # its lease lives on: still a member, and it does not answer
    with cluster.client(reconnect_timeout_s=1) as client:
        with pytest.raises(dlfs.Unavailable, match="nothing was kept"):
            client.rebalance("ds")
    with cluster.client() as client:
        assert client.dataset("ds").info.members == members(four[:3])
        assert_reads_back(client, "ds", files)
        assert sum(local_samples(d.address, "ds") for d in four[:3]) == 2 * len(files)


def test_rebalance_needs_a_cluster_and_an_existing_dataset(cluster, four):
    with Client(four[0].address) as single:
        with pytest.raises(dlfs.InvalidArgument, match="cluster's members"):
            single.rebalance("ds")
    with cluster.client() as client:
        with pytest.raises(dlfs.NotFound):
            client.rebalance("missing")


def test_cli_rebalance(cluster, four, tree):
    source, files = tree
    run = [sys.executable, "-m", "dlfs.cli", *cluster.cli()]
    out = subprocess.run(run + ["ingest", str(source), "ds"], capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    add_fourth(cluster, four)
    out = subprocess.run(run + ["rebalance", "ds", "--replicas", "2"],
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    text = out.stdout.decode()
    assert text.startswith(f"rebalanced ds onto 4 daemons (2x): {len(files)} samples; moved ")
    assert "kept" in text


def test_kept_pieces_are_checked_against_the_daemons_copy(daemon, tmp_path):
    write_tree(tmp_path / "src", {"a": b"alpha"})
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")
        crc = client.stat("ds", "a").crc32c

    def stream(replace: bool, size: int, checksum: int):
        kept = pb.IngestPiece(path="a", size=size, crc32c=checksum, kept=True)
        name = "ds" if replace else "new"  # kept bytes come only from the dataset replaced
        return iter([pb.IngestMessage(start=pb.IngestStart(dataset=name, replace=replace)),
                     pb.IngestMessage(pieces=[kept], end=pb.IngestEnd(files=1, bytes=0))])

    with grpc.insecure_channel(daemon.address) as channel:
        stub = dlfs_pb2_grpc.DlfsStub(channel)
        for replace, size, checksum, message in [(False, 5, crc, "must set replace"),
                                                 (True, 5, crc ^ 1, "differs"),
                                                 (True, 6, crc, "differs")]:
            with pytest.raises(grpc.RpcError) as caught:
                stub.Ingest(stream(replace, size, checksum), timeout=10)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in caught.value.details()
        # A correct kept piece re-stores the sample from the daemon's own copy.
        info = stub.Ingest(stream(True, 5, crc), timeout=10)
        assert info.samples == 1 and info.sealed
    with Client(daemon.address) as client:
        assert bytes(client.get_batch([0], dataset="ds")[0]) == b"alpha"


def test_readers_keep_reading_right_bytes_while_a_daemon_is_added(cluster, four, tree):
    import threading

    source, files = tree
    paths = sorted(files)
    with cluster.client() as client:
        client.ingest(str(source), "ds", replicas=2)
    add_fourth(cluster, four)
    failures: list[BaseException] = []
    batches = [0]
    stop = threading.Event()

    def read_loop() -> None:
        rng = np.random.default_rng(1)
        with cluster.client() as reader:
            while not stop.is_set():
                ids = rng.integers(0, len(paths), 64)
                try:
                    got = reader.get_batch(ids, dataset="ds")
                    assert [bytes(s) for s in got] == [files[paths[i]] for i in ids]
                    batches[0] += 1
                except BaseException as exc:  # noqa: BLE001 - reported below
                    failures.append(exc)
                    return

    thread = threading.Thread(target=read_loop)
    thread.start()
    try:
        with cluster.client() as client:
            client.rebalance("ds")
            client.rebalance("ds", replicas=3)  # and once more, while still reading
    finally:
        stop.set()
        thread.join(60)
    assert not failures, failures
    assert batches[0] > 0
