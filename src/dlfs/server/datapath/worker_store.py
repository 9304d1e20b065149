"""What a data path worker process serves from: the daemon's datasets, read-only.

A worker (worker_main.py) answers the data path's read requests with the
same replies as the main process (`replies`, `conn_handler`), which ask a
store for `reading`, `dataset`, `reads`, `batch_limits`, `metrics` and
`config`.  `WorkerStore` is that store in a worker: its directory holds the
datasets the main process published to it, each a `SampleArrays` mapped
from the main process's shared index (core/shared_index.py); its reads go
through its own read engine over extent files it opens read-only itself.
It never writes the data dir and knows nothing of ingests.

Leases work as in the Store (core/read_leases.py), per process: a dataset
the main process replaced or removed is retired here, and when the last
read of it in this process ends its extent descriptors are closed and the
main process is told (`MainProcess.released`), which frees the extents
once no process reads them.  `WorkerSettings` is the part of the daemon's
configuration a worker needs, as the main process sends it.
Nothing here imports grpc.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import ContextManager, Protocol

from dlfs.errors import DlfsError, NotFound, Unavailable
from dlfs.paths import FILE_VERSION_SEP, check_read_name
from dlfs.server.core.extents import ExtentFiles, ExtentStore
from dlfs.server.core.read_leases import ReadLeases
from dlfs.server.core.sample_arrays import SampleArrays
from dlfs.server.core.sealed_datasets import SampleDirectory
from dlfs.server.metrics import Metrics
from dlfs.batch_limits import BatchLimits
from dlfs.server.read.dataset_reads import DatasetReads
from dlfs.server.read.prefetch import Prefetcher
from dlfs.server.read.read_engine import ReadEngine

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    """A worker's share of the daemon's settings (ServerConfig's fields of the same
    names; the bounds marked "share" are the daemon's divided among its workers)."""

    data_dir: str
    chunk_bytes: int
    batch_ids_max: int
    batch_bytes_max: int
    reader_threads: int  # share
    inflight_bytes_max: int  # share
    open_extents_max: int
    coalesce_gap_bytes: int
    verify: str
    io_uring: bool
    sendfile: bool
    mapped_sends: bool
    warm_on_first_read: bool
    connections_max: int  # share
    connections_per_peer_max: int  # share (0: its peer_share of connections_max)
    handshakes_max: int  # share of limits.datapath_handshakes_max
    handshakes_per_peer_max: int  # share of limits.datapath_handshakes_per_peer_max
    processes: int  # the workers that share the daemon's limits
    daemon_connections_max: int  # the daemon's limits, as refusals name them
    daemon_per_peer_max: int
    buffer_bytes_max: int  # share
    idle_timeout_s: float
    stall_timeout_s: float
    instance: str  # the daemon's instance id, hex
    tokens: dict | None  # token -> role, None without a tokens file
    log_level: str
    log_format: str

    def to_message(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_message(cls, message: dict) -> "WorkerSettings":
        return cls(**message)


class MainProcess(Protocol):
    """What a worker's store asks of the daemon's main process (over the control channel)."""

    def explain_missing(self, name: str, generation: int) -> DlfsError | None:
        """Why dataset `name` (version `generation`, 0: any) cannot be read, as the main
        process says it; None when it can now."""

    def first_read(self, name: str, generation: int) -> None:
        """A first read of this version here (for the main process's warm-up)."""

    def released(self, dataset_id: int) -> None:
        """No read of this retired dataset runs here any more; its descriptors are closed."""


class WorkerStore:
    """A worker's read-only store (see the module docstring).  Thread-safe; `close()`
    stops its read engine and prefetcher and closes its extent descriptors."""

    def __init__(self, settings: WorkerSettings, main: MainProcess):
        self.config = settings
        self.main = main
        self.metrics = Metrics()
        self.batch_limits = BatchLimits(settings.batch_ids_max, settings.batch_bytes_max)
        self.directory = SampleDirectory()
        self._files = ExtentFiles(ExtentStore(settings.data_dir), settings.open_extents_max)
        engine = ReadEngine(self._files, threads=settings.reader_threads,
                            chunk_bytes=settings.chunk_bytes,
                            inflight_bytes_max=settings.inflight_bytes_max,
                            metrics=self.metrics, io_uring=settings.io_uring)
        self.reads = DatasetReads(self._files, engine,
                                  Prefetcher(self._files, io_uring=settings.io_uring),
                                  self.metrics, self.batch_limits, verify=settings.verify,
                                  coalesce_gap_bytes=settings.coalesce_gap_bytes,
                                  sendfile=settings.sendfile,
                                  mapped_sends=settings.mapped_sends)
        self._leases = ReadLeases(free=self._release)
        self._first_reads: set[int] = set()  # dataset ids whose first read was told
        self._lock = threading.Lock()
        self.closed = False

    # --- what the replies ask ----------------------------------------------------------

    def dataset(self, name: str) -> SampleArrays:
        """The dataset `name` as this worker serves it.  Raises InvalidArgument and the
        main process's NotFound (which names a running ingest)."""
        check_read_name(name)
        found = self.directory.find(name)
        if found is None:
            self._explain(name, 0)
            found = self.directory.get(name)
        return found

    def reading(self, name: str, generation: int = 0, *,
                first_read: bool = True) -> ContextManager[SampleArrays]:
        """The dataset `name`, leased until the block ends (see Store.reading: the same
        contract and errors, per process)."""
        check_read_name(name)
        if self.directory.find(name) is None:
            self._explain(name, generation)
        if self.closed:
            raise Unavailable("the daemon is shutting down; retry once it is back")

        def resolve() -> SampleArrays:
            dataset = self.directory.get(name)
            dataset.check_generation(generation)
            if first_read and self.config.warm_on_first_read and FILE_VERSION_SEP not in name:
                self._tell_first_read(dataset)
            return dataset

        return self._leases.hold(resolve)

    def _explain(self, name: str, generation: int) -> None:
        """Raise what the main process says is wrong with reading `name`; return when
        it is readable after all (its publish was on its way here: the control
        channel delivers it before the answer)."""
        error = self.main.explain_missing(name, generation)
        if error is not None:
            raise error
        if self.directory.find(name) is None:
            raise NotFound(f"no dataset named {name!r}; `dlfs datasets` lists the existing "
                           "ones")

    def _tell_first_read(self, dataset: SampleArrays) -> None:
        with self._lock:
            if dataset.dataset_id in self._first_reads:
                return
            self._first_reads.add(dataset.dataset_id)
        self.main.first_read(dataset.name, dataset.generation)

    # --- what the main process changes ------------------------------------------------------

    def publish(self, dataset: SampleArrays) -> None:
        """Serve `dataset` under its name from now on; a version it replaces is retired
        (released once its last read here ends)."""
        previous = self.directory.publish(dataset)
        if previous is not None and previous.dataset_id != dataset.dataset_id:
            self._leases.retire(previous.dataset_id)

    def remove(self, name: str, dataset_id: int) -> None:
        """Stop serving dataset `name` if it is still version `dataset_id`; retire it."""
        found = self.directory.find(name)
        if found is not None and found.dataset_id == dataset_id:
            self.directory.remove(name)
            self._leases.retire(dataset_id)

    def _release(self, dataset_id: int) -> None:
        with self._lock:
            self._first_reads.discard(dataset_id)
        self.reads.forget_dataset(dataset_id)
        self.main.released(dataset_id)

    def close(self) -> None:
        """Refuse new reads, stop the read engine and prefetcher, close descriptors."""
        self.closed = True
        self.reads.close()
        self._files.close()
