"""Store: the daemon's storage behind one facade that both front doors call.

`Store.open(config)` locks the data dir (datadir_lock.py), replays the
catalog into the sample directory (catalog_replay.py) and builds the parts,
each with explicit arguments taken from the config:

- `store.reads` (server/read/dataset_reads.py): planning, reading, hints,
  descriptors, scrub and read counters of sealed datasets;
- `store.ingests` (server/ingest/ingest_machine.py): every transition of
  an ingest (begin, prepare, commit, abort, break off, resume, expire,
  recover) and the publishing and deleting of datasets, under the one lock
  that keeps catalog, directory and extents consistent;
- `store.spaces` (server/write/space_machine.py): checkpoint spaces, their
  trees and the files being written into them, whose closed versions it
  publishes in the directory beside the datasets;
- `store.batch_limits` (dlfs/batch_limits.py): --batch-ids-max and
  --batch-bytes-max, which the gRPC front door meets through
  `store.reads` and the data path checks directly: one error, one message.

The facade itself resolves dataset names (`dataset`, `reading`, which holds
a read lease so that a delete or replace frees the extents only after the
last read), lists, deletes, warms and reports status.  When other processes
serve reads too (the data path's workers), `attach_mirror` makes every
change of the directory reach them before it is acknowledged, holds a
retired dataset's extents until they released it, and adds their counters
to the daemon's.  Data flows one way:
front door -> store -> directory / read engine -> extent files.  The data
dir layout is in `dlfs.formats.disk_layout`.  Nothing here imports grpc.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import ContextManager

from dlfs.batch_limits import BatchLimits
from dlfs.errors import NotFound, StaleGeneration
from dlfs.formats import disk_layout as layout
from dlfs.paths import FILE_VERSION_SEP, check_dataset_name, check_read_name
from dlfs.server.config import ServerConfig
from dlfs.server.core import catalog as cat
from dlfs.server.core.catalog_replay import release_free_heap, restore
from dlfs.server.core.datadir_lock import DataDirLock
from dlfs.server.core.directory import DatasetIndex
from dlfs.server.core.sealed_datasets import SampleDirectory
from dlfs.server.core.extents import ExtentFiles, ExtentStore, fsync_dir
from dlfs.server.core.read_leases import ReadLeases
from dlfs.server.ingest.ingest_machine import IngestMachine
from dlfs.server.ingest.ingest_registry import IngestState
from dlfs.server.metrics import Metrics, StoredState
from dlfs.server.read.dataset_reads import DatasetReads
from dlfs.server.read.prefetch import Prefetcher
from dlfs.server.read.read_engine import ReadEngine
from dlfs.server.read.warmup import Warmer, WarmStatus, memory_bytes
from dlfs.server.write.space_machine import SpaceMachine
from dlfs.types import DaemonStatus, DatasetInfo

log = logging.getLogger(__name__)


class Store:
    """The storage of one daemon.  Thread-safe.  Use `Store.open(config)`; `close()` when done.

    Locks: `ingests` holds the one lock over ingest states, publishing and
    deleting (see IngestMachine); the read leases have their own, never
    taken under it; the facade adds none.
    """

    def __init__(self, config: ServerConfig, dir_lock: DataDirLock, catalog: cat.Catalog,
                 extents: ExtentStore, directory: SampleDirectory, next_dataset_id: int,
                 spaces: dict | None = None):
        self.config = config
        self.directory = directory
        self.extents = extents
        self.metrics = Metrics()
        self.batch_limits = BatchLimits(config.batch_ids_max, config.batch_bytes_max)
        self._dir_lock = dir_lock
        self._catalog = catalog
        self._files = ExtentFiles(extents, config.open_extents_max)
        engine = ReadEngine(self._files, threads=config.reader_threads,
                            chunk_bytes=config.chunk_bytes,
                            inflight_bytes_max=config.inflight_bytes_max,
                            metrics=self.metrics, io_uring=config.io_uring)
        self.reads = DatasetReads(self._files, engine,
                                  Prefetcher(self._files, io_uring=config.io_uring),
                                  self.metrics, self.batch_limits, verify=config.verify,
                                  coalesce_gap_bytes=config.coalesce_gap_bytes,
                                  sendfile=config.sendfile,
                                  mapped_sends=config.mapped_sends)
        self._warmer = Warmer(config.data_dir, int(config.warm_memory_share * memory_bytes()),
                              self._is_current, metrics=self.metrics)
        self._leases = ReadLeases(free=self._free_extents)
        self._mirror = None  # the data path's worker supervisor, once attached
        self.ingests = IngestMachine(
            catalog, extents, directory, self._leases, self.metrics,
            next_dataset_id=next_dataset_id, extent_bytes_max=config.extent_bytes_max,
            ingests_concurrent_max=config.ingests_concurrent_max,
            resumable_ingest_timeout_s=config.resumable_ingest_timeout_s,
            checkpoint_bytes=config.ingest_checkpoint_bytes,
            checkpoint_interval_s=config.ingest_checkpoint_interval_s)
        self.spaces = SpaceMachine(catalog, extents, directory, self._leases, self.ingests,
                                   spaces or {}, files_max=config.space_files_max,
                                   drafts_max=config.space_drafts_max)
        self.metrics.read_state_from(self.stored_state)  # gauges read at each scrape

    # --- lifecycle -------------------------------------------------------------

    @classmethod
    def open(cls, config: ServerConfig) -> "Store":
        """Lock the data dir, replay the catalog, drop leftovers of interrupted ingests,
        and register the prepared and parked ones again.

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
            datasets = restored.directory.datasets()
            log.info("catalog replayed: %d datasets, %d samples, %d prepared ingests, %d "
                     "checkpoint spaces, %d catalog bytes in %.2f s", len(datasets),
                     sum(len(d) for d in datasets), len(restored.prepared),
                     len(restored.spaces), catalog.size, time.monotonic() - started)
            store = cls(config, dir_lock, catalog, extents, restored.directory,
                        restored.next_dataset_id, restored.spaces)
            store.ingests.recover(restored.prepared, restored.parked)
            return store
        except BaseException:
            dir_lock.release()
            raise

    def close(self) -> None:
        """End the ingests (see IngestMachine.close), stop readers and warm-ups, flush
        and close the catalog, release the data dir.  Idempotent."""
        if not self.ingests.close():
            return
        self.reads.close()
        self._warmer.close()
        self._files.close()
        self._catalog.close()
        self._dir_lock.release()

    # --- datasets ----------------------------------------------------------------

    def dataset(self, name: str) -> DatasetIndex:
        """The sealed dataset `name`, or the file version "SPACE@VERSION" of a checkpoint
        space.  O(1).  Raises InvalidArgument, NotFound."""
        check_read_name(name)
        found = self.directory.find(name)
        if found is not None:
            return found
        if self.spaces.has(name):
            raise NotFound(f"{name!r} is a checkpoint space: read its files by path "
                           "(`dlfs ls`, `Client.space`), not as a dataset")
        ingest = self.ingests.find(name)
        if ingest is not None and ingest[1] is IngestState.PARKED:
            raise NotFound(f"dataset {name!r} is an ingest that broke off (parked); it can be "
                           "read once `dlfs ingest --resume` finishes it")
        if ingest is not None:
            raise NotFound(f"dataset {name!r} is still being ingested; it can be read once "
                           "the ingest finishes")
        return self.directory.get(name)

    def reading(self, name: str, generation: int = 0, *,
                first_read: bool = True) -> ContextManager[DatasetIndex]:
        """The sealed dataset `name`, whose extents stay on disk until the block ends.

        A delete or replace that lands meanwhile unpublishes the dataset at
        once but frees its extents only when the last such block ends, so a
        read that resolved the old dataset finishes with the old bytes
        instead of failing on a vanished extent file (read_leases.py).  With a
        `generation`, only that version will do: StaleGeneration otherwise.
        `first_read=False` (a request carrying only prefetch hints, as gRPC's
        Prefetch) does not count as the dataset's first read for the warm-up.
        Raises InvalidArgument, NotFound, StaleGeneration, Unavailable
        (shutting down).
        """
        self._check_named(name, generation)

        def resolve() -> DatasetIndex:
            dataset = self.directory.get(name)
            dataset.check_generation(generation)
            # A file version of a space is read once, by a restore: no warm-up of it.
            if self.config.warm_on_first_read and first_read and FILE_VERSION_SEP not in name:
                self._warmer.first_read(dataset)
            return dataset

        return self._leases.hold(resolve)

    def _check_named(self, name: str, generation: int) -> None:
        """Raise what a read of `name` (version `generation`, 0: any) meets before its
        lease: InvalidArgument, NotFound (naming a running ingest), StaleGeneration
        (a striped commit in flight), Unavailable (shutting down)."""
        try:
            self.dataset(name)  # raises the NotFound that names a running ingest
        except NotFound:
            if generation and self.ingests.ingesting_generation(name) == generation:
                # etcd's commit is on its way here (the member applies it from its
                # watch): a moment to wait, not a missing dataset.
                raise StaleGeneration(
                    f"dataset {name!r} version {generation} is not committed on this daemon "
                    "yet (its striped commit is in flight); retry in a moment") from None
            raise
        self.ingests.check_open()

    def check_readable(self, name: str, generation: int = 0) -> None:
        """Raise what `reading(name, generation)` would raise now, without reading (what
        a data path worker that lacks `name` asks, to answer as this process would)."""
        self._check_named(name, generation)
        self.directory.get(name).check_generation(generation)

    def first_read_elsewhere(self, name: str, generation: int) -> None:
        """Another process (a data path worker) read version `generation` of `name` for
        the first time: start its warm-up as a first read here would."""
        dataset = self.directory.find(name)
        if (self.config.warm_on_first_read and dataset is not None
                and dataset.generation == generation and not self.ingests.closed):
            self._warmer.first_read(dataset)

    def attach_mirror(self, mirror) -> None:
        """Let other processes serve reads too.  `mirror` (the data path's worker
        supervisor, see datapath/workers.py) sees every dataset and every change of
        the directory before it is acknowledged (SampleDirectory.attach); a retired
        dataset's extents are removed only when `mirror.free_when_released` says no
        other process reads it; its `metric_samples` are added to this daemon's
        counters and its `worker_statuses` shown in `status`."""
        self._mirror = mirror
        self.directory.attach(mirror)
        self.metrics.add_source(mirror.metric_samples)

    def summaries(self) -> list[DatasetInfo]:
        """Sealed datasets and unsealed ingests (with their states), sorted by name."""
        result = {d.name: d.summary() for d in self.directory.datasets()}
        for summary in self.ingests.summaries():
            result.setdefault(summary.name, summary)
        for summary in self.spaces.summaries():
            result.setdefault(summary.name, summary)
        return [result[name] for name in sorted(result)]

    def delete(self, name: str) -> DatasetInfo:
        """Remove the sealed dataset `name` (DeleteDataset), nothing else: see
        IngestMachine.delete, which owns the lock a delete shares with publishing; or the
        checkpoint space `name` with its files (SpaceMachine.delete)."""
        if self.spaces.has(name):
            return self.spaces.delete(name)
        return self.ingests.delete(name)

    def discard_ingest(self, name: str) -> DatasetInfo:
        """End the parked ingest of `name` (DiscardIngest), nothing else: see
        IngestMachine.discard_parked."""
        return self.ingests.discard_parked(name)

    def warm(self, name: str) -> WarmStatus:
        """Start reading dataset `name` into the page cache in the background (unless a
        warm-up of this version is running); its status now.  See warmup.py.
        Raises NotFound, Overloaded (too many warm-ups waiting)."""
        self.ingests.check_open()
        return self._warmer.warm(self.dataset(name))

    def warm_status(self, name: str) -> WarmStatus | None:
        """The latest warm-up of dataset `name`, with what of it is in the page cache
        now, or None if it never had one."""
        return self._warmer.status(self.dataset(name))

    def status(self) -> DaemonStatus:
        """Stored data, running ingests and served reads, now.  O(datasets)."""
        status = self.metrics.status(os.path.abspath(self.config.data_dir),
                                     self.reads.sendfile_state, self.reads.mapped_sends_state)
        if self._mirror is not None:
            status = dataclasses.replace(status, data_workers=self._mirror.worker_statuses())
        disk = os.statvfs(self.config.data_dir)
        files, space_bytes = self.spaces.stored()
        return dataclasses.replace(status, disk_bytes=disk.f_blocks * disk.f_frsize,
                                   disk_free_bytes=disk.f_bavail * disk.f_frsize,
                                   space_files=files, space_bytes=space_bytes,
                                   space_files_max=self.config.space_files_max)

    def stored_state(self) -> StoredState:
        """What this store holds now (the metrics read it at every scrape).
        O(datasets + ingests)."""
        datasets = self.directory.datasets()
        ingests: dict[str, int] = {}
        for summary in self.ingests.summaries():
            ingests[summary.ingest_state] = ingests.get(summary.ingest_state, 0) + 1
        return StoredState(datasets=len(datasets), samples=sum(len(d) for d in datasets),
                           bytes=sum(d.total_bytes for d in datasets),
                           catalog_bytes=self._catalog.size,
                           open_extent_files=self._files.open_count(), ingests=ingests)

    def check_invariants(self) -> None:
        """Assert the ingests and the directory agree.  O(datasets + ingests); for tests."""
        self.ingests.check_invariants()

    # --- callbacks of the parts ----------------------------------------------------------

    def _is_current(self, name: str, generation: int) -> bool:
        """Whether `generation` of `name` is still the one served (the warmer asks)."""
        dataset = self.directory.find(name)
        return (dataset is not None and dataset.generation == generation
                and not self.ingests.closed)

    def _free_extents(self, dataset_id: int) -> None:
        """Remove a retired dataset's extents once no process reads it (see
        `attach_mirror`).  Never raises."""
        if self._mirror is not None:
            self._mirror.free_when_released(dataset_id,
                                            lambda: self._remove_extents(dataset_id))
        else:
            self._remove_extents(dataset_id)

    def _remove_extents(self, dataset_id: int) -> None:
        """Remove a retired dataset's extents (its end is durable in the catalog).  Never
        raises: it runs when a delete, a replace or the last read of a retired dataset
        ends, none of which may fail for it; what stays is removed at the next start."""
        self.reads.forget_dataset(dataset_id)
        try:
            self.extents.remove_dataset(dataset_id)
        except OSError as exc:
            log.warning("could not remove the extents of retired dataset id %x (%s); the "
                        "next start removes them", dataset_id, exc)
