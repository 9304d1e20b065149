"""Two-phase commit of striped changes decided in etcd: prepared state survives restarts,
one etcd transaction decides, members apply it from their watch, and a member, the
coordinating client, etcd's leader or etcd itself dying at the commit leaves one whole
version everywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import crc32c
import grpc
import numpy as np
import pytest

import dlfs
from dlfs import Client, limits
from dlfs.client.cluster.etcd_commit import ClusterChange
from dlfs.coord import cluster_keys as keys
from dlfs.coord.etcd_grpc import Compare, Delete, EtcdClient, Put
from dlfs.proto import dlfs_pb2 as pb
from dlfs.proto import dlfs_pb2_grpc
from dlfs.tools.launch import EtcdCluster
from helpers.daemons import addresses, read_dataset
from helpers.trees import write_tree
from helpers.waiting import wait_until

GENERATION = 2**62 + 12345
SETTLE_S = 60.0  # a bound for waiting on what the daemons do by themselves


def prepared_stream(name: str, address: str, files: dict[str, bytes]):
    """An Ingest of `files` as a one-member striped dataset, prepared only."""
    yield pb.IngestMessage(start=pb.IngestStart(
        dataset=name, members=[address], replicas=1, member_index=0, prepare_only=True,
        generation=GENERATION, replace=True))
    pieces = [pb.IngestPiece(path=path, size=len(data), data=data, holders=[0],
                             crc32c=crc32c.crc32c(data))
              for path, data in sorted(files.items())]
    yield pb.IngestMessage(pieces=pieces, end=pb.IngestEnd(
        files=len(files), bytes=sum(map(len, files.values()))))


def sealed_generation(address: str, name: str) -> int:
    """The generation `address` publishes `name` in; 0 if none (or not yet committed)."""
    with Client(address) as client:
        infos = {i.name: i for i in client.dataset_infos()}
    info = infos.get(name)
    return info.generation if info is not None and info.sealed else 0


def ingests_running(daemons) -> int:
    running = 0
    for daemon in daemons:
        with Client(daemon.address) as client:
            running += client.status().ingests_running
    return running


def extent_dirs(daemon) -> int:
    return len(os.listdir(os.path.join(daemon.data_dir, "extents")))


def test_a_prepared_ingest_survives_a_restart_and_commits_when_etcd_says_so(cluster,
                                                                             daemon_factory):
    files = {"a/x.bin": b"x" * 1000, "b.bin": b"bee"}
    alone = daemon_factory()  # without --etcd: nobody could decide, so it votes no
    with grpc.insecure_channel(alone.address) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            dlfs_pb2_grpc.DlfsStub(channel).Ingest(prepared_stream("ds", alone.address, files),
                                                   timeout=30)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "--etcd" in caught.value.details()

    [daemon] = cluster.start(1)
    prefix = keys.cluster_prefix(cluster.name)
    etcd = EtcdClient(cluster.urls)
    with grpc.insecure_channel(daemon.address) as channel:
        stub = dlfs_pb2_grpc.DlfsStub(channel)
        with pytest.raises(grpc.RpcError) as caught:  # no intent in etcd: it votes no
            stub.Ingest(prepared_stream("ds", daemon.address, files), timeout=30)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "etcd holds no change" in caught.value.details()
        intent = keys.IntentRecord(GENERATION, "ingest", (daemon.address,), 1, "this test")
        etcd.put(keys.intent_key(prefix, "ds"), keys.encode(intent))
        prepared = stub.Ingest(prepared_stream("ds", daemon.address, files), timeout=30)
        assert not prepared.sealed
    daemon.kill()  # no clean shutdown: only what is durable counts
    daemon.start_again()
    assert "was prepared but not yet committed" in daemon.log()
    with Client(daemon.address) as client:
        [info] = client.dataset_infos()
        assert info.name == "ds" and not info.sealed
    # The decision: one transaction writes the record and drops the intent.
    record = keys.DatasetRecord(GENERATION, (daemon.address,), 1, len(files), 1003)
    assert etcd.txn([Compare(keys.dataset_key(prefix, "ds"), "version", "==", 0)],
                    [Put(keys.dataset_key(prefix, "ds"), keys.encode(record)),
                     Delete(keys.intent_key(prefix, "ds"))])[0]
    wait_until(lambda: sealed_generation(daemon.address, "ds") == GENERATION,
               "the member to publish what etcd decided", SETTLE_S)
    assert "committed in etcd; published here" in daemon.log()
    with cluster.client() as client:
        assert read_dataset(client, "ds") == files
    etcd.close()


def resume_stream(name: str, address: str):
    """An Ingest that asks to resume `name` (as the one-member striped ingest above)."""
    yield pb.IngestMessage(start=pb.IngestStart(
        dataset=name, members=[address], replicas=1, member_index=0, prepare_only=True,
        generation=GENERATION, resumable=True, resume=True, resume_from=0),
        end=pb.IngestEnd())


@pytest.mark.parametrize("restart", [False, True])
def test_a_resume_of_a_prepared_ingest_is_refused_as_prepared(cluster, restart):
    """A prepared ingest waits for its commit, and a resume says so: also the one a
    restart found prepared, which has no stream (the resume failed with INTERNAL,
    an AttributeError, on it).  It stays whole: etcd's commit then publishes it."""
    [daemon] = cluster.start(1)
    prefix = keys.cluster_prefix(cluster.name)
    etcd = EtcdClient(cluster.urls)
    intent = keys.IntentRecord(GENERATION, "ingest", (daemon.address,), 1, "this test")
    etcd.put(keys.intent_key(prefix, "ds"), keys.encode(intent))
    files = {"a.bin": b"a" * 100}
    with grpc.insecure_channel(daemon.address) as channel:
        dlfs_pb2_grpc.DlfsStub(channel).Ingest(prepared_stream("ds", daemon.address, files),
                                               timeout=30)
    if restart:
        daemon.kill()
        daemon.start_again()
        assert "was prepared but not yet committed" in daemon.log()
    with grpc.insecure_channel(daemon.address) as channel:
        stub = dlfs_pb2_grpc.DlfsStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Ingest(resume_stream("ds", daemon.address), timeout=30)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION, caught.value.details()
        assert "is prepared (it holds all its files) and waits for its commit: the decision " \
            "in etcd" in caught.value.details()
    record = keys.DatasetRecord(GENERATION, (daemon.address,), 1, len(files), 100)
    assert etcd.txn([Compare(keys.dataset_key(prefix, "ds"), "version", "==", 0)],
                    [Put(keys.dataset_key(prefix, "ds"), keys.encode(record)),
                     Delete(keys.intent_key(prefix, "ds"))])[0]
    wait_until(lambda: sealed_generation(daemon.address, "ds") == GENERATION,
               "the member to publish what etcd decided", SETTLE_S)  # still prepared, whole
    with cluster.client() as client:
        assert read_dataset(client, "ds") == files
    etcd.close()


@pytest.fixture
def tree(tmp_path):
    rng = np.random.default_rng(4)
    old = {f"c{i % 3}/{i:03d}.bin": rng.bytes(int(rng.integers(1, 4000))) for i in range(90)}
    new = {f"c{i % 3}/{i:03d}.bin": rng.bytes(int(rng.integers(1, 4000))) for i in range(120)}
    write_tree(tmp_path / "old", old)
    write_tree(tmp_path / "new", new)
    return tmp_path, old, new


def test_a_member_that_dies_at_commit_commits_after_its_restart(cluster, tree):
    root, old, new = tree
    three = cluster.start(3, ["--member-lease-ttl-s", "2"])
    with cluster.client() as client:
        client.ingest(str(root / "old"), "ds", replicas=2)
    # The third member dies exactly when it applies etcd's commit (before its SEAL).
    victim = three[2]
    victim.stop()
    victim.extra_env = {"DLFS_FAULT": "seal:1:kill"}
    victim.start_again()
    with cluster.client(reconnect_timeout_s=1) as client:
        info = client.ingest(str(root / "new"), "ds", replace=True, replicas=2)  # etcd decided
        assert read_dataset(client, "ds") == new  # the others serve it; replicas cover it
    assert "fault injected: seal #1" in victim.log()
    victim.extra_env = {}
    victim.start_again()  # prepared again after replay: it reads etcd and commits
    wait_until(lambda: sealed_generation(victim.address, "ds") == info.generation,
               "the restarted member to apply the commit", SETTLE_S)
    assert "committed in etcd; published here" in victim.log()
    assert all(sealed_generation(a, "ds") == info.generation for a in addresses(three))
    with cluster.client() as client:
        assert read_dataset(client, "ds") == new
        assert not client.dataset_infos()[0].disagreement


def test_a_client_killed_between_prepare_and_commit_leaves_the_old_version(cluster, tree):
    """The coordinator dies after every member prepared: its lease takes its intent, and
    every member discards what it prepared, with nobody to ask and no command to run."""
    root, old, new = tree
    three = cluster.start(3)
    with cluster.client() as client:
        first = client.ingest(str(root / "old"), "ds", replicas=2)
    dies_at_commit = textwrap.dedent(f"""
        import os, signal
        from dlfs import Client
        from dlfs.client.cluster import etcd_commit
        def die(self, record):  # every member prepared; the commit never happens
            os.kill(os.getpid(), signal.SIGKILL)
        etcd_commit.ClusterChange.commit = die
        Client(etcd={cluster.urls!r}, cluster={cluster.name!r}).ingest(
            {str(root / "new")!r}, "ds", replace=True, replicas=2)
    """)
    out = subprocess.run([sys.executable, "-c", dies_at_commit], capture_output=True,
                         timeout=120)
    assert out.returncode == -9, out.stderr.decode()
    assert ingests_running(three) == 3  # all three prepared, waiting for etcd
    for daemon in three:
        assert sealed_generation(daemon.address, "ds") == first.generation
    wait_until(lambda: ingests_running(three) == 0,
               f"the members to discard what they prepared once the coordinator's lease "
               f"({limits.coordinator_lease_ttl_s} s) expired", SETTLE_S)
    for daemon in three:
        assert "its change is gone from etcd" in daemon.log()
        assert sealed_generation(daemon.address, "ds") == first.generation
        assert extent_dirs(daemon) == 1  # the prepared version's extents are gone
    with cluster.client() as client:
        assert read_dataset(client, "ds") == old
        # The name is free again: the next change goes through.
        assert client.ingest(str(root / "new"), "ds", replace=True).generation


def test_a_second_change_of_a_name_waits_for_the_first(cluster, tree):
    root, old, _new = tree
    cluster.start(2)
    with cluster.client() as client:
        client.ingest(str(root / "old"), "ds")
        change = ClusterChange(client.transport.view, "ds", "replace", GENERATION,
                               client.transport.addresses, 1).begin()
        with pytest.raises(dlfs.AlreadyExists, match="being changed by another client"):
            client.ingest(str(root / "old"), "ds", replace=True)
        with pytest.raises(dlfs.AlreadyExists, match="being changed by another client"):
            client.delete("ds")
        change.abort()
        client.delete("ds")
        assert client.datasets() == []


@pytest.mark.cluster
def test_etcd_leader_killed_mid_commit_leaves_one_whole_version(daemon_factory, tree,
                                                                tmp_path, monkeypatch):
    root, old, new = tree
    with EtcdCluster(str(tmp_path / "etcd3"), 3) as etcd:
        name = "three-etcd"
        args = ["--etcd", etcd.urls, "--cluster", name]
        members = [daemon_factory(extra_args=args) for _ in range(3)]
        with Client(etcd=etcd.urls, cluster=name) as client:
            client.ingest(str(root / "old"), "ds", replicas=2)
        killed = []
        commit = ClusterChange.commit

        def leader_dies_first(change, record):
            leader = etcd.leader()
            leader.kill()  # every member prepared; the commit meets an election
            killed.append(leader)
            return commit(change, record)

        monkeypatch.setattr(ClusterChange, "commit", leader_dies_first)
        with Client(etcd=etcd.urls, cluster=name) as client:
            try:
                info = client.ingest(str(root / "new"), "ds", replace=True, replicas=2)
            except dlfs.DlfsError as exc:  # a commit etcd could not answer: read it back
                print(f"the commit under a leader election failed: {exc}")
                info = None
        monkeypatch.undo()
        assert killed
        wait_until(lambda: ingests_running(members) == 0,
                   "every member to apply etcd's decision", SETTLE_S)
        generations = {sealed_generation(d.address, "ds") for d in members}
        assert len(generations) == 1, generations
        with Client(etcd=etcd.urls, cluster=name) as client:
            content = read_dataset(client, "ds")
            assert content == (new if info is not None else content)
            assert content in (old, new)
        killed[0].start_again()  # the old leader rejoins as a follower


@pytest.mark.cluster
def test_etcd_restarted_mid_commit_leaves_one_whole_version(daemon_factory, tree, tmp_path,
                                                            monkeypatch):
    root, old, new = tree
    with EtcdCluster(str(tmp_path / "etcd1"), 1) as etcd:
        args = ["--etcd", etcd.urls, "--cluster", "restarted"]
        members = [daemon_factory(extra_args=args) for _ in range(3)]
        with Client(etcd=etcd.urls, cluster="restarted") as client:
            client.ingest(str(root / "old"), "ds", replicas=2)
        commit = ClusterChange.commit
        [server] = etcd.members

        def etcd_restarts_first(change, record):
            server.kill()  # the commit finds no etcd, then the same etcd back
            threading.Timer(1.0, server.start_again).start()
            return commit(change, record)

        monkeypatch.setattr(ClusterChange, "commit", etcd_restarts_first)
        with Client(etcd=etcd.urls, cluster="restarted") as client:
            info = client.ingest(str(root / "new"), "ds", replace=True, replicas=2)
        monkeypatch.undo()
        wait_until(lambda: all(sealed_generation(d.address, "ds") == info.generation
                               for d in members),
                   "every member to publish the commit once etcd is back", SETTLE_S)
        with Client(etcd=etcd.urls, cluster="restarted") as client:
            assert read_dataset(client, "ds") == new


@pytest.mark.cluster
def test_a_member_cut_off_from_etcd_serves_what_it_has_and_takes_no_commits(
        daemon_factory, tree, tmp_path):
    """etcd gone: every member keeps serving its generation, and votes no to a prepare."""
    root, old, _new = tree
    with EtcdCluster(str(tmp_path / "etcd-cut"), 1) as etcd:
        args = ["--etcd", etcd.urls, "--cluster", "cut", "--member-lease-ttl-s", "2"]
        members = [daemon_factory(extra_args=args) for _ in range(2)]
        with Client(etcd=etcd.urls, cluster="cut") as client:
            info = client.ingest(str(root / "old"), "ds", replicas=2)
        etcd.kill()
        for member in members:  # each holds every sample (2 replicas on 2 members)
            with Client(member.address) as alone:
                assert alone.dataset("ds").info.generation == info.generation
                assert read_dataset(alone, "ds") == old
        with grpc.insecure_channel(members[0].address) as channel:
            with pytest.raises(grpc.RpcError) as caught:
                dlfs_pb2_grpc.DlfsStub(channel).Ingest(
                    prepared_stream("other", members[0].address, {"a": b"a"}), timeout=60)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "cannot reach etcd, so it takes no new commits" in caught.value.details()
