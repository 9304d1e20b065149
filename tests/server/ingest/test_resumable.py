"""Resumable ingests in the storage core: checkpoints, parking, resume, restart, compaction."""

from __future__ import annotations

import os
import time

import pytest

from dlfs.formats import ingest_digest
from dlfs.crc import crc32c
from dlfs.errors import (AlreadyExists, DataCorruption, FailedPrecondition, NotFound,
                         ResumeConflict, StorageFull, Unavailable)
from dlfs.server.core import catalog as cat
from dlfs.server.core import faults
from dlfs.server.config import ServerConfig
from dlfs.server.ingest.ingest_registry import IngestState
from dlfs.server.store import Store
from helpers.stores import store_read


def config(tmp_path, **options):
    options.setdefault("ingest_checkpoint_bytes", 50_000)
    return ServerConfig(data_dir=str(tmp_path / "data"), extent_bytes_max=64 * 1024, **options)


def send(session, files: dict[str, bytes]):
    for path, data in files.items():
        session.start_file(path, len(data), 0o100644, 7)
        session.write(data)


def files_of(prefix: str, n: int, size: int = 3000) -> dict[str, bytes]:
    return {f"{prefix}{i:03d}": bytes([i % 251]) * (size + i) for i in range(n)}


def read_all(store, name) -> dict[str, bytes]:
    dataset = store.dataset(name)
    return dict(zip((dataset.path(i) for i in range(len(dataset))),
                    store_read(store, dataset, range(len(dataset)))))


def resume_and_seal(store, held: int, rest: dict[str, bytes]) -> None:
    """Resume the parked ingest of "ds" after the `held` files it holds, send `rest`, seal."""
    session = store.ingests.resume("ds", held)
    send(session, rest)
    store.ingests.commit(session)


def digest_of(files: dict[str, bytes]) -> bytes:
    digest = ingest_digest.EMPTY
    for path, data in files.items():
        digest = ingest_digest.chain(digest, path, len(data), 7)
    return digest


def test_a_broken_stream_parks_and_a_resume_continues_after_what_is_durable(tmp_path):
    store = Store.open(config(tmp_path))
    try:
        first, rest = files_of("a", 30), files_of("b", 20)
        session = store.ingests.begin("ds", resumable=True)
        send(session, first)
        session.start_file("b000", 5000, 0o100644, 7)  # cut off in the middle of a file
        session.write(b"x" * 100)
        store.ingests.break_off(session, "the client went away")
        assert store.ingests.state(session) is IngestState.PARKED
        store.check_invariants()
        progress = store.ingests.progress("ds")
        assert (progress.state, progress.samples) == ("parked", 30)
        assert progress.digest == digest_of(first) and progress.last_path == "a029"
        with pytest.raises(NotFound, match="broke off"):
            store.dataset("ds")
        with pytest.raises(AlreadyExists, match="--resume"):
            store.ingests.begin("ds", resumable=True)
        with pytest.raises(ResumeConflict, match="holds 30"):
            store.ingests.resume("ds", 29)
        with pytest.raises(ResumeConflict, match="other options"):
            store.ingests.resume("ds", 30, replace=True)
        resume_and_seal(store, 30, rest)
        assert read_all(store, "ds") == {**first, **rest}
    finally:
        store.close()
    store = Store.open(config(tmp_path))  # what was sealed after a resume survives a restart
    try:
        assert read_all(store, "ds") == {**first, **rest}
    finally:
        store.close()


def test_a_restart_brings_back_the_last_checkpoint_and_voids_what_came_after(tmp_path):
    store = Store.open(config(tmp_path, ingest_checkpoint_bytes=1 << 30))
    first = files_of("a", 40)
    session = store.ingests.begin("ds", resumable=True)
    send(session, first)
    checkpoint = session.take_checkpoint()
    send(session, files_of("z", 5))  # recorded, but never checkpointed
    session._flush_entries()  # noqa: SLF001 - its SAMPLES records reach the catalog
    store.close()  # a resumable ingest is left as its last checkpoint says
    store = Store.open(config(tmp_path, ingest_checkpoint_bytes=1 << 30))
    try:
        progress = store.ingests.progress("ds")
        assert (progress.state, progress.samples) == ("parked", checkpoint.samples)
        assert progress.digest == checkpoint.digest
        kept = dict(list(first.items())[:checkpoint.samples])
        rest = dict(list({**first, **files_of("c", 10)}.items())[checkpoint.samples:])
        session = store.ingests.resume("ds", checkpoint.samples)
        send(session, rest)
        store.ingests.commit(session)
        assert read_all(store, "ds") == {**kept, **rest}
        assert "z000" not in read_all(store, "ds")
    finally:
        store.close()


def test_a_resume_that_breaks_off_before_its_first_file_keeps_what_was_durable(tmp_path):
    """A resumed writer starts in a new extent; until a file arrives there, its
    checkpoints must still name where the old extent's durable part ends (a
    checkpoint of 'extent end 0' made the next resume cut that extent to
    nothing, and the sealed dataset then pointed past its end)."""
    store = Store.open(config(tmp_path))
    first, rest = files_of("a", 30), files_of("b", 20)
    session = store.ingests.begin("ds", resumable=True)
    send(session, first)
    store.ingests.break_off(session, "the client went away")
    for _ in range(2):  # resumed, and broken off again before a file arrived
        session = store.ingests.resume("ds", 30)
        store.ingests.break_off(session, "the client went away again")
    store.close()
    store = Store.open(config(tmp_path))  # and once across a restart
    try:
        session = store.ingests.resume("ds", 30)
        store.ingests.break_off(session, "the client went away after the restart")
        resume_and_seal(store, 30, rest)
        assert read_all(store, "ds") == {**first, **rest}
    finally:
        store.close()


def test_a_checkpoint_racing_the_daemon_stopping_never_claims_dropped_bytes(tmp_path):
    """Stopping the daemon closes a receiving ingest's extent from another thread,
    dropping what was not synced yet; the stream's thread, still running, must
    not then record a CHECKPOINT claiming those bytes (it did: the next start
    parked files the extent no longer held, and the sealed dataset was cut)."""
    store = Store.open(config(tmp_path, ingest_checkpoint_bytes=1 << 30))
    first = files_of("a", 40)
    session = store.ingests.begin("ds", resumable=True)
    send(session, first)
    checkpoint = session.take_checkpoint()
    send(session, files_of("z", 5))  # received, not synced
    session.close_writer()  # what a stopping daemon does to it, on its own thread
    with pytest.raises(Unavailable, match="stopping"):  # the stream's thread, before
        session.take_checkpoint()  # the daemon closes its catalog
    with pytest.raises(Unavailable, match="stopping"):
        send(session, files_of("y", 1))
    store.close()
    store = Store.open(config(tmp_path, ingest_checkpoint_bytes=1 << 30))
    try:
        assert store.ingests.progress("ds").samples == checkpoint.samples == 40
        session = store.ingests.resume("ds", 40)
        store.ingests.commit(session)
        assert read_all(store, "ds") == first
    finally:
        store.close()


def test_a_resume_refuses_an_extent_shorter_than_its_checkpoint(tmp_path):
    store = Store.open(config(tmp_path))
    session = store.ingests.begin("ds", resumable=True)
    send(session, files_of("a", 10))
    store.ingests.break_off(session, "the client went away")
    checkpoint = session.checkpoint
    path = store.extents.extent_path(session.dataset_id, checkpoint.extent_no)
    os.truncate(path, checkpoint.extent_end - 1)  # a disk that lost synced bytes
    try:
        with pytest.raises(DataCorruption, match="`dlfs discard ds` ends it"):
            store.ingests.resume("ds", 10)
        assert store.ingests.progress("ds").state == "parked"  # still there, to remove
        store.discard_ingest("ds")
    finally:
        store.close()


def test_parked_ingests_survive_compaction_and_expire(tmp_path):
    store = Store.open(config(tmp_path, resumable_ingest_timeout_s=3600,
                              catalog_compact_dead_bytes_min=1))
    for version in range(5):  # dead records, so that the next start compacts
        session = store.ingests.begin("churn", replace=version > 0)
        send(session, files_of("f", 50, 100))
        store.ingests.commit(session)
    files = files_of("p", 25)
    session = store.ingests.begin("parked", resumable=True)
    send(session, files)
    store.ingests.break_off(session, "gone")
    size = os.path.getsize(os.path.join(str(tmp_path / "data"), "catalog.log"))
    store.close()
    store = Store.open(config(tmp_path, resumable_ingest_timeout_s=0.3,
                              catalog_compact_dead_bytes_min=1))
    try:
        assert os.path.getsize(os.path.join(str(tmp_path / "data"), "catalog.log")) < size
        progress = store.ingests.progress("parked")
        assert (progress.state, progress.samples) == ("parked", 25)
        assert [i.ingest_state for i in store.summaries() if i.name == "parked"] == ["parked"]
        for _ in range(50):
            if store.extents.dataset_ids_on_disk() == [store.dataset("churn").dataset_id]:
                break
            time.sleep(0.05)
        with pytest.raises(NotFound):
            store.ingests.progress("parked")
        assert store.extents.dataset_ids_on_disk() == [store.dataset("churn").dataset_id]
    finally:
        store.close()
    records = cat.scan(os.path.join(str(tmp_path / "data"), "catalog.log")).records
    assert records[-1][0] is cat.RecordType.DELETE  # the expiry is durable


def test_delete_and_discard_each_remove_only_what_they_name(tmp_path):
    """A parked ingest and a sealed dataset of one name (a --replace that broke off):
    DeleteDataset removes the dataset only, DiscardIngest the parked ingest only
    (DeleteDataset used to discard both)."""
    store = Store.open(config(tmp_path))
    try:
        old = files_of("old", 5)
        session = store.ingests.begin("ds")
        send(session, old)
        store.ingests.commit(session)
        sealed_id = store.dataset("ds").dataset_id
        session = store.ingests.begin("ds", replace=True, resumable=True)
        send(session, files_of("a", 10))
        store.ingests.break_off(session, "gone")
        summary = store.discard_ingest("ds")
        assert (summary.samples, summary.sealed) == (10, False)
        assert read_all(store, "ds") == old  # the sealed dataset is untouched
        assert store.extents.dataset_ids_on_disk() == [sealed_id]
        with pytest.raises(NotFound):
            store.ingests.progress("ds")
        with pytest.raises(NotFound, match=r"no parked ingest .*; the sealed dataset 'ds' "
                                           r"stays \(`dlfs rm ds` removes it\)"):
            store.discard_ingest("ds")

        session = store.ingests.begin("ds", replace=True, resumable=True)
        send(session, files_of("b", 10))
        store.ingests.break_off(session, "gone")
        assert store.delete("ds").sealed  # the dataset only
        assert store.ingests.progress("ds").state == "parked"
        assert store.extents.dataset_ids_on_disk() == [session.dataset_id]
        with pytest.raises(NotFound, match="parked with 10 files: `dlfs discard ds` ends it"):
            store.delete("ds")
        session = store.ingests.resume("ds", 10, replace=True)  # still whole: resumable
        with pytest.raises(FailedPrecondition, match="still receiving, not parked"):
            store.discard_ingest("ds")
        store.ingests.break_off(session, "gone again")
        store.discard_ingest("ds")
        assert store.extents.dataset_ids_on_disk() == []
        session = store.ingests.begin("ds")  # the name is free
        store.ingests.abort(session, "done")
    finally:
        store.close()


def test_a_non_resumable_ingest_still_leaves_nothing(tmp_path):
    store = Store.open(config(tmp_path))
    try:
        session = store.ingests.begin("ds")
        send(session, files_of("a", 10))
        store.ingests.break_off(session, "gone")
        assert store.ingests.state(session) is None
        assert store.extents.dataset_ids_on_disk() == []
    finally:
        store.close()


def test_a_discard_whose_record_meets_a_full_disk_still_frees_the_space(tmp_path):
    """The DELETE of a discarded parked ingest cannot be written (ENOSPC at the catalog):
    its extents go all the same, and the restart, finding a parked ingest whose
    extents are gone, discards it instead of parking it again (a resume of it
    could only fail)."""
    store = Store.open(config(tmp_path))
    session = store.ingests.begin("ds", resumable=True)
    send(session, files_of("a", 10))
    store.ingests.break_off(session, "gone")
    plan = faults.install("write:1:ENOSPC")
    faults.serving()
    try:
        assert store.discard_ingest("ds").samples == 10
        assert plan.fired  # the DELETE met the full disk
    finally:
        faults.install(None)
    try:
        assert store.extents.dataset_ids_on_disk() == []
        with pytest.raises(NotFound):
            store.ingests.progress("ds")
    finally:
        store.close()
    store = Store.open(config(tmp_path))
    try:
        with pytest.raises(NotFound):
            store.ingests.progress("ds")
        assert store.summaries() == []
    finally:
        store.close()
    records = cat.scan(os.path.join(str(tmp_path / "data"), "catalog.log")).records
    assert records[-1][0] is cat.RecordType.DELETE  # written by the restart


def test_a_catalog_write_that_fails_mid_block_parks_at_the_last_checkpoint(tmp_path):
    """A striped member's SAMPLES record is written, its HOLDERS record meets a full
    disk.  Writing that block again, as the checkpoint at the break did, left the
    samples twice in the catalog, the first time without their holders; now the
    session records nothing more and parks at its last checkpoint, whose later
    records are void, and the resumed dataset comes out whole."""
    from dlfs.server.core.directory import Cluster

    cluster = Cluster(("a:1", "b:2"), 1, 0, 1 << 62 | 5)
    store = Store.open(config(tmp_path, ingest_checkpoint_bytes=1 << 30))
    first, rest = files_of("a", 4), files_of("b", 6)

    def send_striped(session, files):
        for i, (path, data) in enumerate(files.items()):
            if i % 2:  # the other member holds every other file
                session.add_remote(path, len(data), 0o100644, 7, crc32c(data), (1,))
            else:
                session.start_file(path, len(data), 0o100644, 7, holders=(0,))
                session.write(data)

    session = store.ingests.begin("ds", cluster=cluster, resumable=True)
    send_striped(session, first)
    session.take_checkpoint()
    send_striped(session, rest)
    plan = faults.install("write:3:ENOSPC")  # the extent's flush, SAMPLES, then HOLDERS
    faults.serving()
    try:
        with pytest.raises(StorageFull):
            session.take_checkpoint()
        assert plan.fired
    finally:
        faults.install(None)
    store.ingests.break_off(session, "the disk is full")
    assert store.ingests.progress("ds").samples == 4  # back to the last checkpoint
    store.close()
    store = Store.open(config(tmp_path, ingest_checkpoint_bytes=1 << 30))
    try:
        assert (store.ingests.progress("ds").state, store.ingests.progress("ds").samples) == \
            ("parked", 4)
        session = store.ingests.resume("ds", 4, cluster=cluster)
        send_striped(session, rest)
        store.ingests.commit(session)
        dataset = store.dataset("ds")
        everything = {**first, **rest}
        assert [dataset.path(i) for i in range(len(dataset))] == sorted(everything)
        holders = [int(dataset.holders[i][0]) for i in range(len(dataset))]
        assert holders == [list(everything).index(p) % 2 for p in sorted(everything)]
    finally:
        store.close()
