"""Co-located reads: a client on the daemon's host maps the extent files itself.

`DirectTransport` is the transport of `Client(address, direct=True)`.  It
holds a `DataPathTransport` over the daemon's Unix socket: for the
daemon's control calls, for hints and the dataset's version, and to be
passed the dataset's extent files, which a `DirectReader` per dataset maps
(`direct_reader`).  Batches and ranges are then views of the page cache:
no sample byte crosses a socket or is copied.  The client needs no access
to the daemon's data dir (it stays 0700): the daemon decides who gets
descriptors (its tokens, or its own user and root by SO_PEERCRED).

A passed descriptor cannot be taken back.  When a dataset is replaced or
deleted the daemon unlinks its extents; the reader notices before each
batch (one `fstat`: no links left), asks for the dataset again and reads
the new version (or raises NotFound), as reads through the daemon would.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Iterator


from dlfs import limits
from dlfs.client.reply_buffers import copy_into
from dlfs.client.transport.checksum_errors import with_sample_path
from dlfs.client.transport.datapath_pool import DataPath
from dlfs.client.transport.datapath_transport import DataPathTransport
from dlfs.client.transport.direct_reader import DirectReader
from dlfs.client.transport.one_daemon import OneDaemon
from dlfs.client.transport.read_requests import (
    BatchRequest,
    PrefetchRequest,
    RangeRequest,
    range_id,
    request_ids,
)
from dlfs.errors import DataCorruption, FailedPrecondition
from dlfs.types import DatasetInfo


class DirectTransport(OneDaemon):
    """A daemon's transport whose batches come from its extent files, mapped here
    (`contract.Daemon`).  Options are `DataPathTransport`'s (its socket is "unix").

    Raises FailedPrecondition at the first batch when the daemon's Unix
    socket cannot be reached from here (another host, another network
    namespace), or PermissionDenied when the daemon refuses to pass
    descriptors to this user.
    """

    def __init__(self, address: str, **options):
        self.data = DataPathTransport(address, socket="unix", **options)
        self.control = self.data.control
        self.address = address
        self.addresses = (address,)
        self._readers: dict[str, DirectReader] = {}
        self._readers_lock = threading.Lock()

    def close(self) -> None:
        with self._readers_lock:
            readers, self._readers = list(self._readers.values()), {}
        for reader in readers:
            reader.close()
        self.data.close()

    def __repr__(self) -> str:
        return f"DirectTransport({self.address!r})"

    def data_path(self) -> DataPath | None:
        return self.data.data_path()

    def forget_data_path(self, data: DataPath) -> None:
        self.data.forget_data_path(data)

    def data_path_hints(self) -> dict:
        return self.data.data_path_hints()

    def forget(self, dataset: str) -> None:
        """Nothing is cached but the mapped extents, which notice a replace themselves."""

    # --- metadata ----------------------------------------------------------------------

    def dataset_info(self, dataset: str, known: DatasetInfo | None = None) -> DatasetInfo:
        return self.data.dataset_info(dataset, known)

    # --- reads -------------------------------------------------------------------------

    def prepare(self, dataset: str) -> None:
        """Fetch the index and the extents of `dataset` now."""
        self._reader(dataset)

    def get_batch(self, request: BatchRequest, out=None) -> list[memoryview]:
        """Views of the mapped extents; with `out`, copies of them in `out`.  A batch over
        the daemon's limit of samples (told at WELCOME) raises the daemon's own
        InvalidArgument, as every transport does."""
        if not request.size:
            return []
        reader = self._reader(request.dataset)
        self._local().batch_limits.check_count(request.size)
        if request.prefetch_ids.size:
            reader.prefetch(request.prefetch_ids)
        try:
            samples = reader.get_batch(request_ids(request, self.lookup), verify=request.verify,
                                       generation=request.generation)
        except DataCorruption as exc:
            raise with_sample_path(exc, request.dataset, self.control.lookup) from None
        return samples if out is None else copy_into(out, samples)

    def prefetch(self, request: PrefetchRequest, wait: bool = True) -> bool:
        """A hint to the daemon, as the data-path transport sends it."""
        return self.data.prefetch(request, wait)

    def read_range(self, request: RangeRequest) -> memoryview:
        """A view of the mapped extent, verified by blocks (DirectReader.read_range)."""
        sample_id = range_id(request, self.lookup)
        try:
            return self._reader(request.dataset).read_range(
                sample_id, request.offset, request.length, verify=request.verify,
                generation=request.generation)
        except DataCorruption as exc:
            raise with_sample_path(exc, request.dataset, self.control.lookup) from None

    def read_chunks(self, request: RangeRequest) -> Iterator[tuple[int, memoryview]]:
        """As the other transports: (position, piece) pairs, each at most
        `limits.data_path_chunks_bytes_max`, read from the mapped extent."""
        step = limits.data_path_chunks_bytes_max
        position, left = 0, request.length
        while True:
            part = dataclasses.replace(request, offset=request.offset + position,
                                       length=step if request.length == 0 else min(step, left))
            piece = self.read_range(part)
            if len(piece):
                yield position, piece
            position += len(piece)
            left -= len(piece)
            if len(piece) < part.length or (request.length and left <= 0):
                return

    def extent_reader(self, dataset: str) -> DirectReader:
        """The dataset's `DirectReader` (its extents mapped; fetched at the first call)."""
        return self._reader(dataset)

    def _reader(self, dataset: str) -> DirectReader:
        with self._readers_lock:
            reader = self._readers.get(dataset)
            if reader is None:
                reader = self._readers[dataset] = DirectReader(self._local(), dataset)
            return reader

    def _local(self) -> DataPath:
        data = self.data.data_path()
        if data is None:
            raise FailedPrecondition(
                f"direct reads take extents passed over the DLFS daemon's Unix socket, and the "
                f"daemon at {self.address} cannot pass them: {self.data.no_data_path_reason}; "
                "use Client(address) without direct=True")
        return data
