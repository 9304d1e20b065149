"""The ingest state machine: every transition through the Store, with exact errors."""

from __future__ import annotations

import pytest

from dlfs.errors import (AlreadyExists, FailedPrecondition, InvalidArgument, NotFound,
                         StaleGeneration, Unavailable)
from dlfs.server.config import ServerConfig
from dlfs.server.ingest.ingest_registry import IngestState
from dlfs.server.store import Store
from helpers.stores import store_ingest as ingest
from helpers.stores import store_read as read


def admit(_name: str, _generation: int) -> None:
    """The gate a cluster member sets (it checks the change's intent in etcd; here every
    prepare is admitted: etcd's side is tested in tests/e2e/test_two_phase.py)."""


@pytest.fixture
def store(tmp_path):
    store = Store.open(ServerConfig(data_dir=str(tmp_path / "data"), extent_bytes_max=8192))
    store.ingests.prepare_gate = admit
    yield store
    store.close()


def extent_dirs(store) -> list[int]:
    return store.extents.dataset_ids_on_disk()


def receive(store, name, files, replace=False):
    session = store.ingests.begin(name, replace)
    for path, data in files.items():
        session.start_file(path, len(data), 0o100644, 1)
        session.write(data)
    store.check_invariants()
    return session


def test_two_phase_commit_publishes_only_at_commit(store):
    session = receive(store, "ds", {"a": b"alpha", "b": b"beta"})
    assert store.ingests.state(session) is IngestState.RECEIVING
    summary = store.ingests.prepare(session)
    assert (summary.name, summary.samples, summary.bytes, summary.sealed) == ("ds", 2, 9, False)
    assert store.ingests.state(session) is IngestState.PREPARED
    store.check_invariants()
    with pytest.raises(NotFound, match="still being ingested"):
        store.dataset("ds")
    with pytest.raises(FailedPrecondition, match="is prepared, not receiving"):
        store.ingests.commit(session)
    assert store.ingests.commit_prepared("ds").sealed
    assert store.ingests.state(session) is None
    store.check_invariants()
    assert read(store, store.dataset("ds"), [1, 0]) == [b"beta", b"alpha"]
    with pytest.raises(NotFound, match="no prepared ingest"):
        store.ingests.commit_prepared("ds")


def test_a_read_of_the_generation_a_prepared_member_awaits_is_stale_not_missing(store):
    """A cluster reader that learnt a new version from a member that committed it
    reaches this one before its commit: StaleGeneration, which readers wait out,
    not NotFound, which they take as a deleted dataset."""
    from dlfs.server.core.directory import Cluster

    generation = (1 << 62) | 7
    session = store.ingests.begin("ds", cluster=Cluster(("a:1", "b:2"), 1, 1, generation))
    session.start_file("f", 4, 0o100644, 1, holders=(1,))
    session.write(b"data")
    store.ingests.prepare(session)
    with pytest.raises(StaleGeneration, match="not committed on this daemon yet"):
        with store.reading("ds", generation):
            pass
    with pytest.raises(NotFound, match="still being ingested"):
        with store.reading("ds", generation + 1):
            pass
    with pytest.raises(NotFound, match="still being ingested"):
        with store.reading("ds"):
            pass
    assert store.ingests.commit_prepared("ds", generation).sealed
    with store.reading("ds", generation) as dataset:
        assert len(dataset) == 1


def test_abort_prepared_leaves_nothing(store):
    session = receive(store, "ds", {"a": b"alpha"})
    store.ingests.prepare(session)
    summary = store.ingests.abort_prepared("ds")
    assert (summary.samples, summary.sealed) == (1, False)
    assert store.ingests.state(session) is None
    assert extent_dirs(store) == []
    assert store.summaries() == []
    with pytest.raises(NotFound, match="no prepared ingest"):
        store.ingests.abort_prepared("ds")


def test_a_prepare_without_a_cluster_member_is_refused_and_keeps_nothing(tmp_path):
    """Without --etcd nobody could decide a prepared ingest: it is refused, not kept."""
    store = Store.open(ServerConfig(data_dir=str(tmp_path / "data")))
    session = receive(store, "ds", {"a": b"alpha"})
    with pytest.raises(FailedPrecondition, match="--etcd"):
        store.ingests.prepare(session)
    assert store.ingests.state(session) is None
    assert extent_dirs(store) == []
    store.check_invariants()
    with pytest.raises(NotFound, match="no prepared ingest"):
        store.ingests.commit_prepared("ds")
    assert ingest(store, "ds", {"b": b"beta"}).samples == 1  # the name is free
    store.close()



def test_a_failed_commit_aborts_the_ingest(store):
    session = store.ingests.begin("ds")
    session.start_file("a", 5, 0o100644, 1)
    session.write(b"al")
    with pytest.raises(InvalidArgument, match="the stream ended inside file 'a'"):
        store.ingests.commit(session)
    assert store.ingests.state(session) is None
    assert extent_dirs(store) == []
    store.ingests.abort(session, "again")  # idempotent
    with pytest.raises(NotFound, match="already been sealed or aborted"):
        store.ingests.commit(session)


def test_a_running_ingest_holds_its_name(store):
    session = receive(store, "ds", {"a": b"first"})
    with pytest.raises(AlreadyExists, match="being ingested by another client"):
        store.ingests.begin("ds", replace=True)
    assert [(s.name, s.sealed) for s in store.summaries()] == [("ds", False)]
    store.ingests.commit(session)
    replacing = receive(store, "ds", {"a": b"second"}, replace=True)
    assert read(store, store.dataset("ds"), [0]) == [b"first"]  # until the replace commits
    store.ingests.commit(replacing)
    assert read(store, store.dataset("ds"), [0]) == [b"second"]
    assert len(extent_dirs(store)) == 1


def test_abort_after_seal_changes_nothing(store):
    session = receive(store, "ds", {"a": b"alpha"})
    store.ingests.commit(session)
    store.ingests.abort(session, "too late")
    assert read(store, store.dataset("ds"), [0]) == [b"alpha"]
    assert len(extent_dirs(store)) == 1


def test_a_closed_store_is_unavailable(tmp_path):
    store = Store.open(ServerConfig(data_dir=str(tmp_path / "data")))
    ingest(store, "ds", {"a": b"alpha"})
    receiving = receive(store, "new", {"a": b"alpha"})
    prepared = receive(store, "two", {"a": b"alpha"})
    store.ingests.prepare_gate = admit
    store.ingests.prepare(prepared)
    store.close()
    assert store.ingests.state(receiving) is None
    assert store.ingests.state(prepared) is IngestState.PREPARED  # durable: kept for the restart
    with pytest.raises(Unavailable, match="shutting down"):
        store.ingests.begin("other")
    with pytest.raises(Unavailable, match="shutting down"):
        store.ingests.commit(receiving)
    with pytest.raises(Unavailable, match="shutting down"):
        store.ingests.commit_prepared("two")
    with pytest.raises(Unavailable, match="shutting down"):
        store.reading("ds")
    with pytest.raises(Unavailable, match="shutting down"):
        store.delete("ds")
    store.close()  # idempotent
    store = Store.open(ServerConfig(data_dir=str(tmp_path / "data")))
    assert store.directory.names() == ["ds"]  # the receiving ingest was discarded,
    assert [(i.name, i.sealed) for i in store.summaries()] == [("ds", True), ("two", False)]
    assert store.ingests.commit_prepared("two").sealed  # the prepared one waited for its commit
    assert store.directory.names() == ["ds", "two"]
    store.close()
