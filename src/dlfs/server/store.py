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
import logging
import os
import threading
import time
from typing import ContextManager, Iterator, Sequence

import numpy as np

from dlfs import layout
from dlfs.errors import (AlreadyExists, DlfsError, NotFound, Overloaded, StaleGeneration,
                         Unavailable)
from dlfs.paths import check_dataset_name
from dlfs.server import catalog as cat
from dlfs.server import faults
from dlfs.server import planning, rangeplan
from dlfs.server.config import ServerConfig
from dlfs.server.directory import Cluster, DatasetIndex, SampleDirectory
from dlfs.server.dirlock import DataDirLock
from dlfs.server.extents import ExtentFiles, ExtentStore, ExtentWriter, fsync_dir
from dlfs.server.ingest import IngestSession, RecoveredIngest
from dlfs.server.ingest_registry import IngestRegistry, IngestState
from dlfs.server.leases import ReadLeases
from dlfs.server.metrics import Metrics
from dlfs.server.prefetch import Prefetcher
from dlfs.server.planning import BatchPlan
from dlfs.server.rangeplan import RangeRead
from dlfs.server.reader import ReadEngine
from dlfs.server.replay import release_free_heap, restore
from dlfs.server.scrub import scrub as scrub_dataset
from dlfs.server.warmup import Warmer, WarmStatus, memory_bytes
from dlfs.types import DaemonStatus, DatasetInfo

log = logging.getLogger(__name__)


class Store:
    """The storage core.  Thread-safe.  Use `Store.open(config)`; `close()` when done.

    `_mutex` guards the ingest registry, the next dataset id, and each
    publish or delete together with its catalog record.  The read leases
    have their own lock; no code holds `_mutex` while taking it.
    """

    def __init__(self, config: ServerConfig, dir_lock: DataDirLock, catalog: cat.Catalog,
                 extents: ExtentStore, directory: SampleDirectory, next_dataset_id: int):
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
        self._warmer = Warmer(config.data_dir, int(config.warm_memory_share * memory_bytes()),
                              self._is_current)
        self._mutex = threading.Lock()
        self._next_dataset_id = next_dataset_id
        self._ingests = IngestRegistry(expire=self._expire)
        self._leases = ReadLeases(free=self._free_extents)
        self._closed = False
        # (name, generation, first member's address) -> "committed", "aborted" or
        # None (no answer yet): how a member in doubt learns a striped ingest's
        # outcome.  Set by the daemon (decisions.py); None: it waits for a client.
        self.decisions = None

    # --- lifecycle -------------------------------------------------------------

    @classmethod
    def open(cls, config: ServerConfig) -> "Store":
        """Lock the data dir, replay the catalog, drop leftovers of interrupted ingests.

        Raises CatalogCorrupt (see catalog.scan) and a RuntimeError naming
        the data dir when another daemon holds it.
        """
        data_dir = config.data_dir
        if not os.path.isdir(data_dir):
            os.makedirs(data_dir, mode=0o700, exist_ok=True)
            fsync_dir(os.path.dirname(os.path.abspath(data_dir)))
        dir_lock = DataDirLock.acquire(data_dir)
        try:
            started = time.monotonic()
            catalog, replayed = cat.Catalog.open(os.path.join(data_dir, layout.CATALOG_FILE),
                                                 salvage=config.salvage_catalog)
            extents = ExtentStore(data_dir)
            restored = restore(catalog, replayed.records, extents,
                               config.catalog_compact_dead_bytes_min)
            del replayed
            release_free_heap()
            datasets = restored.directory.all()
            log.info("catalog replayed: %d datasets, %d samples, %d prepared ingests, %d catalog "
                     "bytes in %.2f s", len(datasets), sum(len(d) for d in datasets),
                     len(restored.prepared), catalog.size, time.monotonic() - started)
            store = cls(config, dir_lock, catalog, extents, restored.directory,
                        restored.next_dataset_id)
            with store._mutex:
                for index, replace in restored.prepared:
                    session = RecoveredIngest(index, replace, catalog, extents)
                    store._ingests.add(session)
                    store._ingests.move(session, IngestState.PREPARED, index,
                                        store._prepared_timeout_s(session))
            return store
        except BaseException:
            dir_lock.release()
            raise

    def close(self) -> None:
        """Abort receiving ingests (prepared ones stay prepared on disk), stop readers,
        flush and close the catalog.  Idempotent."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            # Receiving ingests end here; prepared ones are durable and stay
            # prepared: the next start finds them and waits for their decision.
            sessions = [s for s in self._ingests.sessions()
                        if self._ingests.state(s) is IngestState.RECEIVING]
            for session in sessions:
                self._ingests.move(session, IngestState.ABORTED)
            self._ingests.stop_timers()
        for session in sessions:
            self._discard(session, "the daemon is shutting down")
        self._prefetcher.close()
        self._warmer.close()
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
            ingesting = self._ingests.is_running(name)
        if ingesting:
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
            if self.config.warm_on_first_read:
                self._warmer.first_read(dataset)
            return dataset

        return self._leases.hold(resolve)

    def _is_current(self, name: str, generation: int) -> bool:
        dataset = self.directory.find(name)
        return dataset is not None and dataset.generation == generation and not self._closed

    def warm(self, name: str) -> WarmStatus:
        """Start reading dataset `name` into the page cache in the background (unless a
        warm-up of this version is running); its status now.  See warmup.py.
        Raises NotFound, Overloaded (too many warm-ups waiting)."""
        self._check_open()
        return self._warmer.warm(self.dataset(name))

    def warm_status(self, name: str) -> WarmStatus | None:
        """The latest warm-up of dataset `name`, or None if it never had one."""
        self.dataset(name)
        return self._warmer.status(name)

    def _free_extents(self, dataset_id: int) -> None:
        """Remove a retired dataset's extents (its end is durable in the catalog).  Never
        raises: it runs when a delete, a replace or the last read of a retired dataset
        ends, none of which may fail for it; what stays is removed at the next start."""
        self._files.forget_dataset(dataset_id)
        try:
            self.extents.remove_dataset(dataset_id)
        except OSError as exc:
            log.warning("could not remove the extents of retired dataset id %x (%s); the "
                        "next start removes them", dataset_id, exc)

    def summaries(self) -> list[DatasetInfo]:
        """Sealed datasets and running ingests, sorted by name."""
        result = {d.name: d.summary() for d in self.directory.all()}
        with self._mutex:
            for session in self._ingests.sessions():
                result.setdefault(session.name, session.summary())
        return [result[name] for name in sorted(result)]

    def delete(self, name: str) -> DatasetInfo:
        """Remove a sealed dataset durably, then free its extents (after its last read).

        Raises InvalidArgument, NotFound, Unavailable (shutting down),
        StorageFull and CatalogFailed (the dataset stays then).
        """
        check_dataset_name(name)
        with self._mutex:
            self._check_open()
            dataset = self.directory.get(name)
            # Durable first, then gone from listings: a failed append (disk full,
            # a failed catalog) leaves the dataset listed and whole.
            self._catalog.append(cat.RecordType.DELETE, cat.encode_delete(dataset.dataset_id),
                                 sync=True)
            self.directory.remove(name)
        self._leases.retire(dataset.dataset_id)
        log.info("deleted dataset %r (%d samples)", name, len(dataset))
        return dataset.summary()

    # --- ingest: every state change of ingest_registry happens below --------------

    def begin_ingest(self, name: str, replace: bool = False,
                     cluster: Cluster | None = None) -> IngestSession:
        """Start an ingest of dataset `name` (RECEIVING): a BEGIN record, an extent directory.

        Raises AlreadyExists (name taken without `replace`, or being
        ingested), Overloaded (too many ingests), Unavailable (shutting
        down), InvalidArgument (bad name).
        """
        check_dataset_name(name)
        with self._mutex:
            self._check_open()
            if self._ingests.is_running(name):
                raise AlreadyExists(f"dataset {name!r} is being ingested by another client")
            if not replace and self.directory.find(name) is not None:
                raise AlreadyExists(
                    f"dataset {name!r} exists; pass --replace (replace=True) to replace it, or "
                    "choose another name"
                )
            if len(self._ingests) >= self.config.ingests_concurrent_max:
                raise Overloaded(
                    f"{len(self._ingests)} ingests are running, the limit "
                    f"(--ingests-concurrent-max) is {self.config.ingests_concurrent_max}; retry later"
                )
            dataset_id = self._next_dataset_id
            self._next_dataset_id += 1
            created_ns = time.time_ns()
            writer = ExtentWriter(self.extents, dataset_id, created_ns,
                                  self.config.extent_bytes_max, label=f"dataset {name!r}")
            for record_type, payload in cat.start_records(dataset_id, created_ns, name, cluster):
                self._catalog.append(record_type, payload)
            session = IngestSession(name, dataset_id, created_ns, self._catalog, writer,
                                    replace, cluster)
            self._ingests.add(session)
            return session

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

        The dataset is durable and checked (a PREPARE record: a restart
        keeps it prepared); it waits for `commit_prepared` or
        `abort_prepared`.  Who decides when nobody does (see `_expire`):
        a striped dataset's first member, or a dataset of one daemon, aborts
        it after `config.prepared_ingest_timeout_s`; the other members ask
        the first one for its outcome (`decisions`).  Returns its (unsealed)
        summary.  Raises as `commit_ingest` (but for AlreadyExists, checked
        at commit).
        """
        index = self._finish(session)
        try:
            with self._mutex:
                self._expect(session, IngestState.RECEIVING)  # only a shutdown ends it meanwhile
                # Durable before it answers: a restart finds it prepared, not discarded.
                self._catalog.append(cat.RecordType.PREPARE,
                                     cat.encode_prepare(session.dataset_id, session.replace),
                                     sync=True)
                self._ingests.move(session, IngestState.PREPARED, index,
                                   self._prepared_timeout_s(session))
        except BaseException as exc:
            self.abort_ingest(session, f"prepare failed: {type(exc).__name__}: {exc}")
            raise
        return session.summary()

    def commit_prepared(self, name: str, generation: int = 0) -> DatasetInfo:
        """Seal and publish the prepared ingest of `name` (CommitIngest).

        With a `generation`, only that version is committed, and if it is
        already published the call answers with its summary (a retried
        commit that had succeeded).  Raises NotFound (none prepared),
        InvalidArgument (bad name), and AlreadyExists, StorageFull,
        Unavailable as `commit_ingest`; a failed commit aborts the ingest (see `_seal`).
        """
        check_dataset_name(name)
        with self._mutex:
            self._check_open()
            published = self.directory.find(name)
            if generation and published is not None and published.generation == generation:
                return published.summary()
            session, index = self._ingests.require_prepared(name)
            if generation and index.generation != generation:
                raise NotFound(f"dataset {name!r} is prepared in generation {index.generation}, "
                               f"not {generation}")
        return self._seal(session, IngestState.PREPARED, index)

    def ingest_outcome(self, name: str, generation: int) -> str:
        """What became of `generation` of dataset `name` here: "committed"
        (published now), "pending" (receiving or prepared), or "aborted"
        (anything else: never prepared, aborted, or replaced since); "pending"
        too while the catalog has failed (the restart tells).  The answer a
        striped dataset's first member gives the others."""
        check_dataset_name(name)
        with self._mutex:
            if self._catalog.failed:
                return "pending"  # what the disk holds is known after the restart only
            published = self.directory.find(name)
            if published is not None and published.generation == generation:
                return "committed"
            for session in self._ingests.sessions():
                if session.name == name and _generation(session) == generation:
                    return "pending"
        return "aborted"

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
        """Durably seal and publish `index` if `session` is still `expected` (-> SEALED).

        A failure aborts the ingest, except for a prepared ingest whose first
        member decides (another member of a striped dataset), or when the
        catalog failed: that one stays prepared, as two-phase commit requires
        of a member that voted yes.
        """
        try:
            with self._mutex:
                self._expect(session, expected)
                previous = self.directory.find(session.name)
                if previous is not None and not session.replace:
                    raise AlreadyExists(f"dataset {session.name!r} appeared during the ingest")
                replaces = previous.dataset_id if previous is not None else 0
                faults.point("seal", session.name)
                self._catalog.append(cat.RecordType.SEAL,
                                     cat.encode_seal(session.dataset_id, replaces), sync=True)
                self.directory.publish(index)
                self._ingests.move(session, IngestState.SEALED)
        except BaseException as exc:
            if expected is IngestState.PREPARED and (_decider(session) is not None
                                                     or self._catalog.failed):
                # Not ours to abort: the first member may have committed, or (a
                # failed catalog) our own SEAL may be on disk.  Stay prepared:
                # commit when asked again, or let the restart's replay decide.
                log.warning("commit of dataset %r failed (%s: %s); it stays prepared and is "
                            "committed once %s's decision is applied again", session.name,
                            type(exc).__name__, exc, _decider(session))
                raise
            self.abort_ingest(session, f"commit failed: {type(exc).__name__}: {exc}")
            raise
        if previous is not None:
            self._leases.retire(previous.dataset_id)
        self.metrics.ingested_samples.inc(len(index))
        self.metrics.ingested_bytes.inc(index.total_bytes)
        log.info("sealed dataset %r: %d samples, %d bytes%s", index.name, len(index),
                 index.total_bytes, " (replaced the previous one)" if previous else "")
        return index.summary()

    def _prepared_timeout_s(self, session) -> float:
        """How long a prepared ingest waits before `_expire` looks at it."""
        if _decider(session) is None:
            return self.config.prepared_ingest_timeout_s
        return self.config.in_doubt_poll_s

    def _expire(self, session) -> None:
        """Timer thread: a prepared ingest waited its timeout (see `prepare_ingest`)."""
        with self._mutex:
            if self._ingests.state(session) is not IngestState.PREPARED:
                return  # committed or aborted meanwhile
            decider = _decider(session)
            if decider is None:  # this daemon decides: nobody committed in time
                self._ingests.move(session, IngestState.ABORTED)
        if decider is None:
            self._discard(session, "not committed within "
                                   f"{self.config.prepared_ingest_timeout_s:.0f} s "
                                   "(--prepared-ingest-timeout-s)")
            return
        self._learn_outcome(session, decider)

    def _learn_outcome(self, session, decider: str) -> None:
        """Ask the first member what it decided; follow it, or ask again later."""
        generation = _generation(session)
        outcome = self.decisions(session.name, generation, decider) if self.decisions else None
        try:
            if outcome == "committed":
                log.info("dataset %r generation %d: %s committed it; committing here",
                         session.name, generation, decider)
                self.commit_prepared(session.name, generation)
                return
            if outcome == "aborted":
                with self._mutex:
                    if self._ingests.state(session) is not IngestState.PREPARED:
                        return
                    self._ingests.move(session, IngestState.ABORTED)
                self._discard(session, f"{decider} decided to abort generation {generation}")
                return
        except (DlfsError, OSError) as exc:
            log.warning("could not apply %s's decision on dataset %r: %s", decider,
                        session.name, exc)
        with self._mutex:
            if self._ingests.state(session) is IngestState.PREPARED:
                self._ingests.rearm(session, self.config.in_doubt_poll_s)

    def _discard(self, session: IngestSession, reason: str) -> None:
        """What ABORTED means on disk (after the move, outside `_mutex`)."""
        log.warning("ingest of dataset %r aborted: %s", session.name, reason)
        session.discard()

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
                   ) -> RangeRead:
        """Plan a byte range of one sample, in whole blocks when it can be verified so.
        See rangeplan.plan_range."""
        return rangeplan.plan_range(dataset, sample_id, offset, length, self.config)

    def read_range(self, dataset: DatasetIndex, read: RangeRead, *, verify: bool = True,
                   deadline: float | None = None) -> Iterator[tuple[int, memoryview]]:
        """Stream the asked bytes of a planned range: (offset from its start, bytes).

        Each window is verified (the whole sample, or each block) before it
        is yielded, when `read.checkable` and `verify`.  Raises DataCorruption
        naming the sample (and block), DeadlineExceeded.
        """
        windows = self.read(dataset, read.plan, verify=verify and read.checkable,
                            deadline=deadline, describe=rangeplan.describe(dataset, read),
                            window_bytes=rangeplan.window_bytes(
                                read, self.config.chunk_bytes, dataset.blocks.block_bytes))
        return rangeplan.trim(windows, read.skip, read.length)

    def read_sample(self, dataset: DatasetIndex, sample_id: int) -> Iterator[memoryview]:
        """The bytes of one locally stored sample, in windows, CRC32C-checked (whole, or
        by blocks when it is read in parts).

        Raises FailedPrecondition if another member stores it, DataCorruption.
        """
        size = int(dataset.length[sample_id])
        step = self.config.batch_bytes_max
        for offset in range(0, size, step):
            read = self.plan_range(dataset, sample_id, offset, step)
            for _, window in self.read_range(dataset, read):
                yield window

    def read(self, dataset: DatasetIndex, plan: BatchPlan, *, verify: bool = True,
             deadline: float | None = None, describe=None,
             window_bytes: int | None = None) -> Iterator[tuple[int, memoryview]]:
        """Stream the plan's payload windows (see ReadEngine.stream); `describe(item)`
        names an item in errors (default: items are sample ids)."""
        if self.config.verify == "always":
            verify = True
        elif self.config.verify == "never":
            verify = False
        return self._engine.stream(dataset.dataset_id, plan, verify=verify,
                                   describe=describe or dataset.describe, deadline=deadline,
                                   window_bytes=window_bytes)

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
            running = len(self._ingests)
        return self.metrics.status(os.path.abspath(self.config.data_dir), running)


def _generation(session) -> int:
    """The generation an ingest will publish (as DatasetIndex.generation)."""
    cluster = session.cluster
    return cluster.generation if cluster is not None and cluster.generation else session.dataset_id


def _decider(session) -> str | None:
    """The address of the member whose commit decides a striped ingest, or None
    when this daemon decides (one daemon's dataset, or this is the first member)."""
    cluster = session.cluster
    if cluster is None or cluster.member_index == 0 or not cluster.generation:
        return None
    return cluster.members[0]
