"""Store: the daemon's storage core behind one object.

Owns the data dir (locked against a second daemon), the catalog, the
extent files, the sample directory and the read engine.  `Store.open`
replays the catalog into the directory; every mutation goes through here so
catalog, directory and extents stay consistent.  Data flows one way:
service -> store -> directory / read engine -> extent files.

Data dir layout::

    DATA_DIR/LOCK          flock'ed while a daemon runs
    DATA_DIR/catalog.log   see catalog.py
    DATA_DIR/extents/...   see extents.py

Nothing here imports grpc.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import logging
import os
import threading
import time
from typing import Iterator, Sequence

import numpy as np

from dlfs import limits
from dlfs.errors import AlreadyExists, DataCorruption, InvalidArgument, NotFound, Overloaded
from dlfs.paths import check_dataset_name
from dlfs.server import catalog as cat
from dlfs.server.config import ServerConfig
from dlfs.server.directory import Cluster, DatasetIndex, SampleDirectory
from dlfs.types import DatasetInfo
from dlfs.server.extents import NO_EXTENT, ExtentFiles, ExtentStore
from dlfs.server.ingest import IngestSession
from dlfs.server.metrics import Metrics
from dlfs.server.prefetch import Prefetcher
from dlfs.server.reader import BatchPlan, ReadEngine, plan_batch

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Replayed:
    name: str
    created_ns: int
    blocks: list
    sealed: bool = False
    record_bytes: int = 0  # SAMPLES and HOLDERS payload bytes in the catalog
    cluster: Cluster | None = None


class Store:
    """The storage core.  Thread-safe.  Use `Store.open(config)`; `close()` when done."""

    def __init__(self, config: ServerConfig, lock_fd: int, catalog: cat.Catalog,
                 extents: ExtentStore, directory: SampleDirectory, next_dataset_id: int,
                 token: str):
        self.config = config
        # Random per start, also in DATA_DIR/daemon-token: a client that reads the
        # same token there sees this daemon's files and may read extents directly.
        self.token = token
        self._lock_fd = lock_fd
        self.catalog = catalog
        self.extents = extents
        self.directory = directory
        self.files = ExtentFiles(extents, config.open_extents_max)
        self.metrics = Metrics()
        self.engine = ReadEngine(self.files, threads=config.reader_threads,
                                 chunk_bytes=config.chunk_bytes,
                                 inflight_bytes_max=config.inflight_bytes_max, metrics=self.metrics)
        self.prefetcher = Prefetcher(self.files)
        self._mutex = threading.Lock()
        self._next_dataset_id = next_dataset_id
        self._ingests: dict[str, IngestSession] = {}
        self._prepared: dict[str, tuple[IngestSession, threading.Timer]] = {}
        self._closed = False
        # Read leases: reads in flight per dataset id, and unpublished datasets
        # whose extents wait for their last read (see `reading`).
        self._reads: dict[int, int] = {}
        self._retired: set[int] = set()

    # --- lifecycle -------------------------------------------------------------

    @classmethod
    def open(cls, config: ServerConfig) -> "Store":
        """Lock the data dir, replay the catalog, drop leftovers of interrupted ingests.

        Raises CatalogCorrupt (see catalog.scan) and a RuntimeError naming
        the data dir when another daemon holds it.
        """
        data_dir = config.data_dir
        os.makedirs(data_dir, mode=0o700, exist_ok=True)
        lock_fd = _lock_data_dir(data_dir)
        try:
            started = time.monotonic()
            catalog, replay = cat.Catalog.open(os.path.join(data_dir, "catalog.log"),
                                               salvage=config.salvage_catalog)
            extents = ExtentStore(os.path.join(data_dir, "extents"))
            replayed, max_id = _replay(replay.records)
            directory = SampleDirectory()
            for dataset_id, entry in replayed.items():
                if not entry.sealed:
                    samples = sum(len(b) for b in entry.blocks)
                    log.warning("discarding incomplete ingest of dataset %r (%d samples arrived "
                                "before the daemon stopped); ingest it again", entry.name, samples)
                    catalog.append(cat.RecordType.DELETE, cat.encode_delete(dataset_id))
                    extents.remove_dataset(dataset_id)
                    continue
                index = DatasetIndex(entry.name, dataset_id, entry.created_ns,
                                     cat.SampleBlock.concat(entry.blocks), entry.cluster)
                replaced = directory.publish(index)
                if replaced is not None:  # cannot happen with a well-formed log
                    log.error("catalog holds two sealed datasets named %r; keeping the later",
                              entry.name)
            live = {d.dataset_id for d in directory.all()}
            for dataset_id in extents.dataset_ids_on_disk():
                if dataset_id not in live:
                    log.warning("removing orphaned extents of dataset id %x", dataset_id)
                    extents.remove_dataset(dataset_id)
                max_id = max(max_id, dataset_id)
            catalog.sync()
            _compact_if_mostly_dead(catalog, replayed, max_id, live)
            del replayed, replay
            _release_free_heap()
            token = _write_token(data_dir)
            log.info("catalog replayed: %d datasets, %d samples, %d catalog bytes in %.2f s",
                     len(live), sum(len(d) for d in directory.all()), catalog.size,
                     time.monotonic() - started)
            return cls(config, lock_fd, catalog, extents, directory, max_id + 1, token)
        except BaseException:
            os.close(lock_fd)
            raise

    def close(self) -> None:
        """Abort running ingests, stop readers, flush and close the catalog."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            sessions = list(self._ingests.values())
        for _session, timer in list(self._prepared.values()):
            timer.cancel()
        for session in sessions:
            session.abort("the daemon is shutting down")
        self.prefetcher.close()
        self.engine.close()
        self.files.close()
        self.catalog.close()
        os.close(self._lock_fd)

    # --- datasets ----------------------------------------------------------------

    def dataset(self, name: str) -> DatasetIndex:
        """The sealed dataset `name`.  Raises InvalidArgument, NotFound."""
        check_dataset_name(name)
        found = self.directory.find(name)
        if found is None:
            if name in self._ingests:
                raise NotFound(f"dataset {name!r} is still being ingested; it can be read once "
                               "the ingest finishes")
            return self.directory.get(name)
        return found

    @contextlib.contextmanager
    def reading(self, name: str) -> Iterator[DatasetIndex]:
        """The sealed dataset `name`, whose extents stay on disk until the block ends.

        A delete or replace that lands meanwhile unpublishes the dataset at
        once but frees its extents only when the last such block ends, so a
        read that resolved the old dataset finishes with the old bytes
        instead of failing on a vanished extent file.  Raises
        InvalidArgument, NotFound.
        """
        with self._mutex:
            dataset = self.dataset(name)
            self._reads[dataset.dataset_id] = self._reads.get(dataset.dataset_id, 0) + 1
        try:
            yield dataset
        finally:
            self._end_read(dataset.dataset_id)

    def _end_read(self, dataset_id: int) -> None:
        with self._mutex:
            left = self._reads.pop(dataset_id) - 1
            if left:
                self._reads[dataset_id] = left
                return
            if dataset_id not in self._retired:
                return
            self._retired.discard(dataset_id)
        self._free_extents(dataset_id)

    def _retire(self, dataset_id: int) -> None:
        """Free an unpublished dataset's extents now, or when its last read ends."""
        with self._mutex:
            if self._reads.get(dataset_id):
                self._retired.add(dataset_id)
                return
        self._free_extents(dataset_id)

    def _free_extents(self, dataset_id: int) -> None:
        self.files.forget_dataset(dataset_id)
        self.extents.remove_dataset(dataset_id)

    def summaries(self) -> list[DatasetInfo]:
        """Sealed datasets and running ingests, sorted by name."""
        result = {d.name: d.summary() for d in self.directory.all()}
        with self._mutex:
            for name, session in self._ingests.items():
                if name not in result:
                    result[name] = DatasetInfo(name, session.samples, session.bytes, False,
                                                  session.created_ns, 0)
        return [result[name] for name in sorted(result)]

    def delete(self, name: str) -> DatasetInfo:
        """Remove a sealed dataset durably, then free its extents."""
        check_dataset_name(name)
        with self._mutex:
            dataset = self.directory.remove(name)
            self.catalog.append(cat.RecordType.DELETE, cat.encode_delete(dataset.dataset_id),
                                sync=True)
        self._retire(dataset.dataset_id)
        log.info("deleted dataset %r (%d samples)", name, len(dataset))
        return dataset.summary()

    # --- ingest ------------------------------------------------------------------

    def begin_ingest(self, name: str, replace: bool = False,
                     cluster: Cluster | None = None) -> IngestSession:
        """Start an ingest of dataset `name`.

        Raises AlreadyExists (name taken without `replace`, or being
        ingested), Overloaded (too many ingests), InvalidArgument (bad name).
        """
        check_dataset_name(name)
        with self._mutex:
            if self._closed:
                raise Overloaded("the daemon is shutting down")
            if name in self._ingests:
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
            session = IngestSession(self, name, dataset_id, replace, cluster)
            self._ingests[name] = session
            return session

    def hold_prepared(self, session: IngestSession) -> None:
        """Keep a prepared session until CommitIngest/AbortIngest, at most
        prepared_ingest_timeout_s; then it is discarded."""
        def expire() -> None:
            if self._prepared.pop(session.name, (None,))[0] is session:
                session.abort(f"not committed within {limits.prepared_ingest_timeout_s:.0f} s")

        timer = threading.Timer(limits.prepared_ingest_timeout_s, expire)
        timer.daemon = True
        with self._mutex:
            self._prepared[session.name] = (session, timer)
        timer.start()

    def finish_prepared(self, name: str, commit: bool) -> DatasetInfo:
        """Commit (publish) or abort the prepared ingest of `name`.  Raises NotFound."""
        check_dataset_name(name)
        with self._mutex:
            session, timer = self._prepared.pop(name, (None, None))
        if session is None:
            raise NotFound(f"no prepared ingest of dataset {name!r} (never prepared, already "
                           "finished, or discarded after prepared_ingest_timeout_s)")
        timer.cancel()
        if commit:
            try:
                return session.commit()
            except BaseException as exc:
                session.abort(f"commit failed: {exc}")
                raise
        session.abort("aborted by the client")
        return DatasetInfo(name, session.samples, session.bytes, False, session.created_ns, 0)

    def seal(self, session: IngestSession, index: DatasetIndex) -> DatasetInfo:
        """Called by `IngestSession.commit`: durably seal and publish."""
        with self._mutex:
            previous = self.directory.find(session.name)
            if previous is not None and not session.replace:
                raise AlreadyExists(f"dataset {session.name!r} appeared during the ingest")
            replaces = previous.dataset_id if previous is not None else 0
            self.catalog.append(cat.RecordType.SEAL, cat.encode_seal(session.dataset_id, replaces),
                                sync=True)
            self.directory.publish(index)
            del self._ingests[session.name]
        if previous is not None:
            self._retire(previous.dataset_id)
        self.metrics.ingested_samples.inc(len(index))
        self.metrics.ingested_bytes.inc(index.total_bytes)
        log.info("sealed dataset %r: %d samples, %d bytes%s", index.name, len(index),
                 index.total_bytes, " (replaced the previous one)" if previous else "")
        return index.summary()

    def discard(self, session: IngestSession) -> None:
        """Called by `IngestSession.abort`: forget the session and its data."""
        with self._mutex:
            if self._ingests.get(session.name) is session:
                del self._ingests[session.name]
        try:
            self.catalog.append(cat.RecordType.DELETE, cat.encode_delete(session.dataset_id))
        except Exception:  # noqa: BLE001 - the extents go anyway; replay discards unsealed data
            log.exception("could not record the abort of dataset %r", session.name)
        self.extents.remove_dataset(session.dataset_id)

    # --- reads -------------------------------------------------------------------

    def plan(self, dataset: DatasetIndex, ids: Sequence[int] | None = None,
             paths: Sequence[str] | None = None) -> tuple[np.ndarray, BatchPlan]:
        """Validate a batch and plan its read.  Returns (ids, plan).

        Raises InvalidArgument (bad id, both or neither of ids/paths, over
        batch_ids_max or batch_bytes_max) and NotFound (unknown path).
        """
        id_count = 0 if ids is None else len(ids)
        path_count = 0 if paths is None else len(paths)
        if id_count and path_count:
            raise InvalidArgument("give either sample ids or paths, not both")
        count = id_count + path_count
        if count > self.config.batch_ids_max:
            raise InvalidArgument(
                f"batch of {count} samples exceeds the limit of {self.config.batch_ids_max} "
                "(--batch-ids-max); split it into smaller batches"
            )
        checked = dataset.ids_of(paths) if path_count else dataset.check_ids(ids if id_count else [])
        dataset.check_local(checked)
        plan = plan_batch(checked, dataset.extent, dataset.offset, dataset.length, dataset.crc,
                          coalesce_gap_bytes=self.config.coalesce_gap_bytes)
        if plan.payload_bytes > self.config.batch_bytes_max:
            raise InvalidArgument(
                f"batch of {count} samples holds {plan.payload_bytes} bytes, over the limit of "
                f"{self.config.batch_bytes_max} (--batch-bytes-max); split it into smaller batches"
            )
        return checked, plan

    def plan_range(self, dataset: DatasetIndex, sample_id: int, offset: int, length: int
                   ) -> tuple[BatchPlan, bool]:
        """Plan the read of `length` bytes (0: to the end) at `offset` of one sample.

        The range is clipped to the sample.  Returns (plan, whole) where
        `whole` says the range covers the entire sample (only then can its
        CRC32C be verified).  Raises InvalidArgument past batch_bytes_max.
        """
        dataset.check_local(dataset.check_ids([sample_id]))
        size = int(dataset.length[sample_id])
        start = min(offset, size)
        stop = size if length == 0 else min(size, start + length)
        if stop - start > self.config.batch_bytes_max:
            raise InvalidArgument(
                f"a range of {stop - start} bytes is over the limit of "
                f"{self.config.batch_bytes_max} (--batch-bytes-max); read it in parts")
        one = slice(sample_id, sample_id + 1)
        plan = plan_batch(np.zeros(1, np.int64), dataset.extent[one], dataset.offset[one] + start,
                          np.array([stop - start], np.uint64), dataset.crc[one])
        plan.sample_ids = np.array([sample_id], np.int64)
        return plan, (start == 0 and stop == size)

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

    def refresh_gauges(self) -> None:
        """Bring the stored-data gauges up to date (cheap: O(datasets))."""
        datasets = self.directory.all()
        m = self.metrics
        m.datasets.set(len(datasets))
        m.samples_stored.set(sum(len(d) for d in datasets))
        m.bytes_stored.set(sum(d.total_bytes for d in datasets))
        m.catalog_bytes.set(self.catalog.size)
        m.open_extents.set(self.files.open_count())

    def running_ingests(self) -> int:
        with self._mutex:
            return len(self._ingests)

    def read(self, dataset: DatasetIndex, plan: BatchPlan, *, verify: bool = True,
             deadline: float | None = None) -> Iterator[tuple[int, memoryview]]:
        """Stream the plan's payload windows (see ReadEngine.stream)."""
        if self.config.verify == "always":
            verify = True
        elif self.config.verify == "never":
            verify = False

        def describe(sample_id: int) -> str:
            return f"sample {sample_id} {dataset.path(sample_id)!r} of dataset {dataset.name!r}"

        return self.engine.stream(dataset.dataset_id, plan, verify=verify, describe=describe,
                                  deadline=deadline)


def scrub(store: "Store", dataset: DatasetIndex, chunk_samples: int = 4096
          ) -> Iterator[tuple[int, int, list[tuple[int, str]]]]:
    """Verify every sample's CRC32C; yield (samples checked, bytes checked, newly bad).

    Reads the dataset in storage order, `chunk_samples` at a time, through
    the same read engine as batches.  A damaged sample is reported and the
    scrub goes on; a truncated extent reports the samples of its chunk.
    """
    local = np.flatnonzero(dataset.extent != NO_EXTENT)  # striped: other members check theirs
    order = local[np.lexsort((dataset.offset[local], dataset.extent[local]))]
    checked = checked_bytes = 0

    def describe(sample_id: int) -> str:
        return f"sample {sample_id} {dataset.path(sample_id)!r} of dataset {dataset.name!r}"

    for start in range(0, len(dataset), chunk_samples):
        ids = order[start:start + chunk_samples]
        plan = plan_batch(ids, dataset.extent, dataset.offset, dataset.length, dataset.crc)
        bad: list[tuple[int, str]] = []
        try:
            for _offset, _window in store.engine.stream(dataset.dataset_id, plan, verify=True,
                                                          describe=describe, bad=bad):
                pass
        except DataCorruption as exc:  # truncated or missing extent: the whole chunk is suspect
            bad.extend((int(i), str(exc)) for i in ids)
        checked += ids.size
        checked_bytes += int(dataset.length[ids].sum())
        yield checked, checked_bytes, bad


def _replay(records) -> tuple[dict[int, _Replayed], int]:
    """Fold catalog records into datasets by id; return them and the largest id seen."""
    datasets: dict[int, _Replayed] = {}
    max_id = 0
    for rtype, payload in records:
        if rtype is cat.RecordType.BEGIN:
            dataset_id, created_ns, name = cat.decode_begin(payload)
            datasets[dataset_id] = _Replayed(name, created_ns, [])
            max_id = max(max_id, dataset_id)
        elif rtype is cat.RecordType.SAMPLES:
            dataset_id, block = cat.decode_samples(payload)
            if dataset_id in datasets:
                datasets[dataset_id].blocks.append(block)
                datasets[dataset_id].record_bytes += len(payload)
        elif rtype is cat.RecordType.CLUSTER:
            dataset_id, replicas, member_index, members = cat.decode_cluster(payload)
            if dataset_id in datasets:
                datasets[dataset_id].cluster = Cluster(tuple(members), replicas, member_index)
        elif rtype is cat.RecordType.HOLDERS:
            dataset_id, holders = cat.decode_holders(payload)
            entry = datasets.get(dataset_id)
            if entry is not None and entry.blocks and len(entry.blocks[-1]) == len(holders):
                entry.blocks[-1].holders = holders
                entry.record_bytes += len(payload)
        elif rtype is cat.RecordType.SEAL:
            dataset_id, replaces = cat.decode_seal(payload)
            if dataset_id in datasets:
                datasets[dataset_id].sealed = True
            datasets.pop(replaces, None)
        elif rtype is cat.RecordType.DELETE:
            datasets.pop(cat.decode_delete(payload), None)
    return datasets, max_id


def _compact_if_mostly_dead(catalog: cat.Catalog, replayed: dict[int, _Replayed], max_id: int,
                            live: set[int]) -> None:
    """Rewrite the catalog with only the live datasets when deleted, replaced and
    aborted ones make up most of it (keeps restart time proportional to what
    is stored).  The largest dataset id survives as an empty BEGIN+DELETE
    pair, so ids are never reused."""
    live_bytes = sum(replayed[i].record_bytes for i in live)
    dead_bytes = catalog.size - live_bytes
    if dead_bytes <= max(live_bytes, limits.catalog_compact_dead_bytes_min):
        return
    records = [(cat.RecordType.BEGIN, cat.encode_begin(max_id, 0, "")),
               (cat.RecordType.DELETE, cat.encode_delete(max_id))]
    for dataset_id in sorted(live):
        entry = replayed[dataset_id]
        records.append((cat.RecordType.BEGIN,
                        cat.encode_begin(dataset_id, entry.created_ns, entry.name)))
        if entry.cluster is not None:
            c = entry.cluster
            records.append((cat.RecordType.CLUSTER, cat.encode_cluster(
                dataset_id, c.replicas, c.member_index, list(c.members))))
        for block in entry.blocks:
            records.append((cat.RecordType.SAMPLES, cat.encode_samples(dataset_id, block)))
            if block.holders is not None:
                records.append((cat.RecordType.HOLDERS, cat.encode_holders(dataset_id,
                                                                           block.holders)))
        records.append((cat.RecordType.SEAL, cat.encode_seal(dataset_id)))
    before = catalog.size
    catalog.rewrite(records)
    log.info("compacted the catalog from %d to %d bytes", before, catalog.size)


def _release_free_heap() -> None:
    """Give the replay's freed temporaries back to the OS (glibc `malloc_trim`).

    Replay briefly needs about twice the directory's final size; without
    this the peak stays resident.  A no-op where the C library lacks it.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


TOKEN_FILE = "daemon-token"


def _write_token(data_dir: str) -> str:
    """A fresh random token in DATA_DIR/daemon-token; see `Store.token`."""
    token = os.urandom(16).hex()
    path = os.path.join(data_dir, TOKEN_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(token)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return token


def _lock_data_dir(data_dir: str) -> int:
    fd = os.open(os.path.join(data_dir, "LOCK"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RuntimeError(
            f"data dir {data_dir} is in use by another dlfs-server (pid {holder}); stop it or "
            "choose another --data-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
