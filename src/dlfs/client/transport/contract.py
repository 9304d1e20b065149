"""The contract of the client's transports: what `Client` may ask of the daemons.

Three protocols, one line of contract each method (units, errors, cost):

- `DaemonControl`: one daemon's control calls over its gRPC service
  (`grpc_control.GrpcControl` is the one implementation);
- `Transport`: what a `Client` holds: metadata and reads, and a way to
  reach each daemon behind it.  `GrpcTransport` (one daemon, all over gRPC),
  `DataPathTransport` (one daemon, reads over its data path, the default),
  `DirectTransport` (one co-located daemon, reads from its extents mapped
  here) and `dlfs.client.cluster.router.ClusterRouter` (several daemons)
  answer it, so `Client` never asks which it holds;
- `DaemonTransport`: a one-daemon `Transport`, with its `control` calls and its data
  path.  `Transport.each` and `call_any` hand out Daemons: for one daemon,
  the transport itself; for several, each member's.

Every call has a deadline (the client's `timeout_s` for control calls,
`batch_timeout_s` for reads) and raises the typed errors of `dlfs.errors`;
calls that only read are retried as the client's one call policy says
(`call_policy`: a lost connection at once, an unreachable daemon for up to
`reconnect_timeout_s`, all within the call's deadline), calls that change
state are made once.  Requests
and answers are plain values: `read_requests`, `ingest_requests`,
`control_replies` and `dlfs.types`; protobuf stops inside the gRPC modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Protocol, Sequence, TypeVar

import numpy as np

from dlfs.client.transport.ingest_requests import IngestPiece, IngestStart
from dlfs.client.transport.read_requests import BatchRequest, PrefetchRequest, RangeRequest
from dlfs.client.transport.control_replies import (DataPathOffer, SampleLocations, ScrubUpdate,
                                                    UnsealedIngest)
from dlfs.errors import DlfsError
from dlfs.types import DaemonStatus, DatasetInfo, Entry, WarmInfo

if TYPE_CHECKING:
    from dlfs.client.transport.datapath_pool import DataPath

T = TypeVar("T")


class DaemonControl(Protocol):
    """One daemon's control calls.  Each is one round trip unless it says otherwise."""

    address: str  # HOST:PORT

    def list_datasets(self) -> list[DatasetInfo]:
        """Every dataset, ingests in progress included (sealed False).  Retried."""

    def get_dataset(self, dataset: str, *, retry: bool = True) -> DatasetInfo:
        """The current version's summary.  NotFound.  Retried unless `retry` is False."""

    def delete_dataset(self, dataset: str) -> DatasetInfo:
        """Remove the sealed dataset and free its space, nothing else (a parked ingest of
        the name stays); the summary it had.  NotFound.  Never retried."""

    def discard_ingest(self, dataset: str) -> DatasetInfo:
        """End the parked ingest of the name and free its space, nothing else (a sealed
        dataset of the name stays); what it held.  NotFound, FailedPrecondition
        (receiving or prepared).  Never retried."""

    def stat(self, dataset: str, path: str, generation: int) -> Entry:
        """A file or directory ("" the root; `path` normalized) of version `generation`
        (0: the current one).  NotFound, StaleGeneration (another version is served: its
        sample ids are not this one's).  Retried."""

    def create_space(self, name: str) -> DatasetInfo:
        """A new, empty checkpoint space.  AlreadyExists.  Never retried (nor the three
        below: each is a change, durable when it returns)."""

    def make_dir(self, space: str, path: str, mode: int = 0o755) -> Entry:
        """A directory of a space.  AlreadyExists, NotFound (its parent)."""

    def remove(self, space: str, path: str, *, directory: bool = False) -> None:
        """A file (or an empty directory) of a space.  NotFound, IsADirectory, ..."""

    def rename(self, space: str, path: str, target: str) -> None:
        """Move `path` to `target` atomically, replacing a file there.  Busy, ..."""

    def list_page(self, dataset: str, path: str, start_after: str,
                  page_size: int, generation: int) -> tuple[list[Entry], bool]:
        """At most `page_size` entries (0: the daemon's default) after name `start_after`,
        in name order, and whether more follow, of version `generation` (as `stat`).
        NotFound, InvalidArgument, StaleGeneration.  Retried."""

    def lookup(self, dataset: str, *, ids: np.ndarray | None = None,
               paths: Sequence[str] | None = None, retry: bool = True) -> list[Entry]:
        """Entries of samples by ids or by paths, in order (at most
        `limits.lookup_items_max`).  NotFound, InvalidArgument.  Retried unless not `retry`."""

    def index(self, dataset: str) -> SampleLocations:
        """Where every sample lies (one stream, 24 bytes a sample, plus holders when
        striped).  NotFound.  Retried."""

    def status(self, *, retry: bool = True) -> DaemonStatus:
        """The daemon's health and counters, `address` filled in.  Retried unless not
        `retry` (one try: whether the daemon answers now)."""

    def warm(self, dataset: str, *, status_only: bool = False) -> WarmInfo:
        """Start reading the dataset into the page cache (or, `status_only`, report the
        latest warm-up).  NotFound.  Never retried."""

    def scrub(self, dataset: str) -> Iterator[ScrubUpdate]:
        """Verify every sample stored there; updates as they come (one stream, deadline
        `limits.ingest_timeout_s_default`), the last `done`.  NotFound.  Never retried."""

    def ingest(self, start: IngestStart, pieces: Iterable[IngestPiece]) -> DatasetInfo:
        """One ingest stream: `start`, then `pieces` in order; the new version's summary
        (prepared, not published, with `start.prepare_only`).  The daemon's typed errors;
        what `pieces` raises is raised as it is (the daemon sees the stream cut off).
        Never retried."""

    def ingest_progress(self, dataset: str, *, timeout_s: float | None = None,
                        retry: bool = True) -> UnsealedIngest:
        """The unsealed ingest of `dataset` held there.  NotFound when there is none.
        Deadline `timeout_s` (default the client's); retried unless not `retry`."""

    def data_path_offer(self) -> DataPathOffer:
        """Where the daemon's data path listens, or why it offers none.  Retried."""


class Transport(Protocol):
    """What a `Client` holds: metadata and reads over one daemon or several."""

    address: str  # HOST:PORT, or several joined by ','
    addresses: tuple[str, ...]

    def close(self) -> None:
        """Close every channel and connection (idempotent)."""

    def each(self, call: Callable[["DaemonTransport"], T]) -> dict[str, T | DlfsError]:
        """`call(daemon)` on every daemon (in parallel): address -> result, or the
        DlfsError it raised."""

    def call_any(self, call: Callable[["DaemonTransport"], T]) -> T:
        """`call(daemon)` on the first daemon that answers it (Unavailable and NotFound
        try the next).  Raises the last error when none did."""

    def dataset_info(self, dataset: str, known: DatasetInfo | None = None) -> DatasetInfo:
        """The current version's summary (`known`: the one the caller had; a forked
        worker asks over the data path and fills the rest from it).  NotFound."""

    def stat(self, dataset: str, path: str, generation: int) -> Entry:
        """As `DaemonControl.stat`, from any daemon holding the dataset."""

    def list_page(self, dataset: str, path: str, start_after: str,
                  page_size: int, generation: int) -> tuple[list[Entry], bool]:
        """As `DaemonControl.list_page`, from any daemon holding the dataset."""

    def lookup(self, dataset: str, *, ids: np.ndarray | None = None,
               paths: Sequence[str] | None = None) -> list[Entry]:
        """As `DaemonControl.lookup`, from any daemon holding the dataset."""

    def prepare(self, dataset: str) -> None:
        """Set up reading `dataset` now rather than at the first batch (direct: map its
        extents; FailedPrecondition when that is impossible here)."""

    def get_batch(self, request: BatchRequest, out=None) -> list[memoryview]:
        """The samples, in request order: read-only views of one reply buffer, or with
        `out` (a writable buffer) written back to back into it and views of it.  One
        round trip (paths: one Lookup more).  InvalidArgument, NotFound,
        DataCorruption, StaleGeneration.  Retried on Unavailable."""

    def read_range(self, request: RangeRequest) -> memoryview:
        """The bytes of one range, clipped to the sample, verified (whole sample, or the
        blocks around a part).  One round trip.  As `get_batch`."""

    def read_chunks(self, request: RangeRequest) -> Iterator[tuple[int, memoryview]]:
        """(position from the range's start, bytes) pieces of a range as they arrive; one
        round trip.  Unavailable before the first piece is retried, later it is raised."""

    def prefetch(self, request: PrefetchRequest, wait: bool = True) -> bool:
        """Hint that the samples are read soon; False when the daemon's queue dropped it.
        Unless `wait`, a hint by ids may be sent without waiting (True: sent)."""

    def data_path_hints(self) -> dict:
        """{address: where its data path listens} for another process (asks now)."""

    def forget(self, dataset: str) -> None:
        """Drop what is cached about `dataset` (its placement), after it was replaced."""


class DaemonTransport(Transport, Protocol):
    """A one-daemon transport: `Transport`, its daemon's `control` calls, its data path."""

    control: DaemonControl

    def data_path(self) -> "DataPath | None":
        """The daemon's data path, asked for at the first call; None when reads go over
        gRPC (TLS, a daemon without one, or a gRPC-only client)."""
