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
