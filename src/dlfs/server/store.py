"""Store: the daemon's storage core behind one object.

Owns the data dir (locked against a second daemon, datadir_lock.py), the
catalog, the extent files, the sample directory and the read engine.
`Store.open` replays the catalog into the directory (replay.py).  Every
mutation goes through here so catalog, directory and extents stay
consistent: the Store makes every ingest state change (the states live in
ingest_registry.py), publishes and deletes datasets, and frees a dataset's
extents when its last read lease ends (leases.py).  Data flows one way:
service -> store -> directory / read engine -> extent files.

The data dir layout is in `dlfs.formats.disk_layout`.  Nothing here imports grpc.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import ContextManager

from dlfs.formats import disk_layout as layout
from dlfs.errors import FailedPrecondition, NotFound, StaleGeneration, Unavailable
from dlfs.paths import check_dataset_name
from dlfs.server.core import catalog as cat
from dlfs.server.core import catalog_records as records
from dlfs.server.read import sendfiles
from dlfs.server.config import ServerConfig
from dlfs.server.core.directory import DatasetIndex, SampleDirectory, generation_of
from dlfs.server.core.datadir_lock import DataDirLock
from dlfs.server.core.extents import ExtentFiles, ExtentStore, fsync_dir
from dlfs.server.ingest.ingest_registry import IngestRegistry, IngestState
from dlfs.server.core.read_leases import ReadLeases
from dlfs.server.metrics import Metrics, StoredState
from dlfs.server.read.prefetch import Prefetcher
from dlfs.server.read.read_engine import ReadEngine
from dlfs.server.core.catalog_replay import release_free_heap, restore
from dlfs.server.store_ingests import StoreIngests
from dlfs.server.store_reads import StoreReads
from dlfs.server.store_resumes import StoreResumes
from dlfs.server.read.warmup import Warmer, WarmStatus, memory_bytes
from dlfs.types import DaemonStatus, DatasetInfo

log = logging.getLogger(__name__)


class Store(StoreIngests, StoreResumes, StoreReads):
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
                                  metrics=self.metrics, io_uring=config.io_uring)
        self._prefetcher = Prefetcher(self._files, io_uring=config.io_uring)
        self._warmer = Warmer(config.data_dir, int(config.warm_memory_share * memory_bytes()),
                              self._is_current, metrics=self.metrics)
        self._mutex = threading.Lock()
        self._next_dataset_id = next_dataset_id
        self._ingests = IngestRegistry(expire=self._expire,
                                       parked_timeout_s=config.resumable_ingest_timeout_s)
        self._leases = ReadLeases(free=self._free_extents)
        self._closed = False
        self.metrics.read_state_from(self.stored_state)  # gauges read at each scrape
        # (name, generation, first member's address) -> "committed", "aborted" or
        # None (no answer yet): how a member in doubt learns a striped ingest's
        # outcome.  Set by the daemon (decisions.py); None: it waits for a client.
        self.decisions = None
        # Whether data path windows may go out by sendfile (config and kernel).
        self.sendfile_state = sendfiles.state(config.sendfile)
        self.sendfile = self.sendfile_state == "on"
        if config.sendfile and not self.sendfile:
            log.warning("sendfile from the page cache is %s: data path replies are read into "
                        "buffers and sent, which costs the daemon more CPU per byte",
                        self.sendfile_state)

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
            store._recover_prepared(restored.prepared)
            store._recover_parked(restored.parked)
            return store
        except BaseException:
            dir_lock.release()
            raise

    def close(self) -> None:
        """Abort receiving ingests (prepared ones stay prepared on disk, resumable ones
        as their last checkpoint recorded them: the next start parks them), stop
        readers, flush and close the catalog.  Idempotent."""
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
            if session.resumable:
                session.close_writer()
            else:
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
            found = self._ingests.find(name)
        if found is not None and found[1] is IngestState.PARKED:
            raise NotFound(f"dataset {name!r} is an ingest that broke off (parked); it can be "
                           "read once `dlfs ingest --resume` finishes it")
        if found is not None:
            raise NotFound(f"dataset {name!r} is still being ingested; it can be read once "
                           "the ingest finishes")
        return self.directory.get(name)

    def reading(self, name: str, generation: int = 0, *,
                first_read: bool = True) -> ContextManager[DatasetIndex]:
        """The sealed dataset `name`, whose extents stay on disk until the block ends.

        A delete or replace that lands meanwhile unpublishes the dataset at
        once but frees its extents only when the last such block ends, so a
        read that resolved the old dataset finishes with the old bytes
        instead of failing on a vanished extent file (leases.py).  With a
        `generation`, only that version will do: StaleGeneration otherwise.
        `first_read=False` (a request carrying only prefetch hints, as gRPC's
        Prefetch) does not count as the dataset's first read for the warm-up.
        Raises InvalidArgument, NotFound, StaleGeneration, Unavailable
        (shutting down).
        """
        try:
            self.dataset(name)  # raises the NotFound that names a running ingest
        except NotFound:
            if generation and self._ingesting_generation(name) == generation:
                # A striped commit is on its way here: a settle, not a missing dataset.
                raise StaleGeneration(
                    f"dataset {name!r} version {generation} is not committed on this daemon "
                    "yet (its striped commit is in flight); retry in a moment") from None
            raise
        self._check_open()

        def resolve() -> DatasetIndex:
            dataset = self.directory.get(name)
            if generation and dataset.generation != generation:
                raise StaleGeneration(
                    f"dataset {name!r} was replaced: version {generation} is no longer "
                    f"served (the current one is {dataset.generation}); open it again")
            if self.config.warm_on_first_read and first_read:
                self._warmer.first_read(dataset)
            return dataset

        return self._leases.hold(resolve)

    def _ingesting_generation(self, name: str) -> int:
        """The generation an unsealed ingest of `name` would publish, 0 if none runs."""
        with self._mutex:
            found = self._ingests.find(name)
        if found is None:
            return 0
        session = found[0]
        return generation_of(session.cluster, session.dataset_id)

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
                state = self._ingests.state(session)
                result.setdefault(session.name, dataclasses.replace(
                    session.summary(), ingest_state=state.value if state else ""))
        return [result[name] for name in sorted(result)]

    def delete(self, name: str) -> DatasetInfo:
        """Remove a sealed dataset durably, then free its extents (after its last read).

        A parked ingest of `name` is discarded too (its summary is returned
        when there is no sealed dataset).  Raises InvalidArgument, NotFound,
        FailedPrecondition (only an ingest in progress has that name),
        Unavailable (shutting down), StorageFull and CatalogFailed (the
        dataset stays then).
        """
        check_dataset_name(name)
        parked = dataset = None
        with self._mutex:
            self._check_open()
            found = self._ingests.find(name)
            if found is not None and found[1] is IngestState.PARKED:
                parked = found[0]
            elif found is not None and self.directory.find(name) is None:
                raise FailedPrecondition(
                    f"dataset {name!r} is being ingested ({found[1].value}); stop that ingest "
                    "first (it can be removed once it is sealed or has broken off)")
            if parked is None or self.directory.find(name) is not None:
                dataset = self.directory.get(name)
                # Durable first, then gone from listings: a failed append (disk full,
                # a failed catalog) leaves the dataset listed and whole.
                self._catalog.append(records.RecordType.DELETE,
                                     records.encode_delete(dataset.dataset_id), sync=True)
                self.directory.remove(name)
            if parked is not None:
                self._ingests.move(parked, IngestState.ABORTED)
        if parked is not None:
            self._discard(parked, "removed by DeleteDataset")
        if dataset is None:
            return parked.summary()
        self._leases.retire(dataset.dataset_id)
        log.info("deleted dataset %r (%d samples)", name, len(dataset))
        return dataset.summary()

    def status(self) -> DaemonStatus:
        """Stored data, running ingests and served reads, now.  O(datasets)."""
        return self.metrics.status(os.path.abspath(self.config.data_dir), self.sendfile_state)

    def stored_state(self) -> StoredState:
        """What this store holds now (the metrics read it at every scrape).  O(datasets)."""
        datasets = self.directory.all()
        with self._mutex:
            states = [self._ingests.state(s) for s in self._ingests.sessions()]
        ingests: dict[str, int] = {}
        for state in states:
            if state is not None:
                ingests[state.value] = ingests.get(state.value, 0) + 1
        return StoredState(datasets=len(datasets), samples=sum(len(d) for d in datasets),
                           bytes=sum(d.total_bytes for d in datasets),
                           catalog_bytes=self._catalog.size,
                           open_extent_files=self._files.open_count(), ingests=ingests)
