"""Every read names a dataset version: replaced datasets are never read wrongly or mixed."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import grpc
import numpy as np
import pytest

import dlfs
from dlfs import Client
from dlfs.proto import dlfs_pb2 as pb
from dlfs.proto import dlfs_pb2_grpc
from helpers.trees import write_tree
from helpers.waiting import wait_until


def versions(tmp_path, count_1: int = 50, count_2: int = 60, size: int = 100):
    """Two source trees of the same paths (the second with more), the bytes telling
    which version they come from."""
    one = {f"{i:03d}": b"1" * size for i in range(count_1)}
    two = {f"{i:03d}": b"2" * size for i in range(count_2)}
    write_tree(tmp_path / "v1", one)
    write_tree(tmp_path / "v2", two)
    return tmp_path / "v1", tmp_path / "v2"


@pytest.mark.parametrize("data_path", [True, False], ids=["data path", "grpc"])
def test_a_dataset_reads_the_version_it_names(daemon, tmp_path, data_path):
    v1, v2 = versions(tmp_path)
    with Client(daemon.address, data_path=data_path) as reader, \
            Client(daemon.address) as writer:
        writer.ingest(str(v1), "ds")
        ds = reader.dataset("ds")
        first = ds.info.generation
        assert first and {bytes(s) for s in ds.get_batch(range(50))} == {b"1" * 100}
        writer.ingest(str(v2), "ds", replace=True)
        # The version it was opened at is gone: the next batch comes wholly from the new one.
        assert {bytes(s) for s in ds.get_batch(range(60))} == {b"2" * 100}
        assert ds.info.generation != first and len(ds) == 60
        assert bytes(ds.read(3, 10, 5)) == b"2" * 5
    # Asked for the old version by number, the daemon refuses on either path.
    with grpc.insecure_channel(daemon.address) as channel:
        stub = dlfs_pb2_grpc.DlfsStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetSmallBatch(pb.GetBatchRequest(dataset="ds", ids=[0], generation=first),
                               timeout=10)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert dict(caught.value.trailing_metadata())["dlfs-error"] == "StaleGeneration"
    with Client(daemon.address) as client:
        with pytest.raises(dlfs.StaleGeneration, match="was replaced"):
            client.transport.data_path().get_batch("ds", np.array([0]), generation=first)


@pytest.mark.parametrize("direct", [False, True], ids=["data path", "direct"])
def test_a_read_that_names_its_version_is_pinned_to_it(daemon, tmp_path, direct):
    """What the mount does: every read, and every Stat and ListDir (their entries carry
    sample ids), names the version its node was made from, and a replaced version is
    refused (StaleGeneration) rather than followed; 0 reads the current one."""
    v1, v2 = versions(tmp_path)
    with Client(daemon.address) as writer, Client(daemon.address, direct=direct) as reader:
        writer.ingest(str(v1), "ds")
        ds = reader.dataset("ds")
        old = ds.info.generation
        assert bytes(ds.get_batch([3], generation=old)[0]) == b"1" * 100
        assert bytes(reader.read("ds", 3, 10, 5, generation=old)) == b"1" * 5
        assert [(p, bytes(c)) for p, c in reader.read_chunks("ds", "003", 0, 7,
                                                             generation=old)] == [(0, b"1" * 7)]
        assert reader.stat("ds", "003", generation=old).id == 3
        entries, more = reader.list_page("ds", page_size=100, generation=old)
        assert (len(entries), more) == (50, False)
        writer.ingest(str(v2), "ds", replace=True)
        for read in (lambda: ds.get_batch([3], generation=old),
                     lambda: ds.read(3, 10, 5, generation=old),
                     lambda: reader.get_batch([3], dataset="ds", generation=old),
                     lambda: reader.read("ds", 3, generation=old),
                     lambda: reader.read("ds", "003", 10, 5, generation=old),
                     lambda: list(reader.read_chunks("ds", 3, 0, 7, generation=old)),
                     lambda: reader.stat("ds", "003", generation=old),
                     lambda: reader.list_page("ds", generation=old)):
            with pytest.raises(dlfs.StaleGeneration, match="was replaced"):
                read()
        assert ds.info.generation == old  # a pinned read does not switch the dataset
        assert bytes(reader.read("ds", 3, 10, 5)) == b"2" * 5  # 0: whatever is current
        assert len(reader.list_page("ds", page_size=100)[0]) == 60
        assert bytes(ds.get_batch([3])[0]) == b"2" * 100  # unpinned: switches
        assert ds.info.generation != old


def test_a_cluster_client_follows_a_replace_by_another_client(cluster, tmp_path):
    """The cached placement is of one version: a replace with more files is noticed."""
    cluster.start(3)
    v1, v2 = versions(tmp_path)
    with cluster.client() as reader, cluster.client() as writer:
        writer.ingest(str(v1), "stale", replicas=2)
        assert {bytes(s) for s in reader.get_batch(range(50), dataset="stale")} == {b"1" * 100}
        writer.ingest(str(v2), "stale", replicas=2, replace=True)
        assert {bytes(s) for s in reader.get_batch(range(60), dataset="stale")} == {b"2" * 100}
        # Ids within the old range too: the members refuse the old version's parts.
        writer.ingest(str(v1), "stale", replicas=2, replace=True)
        assert {bytes(s) for s in reader.get_batch(range(50), dataset="stale")} == {b"1" * 100}


def test_a_member_refuses_a_change_that_etcd_did_not_decide(cluster, tmp_path):
    """Members never disagree by a change sent to one of them alone: a striped dataset is
    replaced or deleted through etcd only, so every batch is one version.  The
    refusal's command is run as printed."""
    two = cluster.start(2)
    v1, v2 = versions(tmp_path, 64, 64)
    with cluster.client() as writer:
        writer.ingest(str(v1), "ds", replicas=1)
    for via in ("datapath", "grpc"):
        with Client(two[0].address) as lone:
            with pytest.raises(dlfs.FailedPrecondition, match="it cannot be replaced on one "
                                                              "member"):
                lone.ingest(str(v2), "ds", replace=True, via=via)
    with Client(two[0].address) as lone:
        with pytest.raises(dlfs.FailedPrecondition, match="it cannot be deleted") as refused:
            lone.delete("ds")
    with cluster.client() as reader:
        assert {bytes(s) for s in reader.get_batch(range(64), dataset="ds")} == {b"1" * 100}
    command = shlex.split(re.search(r"`([^`]+)`", str(refused.value)).group(1))
    assert command[0] == "dlfs"
    done = subprocess.run([sys.executable, "-m", "dlfs.cli", *command[1:]],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("removed ds: 64 samples")
    for daemon in two:
        with Client(daemon.address) as member:
            wait_until(lambda: member.dataset_infos() == [],
                       f"{daemon.address} to remove the deleted dataset", 30)


def test_a_direct_reader_follows_a_replace(daemon, tmp_path):
    v1, v2 = versions(tmp_path)
    with Client(daemon.address) as writer, Client(daemon.address, direct=True) as reader:
        writer.ingest(str(v1), "ds")
        ds = reader.dataset("ds")
        assert {bytes(s) for s in ds.get_batch(range(50))} == {b"1" * 100}
        writer.ingest(str(v2), "ds", replace=True)
        assert {bytes(s) for s in ds.get_batch(range(60))} == {b"2" * 100}
        old = ds.info.generation
        writer.ingest(str(v1), "ds", replace=True)
        with pytest.raises(dlfs.StaleGeneration):
            reader.get_batch([0], dataset="ds", generation=old)
