"""Store: the daemon's storage core behind one object.

Owns the data dir (locked against a second daemon, dirlock.py), the
catalog, the extent files, the sample directory and the read engine.
`Store.open` replays the catalog into the directory (replay.py).  Every
mutation goes through here so catalog, directory and extents stay
consistent: the Store makes every ingest state change (the states live in
ingest_registry.py), publishes and deletes datasets, and frees a dataset's
extents when its last read lease ends (leases.py).  Data flows one way:
service -> store -> directory / read engine -> extent files.

The data dir layout is in `dlfs.layout`.  Nothing here imports grpc.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from typing import ContextManager, Iterator, Sequence

import numpy as np

from dlfs import layout, limits
from dlfs.errors import (AlreadyExists, FailedPrecondition, NotFound, Overloaded,
                         ResumeConflict, StaleGeneration, Unavailable)
from dlfs.paths import check_dataset_name
from dlfs.server import catalog as cat
from dlfs.server import planning
from dlfs.server.config import ServerConfig
from dlfs.server.directory import Cluster, DatasetIndex, SampleDirectory
from dlfs.server.dirlock import DataDirLock
from dlfs.server.extents import ExtentFiles, ExtentStore, ExtentWriter
from dlfs.server.ingest import IngestSession
from dlfs.server.ingest_registry import IngestRegistry, IngestState
from dlfs.server.leases import ReadLeases
from dlfs.server.metrics import Metrics
from dlfs.server.prefetch import Prefetcher
from dlfs.server.planning import BatchPlan
from dlfs.server.reader import ReadEngine
from dlfs.server.replay import release_free_heap, restore
from dlfs.server.resumable import ParkedIngest, ProgressInfo
from dlfs.server.scrub import scrub as scrub_dataset
from dlfs.types import DaemonStatus, DatasetInfo

log = logging.getLogger(__name__)


class Store:
    """The storage core.  Thread-safe.  Use `Store.open(config)`; `close()` when done.

    `_mutex` guards the ingest registry, the next dataset id, and each
    publish or delete together with its catalog record.  The read leases
    have their own lock; no code holds `_mutex` while taking it.
    """

    def __init__(self, config: ServerConfig, dir_lock: DataDirLock, catalog: cat.Catalog,
                 extents: ExtentStore, directory: SampleDirectory, next_dataset_id: int,
                 parked: Sequence[ParkedIngest] = ()):
        self.config = config
        self.directory = directory
        self.extents = extents
        self.metrics = Metrics()
        self._dir_lock = dir_lock
        self._catalog = catalog
        self._files = ExtentFiles(extents, config.open_extents_max)
        self._engine = ReadEngine(self._files, threads=config.reader_threads,
                                  chunk_bytes=config.chunk_bytes,
                                  inflight_bytes_max=config.inflight_bytes_max,
                                  metrics=self.metrics)
        self._prefetcher = Prefetcher(self._files)
        self._mutex = threading.Lock()
        self._next_dataset_id = next_dataset_id
        self._ingests = IngestRegistry(expire=self._expire,
                                       parked_timeout_s=config.resumable_ingest_timeout_s)
        self._leases = ReadLeases(free=self._free_extents)
        self._closed = False
        for entry in parked:  # resumable ingests that broke off before the restart
            session = IngestSession.restored(entry.name, entry.dataset_id, entry.created_ns,
                                             catalog, entry.blocks, entry.checkpoint,
                                             entry.cluster)
            session.checkpoint_bytes = config.ingest_checkpoint_bytes
            session.checkpoint_interval_s = config.ingest_checkpoint_interval_s
            waited_s = max(0.0, (time.time_ns() - entry.checkpoint.time_ns) / 1e9)
            self._ingests.add_parked(session, entry.checkpoint.time_ns,
                                     config.resumable_ingest_timeout_s - waited_s)
            log.warning("ingest of dataset %r is parked with %d files durable (it broke off "
                        "when the daemon stopped); `dlfs ingest --resume` continues it",
                        entry.name, entry.checkpoint.samples)

    # --- lifecycle -------------------------------------------------------------

    @classmethod
    def open(cls, config: ServerConfig) -> "Store":
        """Lock the data dir, replay the catalog, drop leftovers of interrupted ingests.

        Raises CatalogCorrupt (see catalog.scan) and a RuntimeError naming
        the data dir when another daemon holds it.
        """
        data_dir = config.data_dir
        os.makedirs(data_dir, mode=0o700, exist_ok=True)
        dir_lock = DataDirLock.acquire(data_dir)
        try:
            started = time.monotonic()
            catalog, replayed = cat.Catalog.open(os.path.join(data_dir, layout.CATALOG_FILE),
                                                 salvage=config.salvage_catalog)
            extents = ExtentStore(data_dir)
            directory, next_dataset_id, parked = restore(catalog, replayed.records, extents)
            del replayed
            release_free_heap()
            datasets = directory.all()
            log.info("catalog replayed: %d datasets, %d samples, %d catalog bytes in %.2f s",
                     len(datasets), sum(len(d) for d in datasets), catalog.size,
                     time.monotonic() - started)
            return cls(config, dir_lock, catalog, extents, directory, next_dataset_id, parked)
        except BaseException:
            dir_lock.release()
            raise

    def close(self) -> None:
        """Abort running ingests, stop readers, flush and close the catalog.  Idempotent.

        Resumable ingests are left as their last checkpoint recorded them: the
        next start brings them back parked.
        """
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            sessions = self._ingests.sessions()
            for session in sessions:
                self._ingests.move(session, IngestState.ABORTED)
        for session in sessions:
            if not session.resumable:
                self._discard(session, "the daemon is shutting down")
        self._prefetcher.close()
        self._engine.close()
        self._files.close()
        self._catalog.close()
        self._dir_lock.release()

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable("the daemon is shutting down; retry once it is back")

    # --- datasets ----------------------------------------------------------------

    def dataset(self, name: str) -> DatasetIndex:
        """The sealed dataset `name`.  O(1).  Raises InvalidArgument, NotFound."""
        check_dataset_name(name)
        found = self.directory.find(name)
        if found is not None:
            return found
        with self._mutex:
            found = self._ingests.find(name)
        if found is not None and found[1] is IngestState.PARKED:
            raise NotFound(f"dataset {name!r} is an ingest that broke off (parked); it can be "
                           "read once `dlfs ingest --resume` finishes it")
        if found is not None:
            raise NotFound(f"dataset {name!r} is still being ingested; it can be read once "
                           "the ingest finishes")
        return self.directory.get(name)

    def reading(self, name: str, generation: int = 0) -> ContextManager[DatasetIndex]:
        """The sealed dataset `name`, whose extents stay on disk until the block ends.

        A delete or replace that lands meanwhile unpublishes the dataset at
        once but frees its extents only when the last such block ends, so a
        read that resolved the old dataset finishes with the old bytes
        instead of failing on a vanished extent file (leases.py).  With a
        `generation`, only that version will do: StaleGeneration otherwise.
        Raises InvalidArgument, NotFound, StaleGeneration, Unavailable
        (shutting down).
        """
        self.dataset(name)  # raises the NotFound that names a running ingest
        self._check_open()

        def resolve() -> DatasetIndex:
            dataset = self.directory.get(name)
            if generation and dataset.generation != generation:
                raise StaleGeneration(
                    f"dataset {name!r} was replaced: version {generation} is no longer "
                    f"served (the current one is {dataset.generation}); open it again")
            return dataset

        return self._leases.hold(resolve)

    def _free_extents(self, dataset_id: int) -> None:
        self._files.forget_dataset(dataset_id)
        self.extents.remove_dataset(dataset_id)

    def summaries(self) -> list[DatasetInfo]:
        """Sealed datasets and running ingests, sorted by name."""
        result = {d.name: d.summary() for d in self.directory.all()}
        with self._mutex:
            for session in self._ingests.sessions():
                state = self._ingests.state(session)
                result.setdefault(session.name, dataclasses.replace(
                    session.summary(), ingest_state=state.value if state else ""))
        return [result[name] for name in sorted(result)]

    def delete(self, name: str) -> DatasetInfo:
        """Remove a sealed dataset durably, then free its extents (after its last read).

        A parked ingest of `name` is discarded too (its summary is returned
        when there is no sealed dataset).  Raises InvalidArgument, NotFound,
        FailedPrecondition (only an ingest in progress has that name),
        Unavailable (shutting down).
        """
        check_dataset_name(name)
        parked = None
        with self._mutex:
            self._check_open()
            found = self._ingests.find(name)
            if found is not None and found[1] is IngestState.PARKED:
                parked = found[0]
                self._ingests.move(parked, IngestState.ABORTED)
            elif found is not None and self.directory.find(name) is None:
                raise FailedPrecondition(
                    f"dataset {name!r} is being ingested ({found[1].value}); stop that ingest "
                    "first (it can be removed once it is sealed or has broken off)")
            dataset = None
            if parked is None or self.directory.find(name) is not None:
                dataset = self.directory.remove(name)
                self._catalog.append(cat.RecordType.DELETE,
                                     cat.encode_delete(dataset.dataset_id), sync=True)
        if parked is not None:
            self._discard(parked, "removed by DeleteDataset")
        if dataset is None:
            return parked.summary()
        self._leases.retire(dataset.dataset_id)
        log.info("deleted dataset %r (%d samples)", name, len(dataset))
        return dataset.summary()

    # --- ingest: every state change of ingest_registry happens below --------------

    def begin_ingest(self, name: str, replace: bool = False,
                     cluster: Cluster | None = None, resumable: bool = False) -> IngestSession:
        """Start an ingest of dataset `name` (RECEIVING): a BEGIN record, an extent directory;
        `resumable`: and a first CHECKPOINT (resumable.py).

        Raises AlreadyExists (name taken without `replace`, being ingested,
        or a parked ingest of that name), Overloaded (too many ingests),
        Unavailable (shutting down), InvalidArgument (bad name).
        """
        check_dataset_name(name)
        with self._mutex:
            self._check_open()
            found = self._ingests.find(name)
            if found is not None and found[1] is IngestState.PARKED:
                raise AlreadyExists(
                    f"an ingest of dataset {name!r} broke off and is parked with "
                    f"{found[0].samples} files durable: continue it with `dlfs ingest --resume` "
                    f"(same sources and options), or discard it with `dlfs rm {name}`")
            if found is not None:
                raise AlreadyExists(f"dataset {name!r} is being ingested by another client")
            if not replace and self.directory.find(name) is not None:
                raise AlreadyExists(
                    f"dataset {name!r} exists; pass --replace (replace=True) to replace it, or "
                    "choose another name"
                )
            self._check_ingest_slots()
            dataset_id = self._next_dataset_id
            self._next_dataset_id += 1
            created_ns = time.time_ns()
            writer = ExtentWriter(self.extents, dataset_id, created_ns,
                                  self.config.extent_bytes_max, label=f"dataset {name!r}")
            for record_type, payload in cat.start_records(dataset_id, created_ns, name, cluster):
                self._catalog.append(record_type, payload)
            session = IngestSession(name, dataset_id, created_ns, self._catalog, writer,
                                    replace, cluster, resumable=resumable,
                                    checkpoint_bytes=self.config.ingest_checkpoint_bytes,
                                    checkpoint_interval_s=self.config.ingest_checkpoint_interval_s)
            self._ingests.add(session)
        if resumable:
            try:
                session.take_checkpoint()
            except BaseException as exc:
                self.abort_ingest(session, f"{type(exc).__name__}: {exc}")
                raise
        return session

    def _check_ingest_slots(self) -> None:
        """Raise Overloaded when ingests_concurrent_max streams run (caller holds `_mutex`)."""
        running = self._ingests.active_count()
        if running >= self.config.ingests_concurrent_max:
            raise Overloaded(
                f"{running} ingests are running, the limit (--ingests-concurrent-max) is "
                f"{self.config.ingests_concurrent_max}; retry later")

    def resume_ingest(self, name: str, resume_from: int, replace: bool = False,
                      cluster: Cluster | None = None) -> IngestSession:
        """Continue the parked (or prepared) resumable ingest of `name` (-> RECEIVING).

        `resume_from` is the number of files the client skips: it must be
        what the daemon holds, and `replace` and `cluster` must be the
        ingest's own.  The extent the last checkpoint ends in is cut there
        and new data goes to a new extent.  Raises NotFound (nothing to
        resume), ResumeConflict, Overloaded, Unavailable, StorageFull.
        """
        check_dataset_name(name)
        with self._mutex:
            self._check_open()
            found = self._ingests.find(name)
            if found is None or not found[0].resumable:
                raise NotFound(f"no ingest of dataset {name!r} to resume (never started, sealed, "
                               "removed, or not resumed within --resumable-ingest-timeout-s)")
            session, state = found
            if state is IngestState.RECEIVING:
                raise ResumeConflict(f"the ingest of dataset {name!r} is still receiving from "
                                     "another client; resume it once that stream has ended")
            if resume_from != session.samples:
                raise ResumeConflict(
                    f"the ingest of dataset {name!r} holds {session.samples} files durably, the "
                    f"resume assumed {resume_from}; ask again (GetIngestProgress)")
            if replace != session.replace or cluster != session.cluster:
                raise ResumeConflict(
                    f"the ingest of dataset {name!r} was started with other options (replace "
                    f"{session.replace}, striping {session.cluster}); resume it with the same")
            self._check_ingest_slots()
            position = session.checkpoint
            self._ingests.move(session, IngestState.RECEIVING)
        try:
            writer = ExtentWriter(self.extents, session.dataset_id, session.created_ns,
                                  self.config.extent_bytes_max, label=f"dataset {name!r}",
                                  resume_after=(position.extent_no, position.extent_end))
            session.resume(writer)
        except BaseException as exc:
            self.break_off(session, f"the resume failed: {type(exc).__name__}: {exc}")
            raise
        log.info("resuming the ingest of dataset %r after %d files", name, resume_from)
        return session

    def break_off(self, session: IngestSession, reason: str) -> None:
        """The ingest's stream failed: park a resumable RECEIVING ingest (checkpoint,
        then PARKED), abort any other.  Never raises."""
        with self._mutex:
            state = self._ingests.state(session)
            if state is None:
                return
            park = session.resumable and state is IngestState.RECEIVING and not self._closed
        if not park:
            self.abort_ingest(session, reason)
            return
        try:
            checkpoint = session.park()
        except Exception as exc:  # noqa: BLE001 - then nothing can be trusted: discard
            self.abort_ingest(session, f"{reason}; parking it failed too: {exc}")
            return
        with self._mutex:
            if self._ingests.state(session) is not IngestState.RECEIVING:
                return
            self._ingests.move(session, IngestState.PARKED)
        log.warning("ingest of dataset %r broke off (%s); parked with %d files durable, kept "
                    "%.0f s for a resume", session.name, reason, checkpoint.samples,
                    self.config.resumable_ingest_timeout_s)

    def ingest_progress(self, name: str) -> ProgressInfo:
        """What the unsealed ingest of `name` holds durably (GetIngestProgress).

        Raises NotFound (no unsealed ingest of that name), InvalidArgument.
        """
        check_dataset_name(name)
        with self._mutex:
            found = self._ingests.find(name)
            if found is None:
                raise NotFound(f"no unsealed ingest of dataset {name!r} (never started, sealed, "
                               "removed, or not resumed within --resumable-ingest-timeout-s)")
            session, state = found
            parked_ns, expires_in_s = self._ingests.parked_times(session)
            checkpoint = session.checkpoint
        if checkpoint is None:  # not resumable: nothing of it survives a break
            samples, size, digest = 0, 0, b""
        else:
            samples, size, digest = checkpoint.samples, checkpoint.bytes, checkpoint.digest
        last_path = session.last_path if samples == session.samples else ""
        return ProgressInfo(name, state.value, samples, size, digest, last_path, session.replace,
                            session.cluster, parked_ns, expires_in_s)

    def commit_ingest(self, session: IngestSession) -> DatasetInfo:
        """Finish a RECEIVING ingest, then seal and publish it (one-phase commit).

        Durable when it returns: extents fsync'ed, SEAL appended, catalog
        fsync'ed.  A replaced dataset's extents are freed after its last
        read.  Raises InvalidArgument (unfinished file, duplicate path,
        file/directory conflict), AlreadyExists (the name was published
        meanwhile and `replace` is off), StorageFull, Unavailable (shutting
        down); the ingest is aborted then.  FailedPrecondition or NotFound
        when the session is not receiving (prepared, or already ended).
        """
        index = self._finish(session)
        return self._seal(session, IngestState.RECEIVING, index)

    def prepare_ingest(self, session: IngestSession) -> DatasetInfo:
        """Finish a RECEIVING ingest without publishing it (PREPARED; phase one of two).

        The dataset is durable and checked; it waits for `commit_prepared`
        or `abort_prepared`, at most `limits.prepared_ingest_timeout_s`,
        then it is aborted.  Returns its (unsealed) summary.  Raises as
        `commit_ingest` (but for AlreadyExists, checked at commit).
        """
        index = self._finish(session)
        if session.resumable:
            try:
                session.take_checkpoint()  # a restart or a timeout then parks it, complete
            except BaseException as exc:
                self.abort_ingest(session, f"{type(exc).__name__}: {exc}")
                raise
        with self._mutex:
            self._expect(session, IngestState.RECEIVING)  # only a shutdown ends it meanwhile
            self._ingests.move(session, IngestState.PREPARED, index)
        return session.summary()

    def commit_prepared(self, name: str) -> DatasetInfo:
        """Seal and publish the prepared ingest of `name` (CommitIngest).

        Raises NotFound (none prepared), InvalidArgument (bad name), and
        AlreadyExists, StorageFull, Unavailable as `commit_ingest`; a failed
        commit aborts the ingest.
        """
        check_dataset_name(name)
        with self._mutex:
            self._check_open()
            session, index = self._ingests.require_prepared(name)
        return self._seal(session, IngestState.PREPARED, index)

    def abort_prepared(self, name: str) -> DatasetInfo:
        """Discard the prepared ingest of `name` (AbortIngest); return its summary.

        Raises NotFound (none prepared), InvalidArgument, Unavailable.
        """
        check_dataset_name(name)
        with self._mutex:
            self._check_open()
            session, _index = self._ingests.require_prepared(name)
            self._ingests.move(session, IngestState.ABORTED)
        self._discard(session, "aborted by the client")
        return session.summary()

    def abort_ingest(self, session: IngestSession, reason: str) -> None:
        """Discard a running ingest: a DELETE record, its extents removed, `reason` logged.

        Idempotent: an ingest already sealed or aborted is left alone.
        Never raises.
        """
        with self._mutex:
            if self._ingests.state(session) is None:
                return
            self._ingests.move(session, IngestState.ABORTED)
        self._discard(session, reason)

    def ingest_state(self, session: IngestSession) -> IngestState | None:
        """RECEIVING or PREPARED while the ingest runs; None once sealed or aborted."""
        with self._mutex:
            return self._ingests.state(session)

    def check_invariants(self) -> None:
        """Assert the ingests and the directory agree.  O(datasets + ingests); for tests."""
        with self._mutex:
            self._ingests.check_invariants()
            running = {s.dataset_id for s in self._ingests.sessions()}
            published = {d.dataset_id for d in self.directory.all()}
            assert not running & published, "a running ingest's dataset is published"
            assert all(i < self._next_dataset_id for i in running | published)

    def _finish(self, session: IngestSession) -> DatasetIndex:
        """`session.finish()` of a RECEIVING ingest; aborts the ingest when it fails."""
        with self._mutex:
            self._expect(session, IngestState.RECEIVING)
        try:
            return session.finish()
        except BaseException as exc:
            self.abort_ingest(session, f"{type(exc).__name__}: {exc}")
            raise

    def _seal(self, session: IngestSession, expected: IngestState,
              index: DatasetIndex) -> DatasetInfo:
        """Durably seal and publish `index` if `session` is still `expected` (-> SEALED)."""
        try:
            with self._mutex:
                self._expect(session, expected)
                previous = self.directory.find(session.name)
                if previous is not None and not session.replace:
                    raise AlreadyExists(f"dataset {session.name!r} appeared during the ingest")
                replaces = previous.dataset_id if previous is not None else 0
                self._catalog.append(cat.RecordType.SEAL,
                                     cat.encode_seal(session.dataset_id, replaces), sync=True)
                self.directory.publish(index)
                self._ingests.move(session, IngestState.SEALED)
        except BaseException as exc:
            self.abort_ingest(session, f"commit failed: {type(exc).__name__}: {exc}")
            raise
        if previous is not None:
            self._leases.retire(previous.dataset_id)
        self.metrics.ingested_samples.inc(len(index))
        self.metrics.ingested_bytes.inc(index.total_bytes)
        log.info("sealed dataset %r: %d samples, %d bytes%s", index.name, len(index),
                 index.total_bytes, " (replaced the previous one)" if previous else "")
        return index.summary()

    def _expire(self, session: IngestSession) -> None:
        """Timer thread: abort a prepared ingest nobody committed in time (park it if
        resumable), and a parked one nobody resumed in time."""
        with self._mutex:
            state = self._ingests.state(session)
            if state is IngestState.PREPARED and session.resumable and not self._closed:
                self._ingests.move(session, IngestState.PARKED)
                log.warning("prepared ingest of dataset %r was not committed within %.0f s; "
                            "parked for a resume", session.name, limits.prepared_ingest_timeout_s)
                return
            if state not in (IngestState.PREPARED, IngestState.PARKED):
                return  # committed, resumed or aborted meanwhile
            self._ingests.move(session, IngestState.ABORTED)
        if state is IngestState.PREPARED:
            self._discard(session, f"not committed within {limits.prepared_ingest_timeout_s:.0f} s")
        else:
            self._discard(session, f"not resumed within "
                                   f"{self.config.resumable_ingest_timeout_s:.0f} s")

    def _discard(self, session: IngestSession, reason: str) -> None:
        """What ABORTED means on disk (after the move, outside `_mutex`)."""
        log.warning("ingest of dataset %r aborted: %s", session.name, reason)
        session.discard()
        if session.resumable:  # a parked session has no writer to remove its extents
            self.extents.remove_dataset(session.dataset_id)

    def _expect(self, session: IngestSession, state: IngestState) -> None:
        """Raise unless `session` is in `state` (caller holds `_mutex`)."""
        self._check_open()  # closing aborts every ingest: Unavailable says why
        self._ingests.require(session, state)

    # --- reads -------------------------------------------------------------------

    def plan(self, dataset: DatasetIndex, ids: Sequence[int] | None = None,
             paths: Sequence[str] | None = None) -> tuple[np.ndarray, BatchPlan]:
        """Validate a batch and plan its read: (ids, plan).  See planning.plan_request."""
        return planning.plan_request(dataset, ids, paths, self.config)

    def plan_range(self, dataset: DatasetIndex, sample_id: int, offset: int, length: int
                   ) -> tuple[BatchPlan, bool]:
        """Plan a byte range of one sample: (plan, whole).  See planning.plan_range."""
        return planning.plan_range(dataset, sample_id, offset, length, self.config)

    def read_sample(self, dataset: DatasetIndex, sample_id: int) -> Iterator[memoryview]:
        """The bytes of one locally stored sample, in windows, CRC32C-checked when whole.

        Raises FailedPrecondition if another member stores it, DataCorruption.
        """
        size = int(dataset.length[sample_id])
        step = self.config.batch_bytes_max
        for offset in range(0, size, step):
            plan, whole = self.plan_range(dataset, sample_id, offset, step)
            for _, window in self.read(dataset, plan, verify=whole):
                yield window

    def read(self, dataset: DatasetIndex, plan: BatchPlan, *, verify: bool = True,
             deadline: float | None = None) -> Iterator[tuple[int, memoryview]]:
        """Stream the plan's payload windows (see ReadEngine.stream)."""
        if self.config.verify == "always":
            verify = True
        elif self.config.verify == "never":
            verify = False
        return self._engine.stream(dataset.dataset_id, plan, verify=verify,
                                   describe=dataset.describe, deadline=deadline)

    def hint(self, dataset: DatasetIndex, plan: BatchPlan) -> None:
        """Queue WILLNEED advice for a plan's ranges (a prefetch hint); returns at once.

        Raises Overloaded when the prefetch queue is full: the hint is
        dropped (and counted), which only costs speed.
        """
        try:
            self._prefetcher.submit(dataset.dataset_id, plan)
        except Overloaded:
            self.metrics.prefetch_hints.labels("dropped").inc()
            raise
        self.metrics.prefetch_hints.labels("queued").inc()

    def read_into(self, dataset: DatasetIndex, pieces: list, buffer) -> None:
        """Fill `buffer` with file pieces of `dataset` (see ReadEngine.read_into)."""
        self._engine.read_into(dataset.dataset_id, pieces, buffer,
                               describe_extent=lambda extent: dataset.describe_extent(extent))

    @contextlib.contextmanager
    def extent_descriptors(self, dataset: DatasetIndex) -> Iterator[list[tuple[int, int]]]:
        """(extent no, read-only fd) of every extent of `dataset` stored here, held open
        for the block (to pass them to a co-located client).  Headers are checked."""
        local = dataset.extent[dataset.extent != layout.NO_EXTENT]
        with contextlib.ExitStack() as stack:
            yield [(e, stack.enter_context(self._files.acquire(dataset.dataset_id, e)))
                   for e in np.unique(local).tolist()]

    def hint_ids(self, dataset: DatasetIndex, ids) -> None:
        """A prefetch hint for sample ids riding on a read, as GetBatch's prefetch_ids:
        a bad id fails the read (InvalidArgument), a full prefetch queue drops the
        hint, and ids other members store are left to them."""
        ids = dataset.check_ids(np.asarray(ids, dtype=np.int64))
        if dataset.cluster is not None:
            ids = ids[dataset.extent[ids] != layout.NO_EXTENT]
        try:
            self.hint(dataset, planning.plan_batch(ids, dataset.extent, dataset.offset,
                                                   dataset.length, dataset.crc))
        except Overloaded:
            pass

    def count_read(self, method: str, plan: BatchPlan, seconds: float) -> None:
        """Count one read call served (see Metrics.count_read)."""
        self.metrics.count_read(method, plan, seconds)

    def count_served(self, method: str, samples: int, payload_bytes: int,
                     started: float) -> None:
        """Count one data path request served since `started` (time.perf_counter)."""
        self.metrics.count_served(method, samples, payload_bytes,
                                  time.perf_counter() - started)

    def scrub(self, dataset: DatasetIndex) -> Iterator[tuple[int, int, list[tuple[int, str]]]]:
        """Verify every locally stored sample of `dataset` (see scrub.scrub)."""
        return scrub_dataset(self._engine, dataset)

    def status(self) -> DaemonStatus:
        """Stored data, running ingests and served reads, now.  O(datasets)."""
        self.metrics.set_stored(self.directory.all(), self._catalog.size,
                                self._files.open_count())
        with self._mutex:
            running = self._ingests.active_count()
        return self.metrics.status(os.path.abspath(self.config.data_dir), running)
