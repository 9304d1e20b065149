"""Durable two-phase commit of striped ingests: prepared state survives restarts, the first
member's commit decides, members left prepared learn the decision, retried commits succeed."""

from __future__ import annotations

import os

import crc32c
import grpc
import numpy as np
import pytest

from conftest import addresses, read_dataset, wait_until, write_tree
from dlfs import Client, cli
from dlfs.proto import dlfs_pb2 as pb
from dlfs.proto import dlfs_pb2_grpc

GENERATION = 2**62 + 12345
# Members left prepared ask the first member this often (--in-doubt-poll-s);
# a first member decides abort after --prepared-ingest-timeout-s.
FAST_2PC = ["--in-doubt-poll-s", "0.2", "--prepared-ingest-timeout-s", "3"]
SETTLE_S = 60.0  # a bound for waiting on what the daemons do by themselves


def prepared_stream(name: str, address: str, files: dict[str, bytes]):
    """An Ingest of `files` as a one-member striped dataset, prepared only."""
    yield pb.IngestMessage(start=pb.IngestStart(
        dataset=name, members=[address], replicas=1, member_index=0, prepare_only=True,
        generation=GENERATION))
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


def test_a_prepared_ingest_survives_a_restart_and_a_retried_commit_succeeds(daemon_factory):
    files = {"a/x.bin": b"x" * 1000, "b.bin": b"bee"}
    daemon = daemon_factory()
    with grpc.insecure_channel(daemon.address) as channel:
        prepared = dlfs_pb2_grpc.DlfsStub(channel).Ingest(
            prepared_stream("ds", daemon.address, files), timeout=30)
        assert not prepared.sealed
    daemon.kill()  # no clean shutdown: only what is durable counts
    daemon.start_again()
    assert "was prepared but not yet committed" in daemon.log()
    with Client(daemon.address) as client:
        [info] = client.dataset_infos()
        assert info.name == "ds" and not info.sealed
    with grpc.insecure_channel(daemon.address) as channel:
        stub = dlfs_pb2_grpc.DlfsStub(channel)
        request = pb.CommitIngestRequest(dataset="ds", generation=GENERATION)
        committed = stub.CommitIngest(request, timeout=30)
        assert committed.sealed and committed.generation == GENERATION
        again = stub.CommitIngest(request, timeout=30)  # a retry of a commit that succeeded
        assert again == committed
        with pytest.raises(grpc.RpcError) as caught:  # without the generation: nothing to do
            stub.CommitIngest(pb.CommitIngestRequest(dataset="ds"), timeout=30)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        outcome = stub.GetIngestOutcome(pb.IngestOutcomeRequest(dataset="ds",
                                                                generation=GENERATION))
        assert outcome.state == pb.IngestOutcome.COMMITTED
    with Client(daemon.address) as client:
        assert read_dataset(client, "ds") == files


def resume_stream(name: str, address: str):
    """An Ingest that asks to resume `name` (as the one-member striped ingest above)."""
    yield pb.IngestMessage(start=pb.IngestStart(
        dataset=name, members=[address], replicas=1, member_index=0, prepare_only=True,
        generation=GENERATION, resumable=True, resume=True, resume_from=0),
        end=pb.IngestEnd())


@pytest.mark.parametrize("restart", [False, True])
def test_a_resume_of_a_prepared_ingest_is_refused_as_prepared(daemon_factory, restart):
    """A prepared ingest waits for its commit, and a resume says so: also the one a
    restart found prepared, which has no stream (the resume failed with INTERNAL,
    an AttributeError, on it)."""
    daemon = daemon_factory()
    with grpc.insecure_channel(daemon.address) as channel:
        dlfs_pb2_grpc.DlfsStub(channel).Ingest(
            prepared_stream("ds", daemon.address, {"a.bin": b"a" * 100}), timeout=30)
    if restart:
        daemon.kill()
        daemon.start_again()
        assert "was prepared but not yet committed" in daemon.log()
    with grpc.insecure_channel(daemon.address) as channel:
        stub = dlfs_pb2_grpc.DlfsStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Ingest(resume_stream("ds", daemon.address), timeout=30)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION, caught.value.details()
        assert "is prepared (it holds all its files) and waits for its commit" in \
            caught.value.details()
        committed = stub.CommitIngest(pb.CommitIngestRequest(dataset="ds",
                                                             generation=GENERATION), timeout=30)
        assert committed.sealed  # still prepared, and whole


@pytest.fixture
def tree(tmp_path):
    rng = np.random.default_rng(4)
    old = {f"c{i % 3}/{i:03d}.bin": rng.bytes(int(rng.integers(1, 4000))) for i in range(90)}
    new = {f"c{i % 3}/{i:03d}.bin": rng.bytes(int(rng.integers(1, 4000))) for i in range(120)}
    write_tree(tmp_path / "old", old)
    write_tree(tmp_path / "new", new)
    return tmp_path, old, new


def test_a_member_that_dies_at_commit_commits_after_its_restart(daemon_factory, tree, capsys):
    root, old, new = tree
    three = [daemon_factory(extra_args=FAST_2PC) for _ in range(3)]
    members = addresses(three)
    with Client(members) as client:
        client.ingest(str(root / "old"), "ds")
    # The third member dies exactly when it is told to commit (before its SEAL).
    victim = three[2]
    victim.stop()
    victim.extra_env = {"DLFS_FAULT": "seal:1:kill"}
    victim.start_again()
    with Client(members, reconnect_timeout_s=1) as client:
        info = client.ingest(str(root / "new"), "ds", replace=True)  # the first member decided
    assert "fault injected: seal #1" in victim.log()
    new_generation = info.generation
    assert all(sealed_generation(a, "ds") == new_generation for a in members[:2])

    # Back, but not asking the first member yet: the listing says who disagrees.
    victim.extra_env = {}
    victim.extra_args = ["--in-doubt-poll-s", "3600"]
    victim.start_again()
    capsys.readouterr()
    assert cli.main(["--server", ",".join(members), "datasets"]) == 0
    listing = capsys.readouterr().out
    assert f"{members[2]} serves version " in listing
    assert f"once it reaches {members[0]}" in listing
    victim.stop()
    victim.extra_args = FAST_2PC
    victim.start_again()  # prepared again after replay: it asks the first member
    wait_until(lambda: sealed_generation(members[2], "ds") == new_generation,
               "the restarted member to learn the commit", SETTLE_S)
    assert "committed it; committing here" in victim.log()
    with Client(members) as client:
        assert read_dataset(client, "ds") == new
        assert not client.dataset_infos()[0].disagreement


def test_the_first_member_dying_at_commit_aborts_everywhere_and_keeps_the_old_version(
        daemon_factory, tree):
    root, old, new = tree
    three = [daemon_factory(extra_args=FAST_2PC) for _ in range(3)]
    members = addresses(three)
    with Client(members) as client:
        first = client.ingest(str(root / "old"), "ds")
    decider = three[0]
    decider.stop()
    decider.extra_env = {"DLFS_FAULT": "seal:1:kill"}
    decider.start_again()
    with Client(members, reconnect_timeout_s=1) as client:
        with pytest.raises(Exception, match="first member"):
            client.ingest(str(root / "new"), "ds", replace=True)
    # Nobody knows the outcome until the first member is back: the others wait.
    for address in members[1:]:
        assert sealed_generation(address, "ds") == first.generation
    decider.extra_env = {}
    decider.start_again()  # prepared again; nobody commits: it aborts in 3 s

    def settled() -> bool:  # the new version's extents are gone everywhere
        return all(len(os.listdir(os.path.join(d.data_dir, "extents"))) == 1 for d in three)

    wait_until(settled, "every member to abort the new version", SETTLE_S)
    assert "decided to abort generation" in three[1].log()
    assert "decided to abort generation" in three[2].log()
    with Client(members) as client:
        assert read_dataset(client, "ds") == old
        assert [(i.name, i.generation, i.disagreement) for i in client.dataset_infos()] == [
            ("ds", first.generation, "")]


@pytest.mark.parametrize("first_alive", [True, False], ids=["first member answers",
                                                           "first member lost"])
def test_settle_commits_a_member_left_prepared(daemon_factory, tree, capsys, first_alive):
    root, old, new = tree
    three = [daemon_factory(extra_args=FAST_2PC) for _ in range(3)]
    members = addresses(three)
    with Client(members) as client:
        client.ingest(str(root / "old"), "ds", replicas=2)
    victim = three[2]  # dies at its commit, after the first member committed
    victim.stop()
    victim.extra_env = {"DLFS_FAULT": "seal:1:kill"}
    victim.start_again()
    with Client(members, reconnect_timeout_s=1) as client:
        new_generation = client.ingest(str(root / "new"), "ds", replace=True,
                                       replicas=2).generation
    victim.extra_env = {}
    victim.extra_args = ["--in-doubt-poll-s", "3600"]  # it would not ask by itself for now
    victim.start_again()
    assert sealed_generation(victim.address, "ds") != new_generation
    if not first_alive:
        three[0].kill()
        assert cli.main(["--server", victim.address, "settle", "ds"]) == 1
        assert "--first-member-lost" in capsys.readouterr().err
    capsys.readouterr()
    argv = ["--server", victim.address, "settle", "ds"] + ([] if first_alive else
                                                           ["--first-member-lost"])
    assert cli.main(argv) == 0
    said = capsys.readouterr().out
    assert f"generation {new_generation}: committed" in said
    assert (f"its first member {members[0]}" if first_alive else
            f"{members[1]}, which had committed it") in said
    assert sealed_generation(victim.address, "ds") == new_generation
    survivors = members if first_alive else members[1:]
    with Client(survivors) as client:  # 2 copies of each sample: the survivors hold one
        assert read_dataset(client, "ds") == new
    assert cli.main(["--server", victim.address, "settle", "ds"]) == 0
    assert "nothing to settle" in capsys.readouterr().out


def test_settle_without_a_lost_first_member_aborts_and_keeps_the_old_version(
        daemon_factory, tree, capsys):
    root, old, new = tree
    three = [daemon_factory(extra_args=FAST_2PC) for _ in range(3)]
    members = addresses(three)
    with Client(members) as client:
        first = client.ingest(str(root / "old"), "ds", replicas=2)
    decider = three[0]  # dies at its commit: the others stay prepared, and it never returns
    decider.stop()
    decider.extra_env = {"DLFS_FAULT": "seal:1:kill"}
    decider.start_again()
    with Client(members, reconnect_timeout_s=1) as client:
        with pytest.raises(Exception, match="first member"):
            client.ingest(str(root / "new"), "ds", replace=True, replicas=2)
    assert cli.main(["--server", members[1], "settle", "ds"]) == 1
    assert "does not answer" in capsys.readouterr().err
    assert cli.main(["--server", members[1], "settle", "ds", "--first-member-lost"]) == 0
    said = capsys.readouterr().out
    assert ": aborted, as decided by the operator" in said and "2 member(s) settled" in said
    for daemon in three[1:]:
        assert sealed_generation(daemon.address, "ds") == first.generation
        assert len(os.listdir(os.path.join(daemon.data_dir, "extents"))) == 1  # new one gone
    with Client(members[1:]) as client:
        assert read_dataset(client, "ds") == old  # the client learns of members[0] here
        # Striped over the daemons the client was given, not the dead one it learnt of.
        info = client.ingest(str(root / "new"), "ds2")
        assert info.samples == len(new) and list(info.members) == members[1:]
