"""Co-located reads: a client on the daemon's host reads extent files itself.

`DirectTransport` is the transport of `Client(address, direct=True)`: the
daemon's gRPC transport for everything but batches, which a `DirectReader`
per dataset serves from the extent files.

The daemon still owns the directory; the client fetches a dataset's location
arrays once (GetIndex, 24 bytes per sample), maps the extent files
read-only and hands out views of them: no bytes cross the gRPC channel and
none are copied.  It is allowed only when
the client can read DATA_DIR/daemon-token and finds the token the daemon
reported, i.e. it sees the daemon's own files.

A replaced or deleted dataset removes its extent directory; the reader
checks for it before each batch (one stat), fetches the index again, and
then reads the new dataset (or raises NotFound), as reads through the
daemon would.
"""

from __future__ import annotations

import mmap
import os
import threading

import crc32c
import numpy as np

from dlfs import layout, limits
from dlfs.client.buffers import copy_into
from dlfs.client.requests import batch_size
from dlfs.client.transport import DaemonTransport
from dlfs.errors import DataCorruption, FailedPrecondition, InvalidArgument
from dlfs.layout import HEADER_BYTES, TOKEN_FILE, check_header
from dlfs.proto import dlfs_pb2 as pb


class DirectTransport(DaemonTransport):
    """A daemon's transport whose batches come from its extent files, mapped here.

    Metadata, ranges, hints and ingest go to the daemon over gRPC; a
    `DirectReader` per dataset (created on first use) serves batches.
    Raises FailedPrecondition at the first batch when this process does
    not see the daemon's own data dir.
    """

    def __init__(self, address: str, **options):
        super().__init__(address, **options)
        self._readers: dict[str, DirectReader] = {}
        self._readers_lock = threading.Lock()

    def close(self) -> None:
        with self._readers_lock:
            readers, self._readers = list(self._readers.values()), {}
        for reader in readers:
            reader.close()
        super().close()

    def prepare(self, dataset: str) -> None:
        """Fetch the location index of `dataset` and check the data dir now."""
        self._reader(dataset)

    def get_batch(self, request: pb.GetBatchRequest, out=None) -> list[memoryview]:
        """Views of the mapped extents; with `out`, copies of them in `out`."""
        if not batch_size(request):
            return []
        reader = self._reader(request.dataset)
        if request.prefetch_ids:
            reader.prefetch(request.prefetch_ids)
        samples = reader.get_batch(self.ids_of(request), verify=not request.skip_verify)
        return samples if out is None else copy_into(out, samples)

    def _reader(self, dataset: str) -> "DirectReader":
        with self._readers_lock:
            reader = self._readers.get(dataset)
            if reader is None:
                reader = self._readers[dataset] = DirectReader(self, dataset)
            return reader


class _ExtentGone(Exception):
    """An extent file of the index is not on disk: the dataset was replaced or deleted
    (or the file is lost, if it is still missing after the index was fetched again)."""

    def __init__(self, path: str):
        super().__init__(path)
        self.path = path

    def corruption(self) -> DataCorruption:
        return DataCorruption(f"extent file {self.path} is missing")


class _Index:
    """A dataset's location arrays as fetched from the daemon."""

    def __init__(self, transport: DaemonTransport, dataset: str):
        chunks = transport.index(dataset)
        first = chunks[0]
        self.dataset_id = first.dataset_id
        self.data_dir = first.data_dir
        self.samples = first.samples
        self.extent = np.frombuffer(b"".join(c.extent for c in chunks), "<u4")
        self.offset = np.frombuffer(b"".join(c.offset for c in chunks), "<u8")
        self.length = np.frombuffer(b"".join(c.length for c in chunks), "<u8")
        self.crc = np.frombuffer(b"".join(c.crc32c for c in chunks), "<u4")
        assert self.extent.size == self.samples, "index chunks do not add up"
        token_path = os.path.join(self.data_dir, TOKEN_FILE)
        try:
            local_token = layout.read_token(self.data_dir)
        except OSError as exc:
            raise FailedPrecondition(
                f"direct reads need the daemon's data dir on this host: cannot read {token_path} "
                f"({exc.strerror}); use Client(..., direct=False)") from None
        if local_token != first.daemon_token:
            raise FailedPrecondition(
                f"{token_path} belongs to another daemon than {transport.address}; direct reads "
                "need the daemon's own data dir; use Client(..., direct=False)")


class _Extent:
    """One extent file mapped read-only; views into it are the samples."""

    __slots__ = ("fd", "view", "size")

    def __init__(self, path: str, dataset_id: int, extent_no: int):
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            check_header(os.pread(self.fd, HEADER_BYTES, 0), dataset_id, extent_no, path)
            self.size = os.fstat(self.fd).st_size
            mapping = mmap.mmap(self.fd, 0, prot=mmap.PROT_READ)
        except BaseException:
            os.close(self.fd)
            raise
        # No read-ahead around page faults: random samples want only their own pages.
        mapping.madvise(mmap.MADV_RANDOM)
        self.view = memoryview(mapping)

    def close(self) -> None:
        # The mapping itself lives as long as any sample view of it.
        os.close(self.fd)


class DirectReader:
    """Serves batches of one dataset from its extent files, mapped into this process.

    A sample is a read-only memoryview straight into the page cache (no copy
    at all).  Cold data: the first `limits.nowait_probe_pieces` samples of a batch are
    probed with `preadv(RWF_NOWAIT)`; if any is not cached, every sample's
    pages get `madvise(WILLNEED)` first, so the device sees the whole batch
    at once instead of one page fault at a time.  CRC32C checks (on by
    default) touch every byte, so a returned sample is resident.

    Extents are immutable and never truncated, only unlinked; a mapping of
    a deleted dataset stays valid while views of it exist.  Sample ends are
    checked against the file size, so a damaged (short) extent raises
    DataCorruption rather than faulting.  Thread-safe.
    """

    def __init__(self, transport: DaemonTransport, dataset: str):
        self._transport = transport
        self._dataset = dataset
        self._lock = threading.Lock()
        self._extents: dict[int, _Extent] = {}
        self._load()

    def _load(self) -> None:
        index = _Index(self._transport, self._dataset)
        with self._lock:
            old, self._extents = self._extents, {}
            self._index = index
            self._dataset_dir = layout.dataset_dir(index.data_dir, index.dataset_id)
        for extent in old.values():
            extent.close()

    def close(self) -> None:
        with self._lock:
            old, self._extents = self._extents, {}
        for extent in old.values():
            extent.close()

    def _extent(self, extent_no: int) -> _Extent:
        with self._lock:
            extent = self._extents.get(extent_no)
            if extent is None:
                path = layout.extent_path(self._index.data_dir, self._index.dataset_id, extent_no)
                try:
                    extent = _Extent(path, self._index.dataset_id, extent_no)
                except FileNotFoundError:
                    raise _ExtentGone(path) from None
                self._extents[extent_no] = extent
            return extent

    def get_batch(self, ids, *, verify: bool = True) -> list[memoryview]:
        """Samples `ids` (integer ids) as read-only memoryviews into the mapped extents."""
        if not os.path.isdir(self._dataset_dir):  # one stat per batch: replaced or deleted?
            self._load()
        try:
            return self._read(ids, verify)
        except _ExtentGone:
            self._load()  # the dataset was replaced or deleted since the index was fetched
            return self._read(ids, verify)

    def prefetch(self, ids) -> None:
        """Start reading samples `ids` into the page cache (madvise WILLNEED); returns at once."""
        index = self._index
        ids = np.asarray(ids, dtype=np.int64)
        ids = ids[(ids >= 0) & (ids < index.samples)]  # a hint; bad ids fail at get_batch
        extent_nos = index.extent[ids].tolist()
        try:
            extents = {e: self._extent(e) for e in set(extent_nos)}
        except _ExtentGone:
            return  # replaced or deleted: the next get_batch reloads the index
        _advise_willneed(extents, extent_nos, index.offset[ids].tolist(), index.length[ids].tolist())

    def _read(self, ids, verify: bool) -> list[memoryview]:
        index = self._index
        ids = np.asarray(ids, dtype=np.int64)
        bad = (ids < 0) | (ids >= index.samples)
        if bad.any():
            raise InvalidArgument(
                f"sample id {int(ids[np.argmax(bad)])} is out of range for dataset "
                f"{self._dataset!r}: valid ids are 0..{index.samples - 1}")
        extent_array = index.extent[ids]
        ends = index.offset[ids] + index.length[ids]
        extents = {e: self._extent(e) for e in np.unique(extent_array).tolist()}
        for e, extent in extents.items():
            beyond = (extent_array == e) & (ends > extent.size)
            if beyond.any():
                raise DataCorruption(
                    f"extent {e} of dataset {self._dataset!r} is truncated: sample "
                    f"{int(ids[np.argmax(beyond)])} ends past its {extent.size} bytes; "
                    "re-ingest the dataset")
        extent_nos = extent_array.tolist()
        offsets = index.offset[ids].tolist()
        lengths = index.length[ids].tolist()
        if self._looks_cold(extents, extent_nos, offsets, lengths):
            _advise_willneed(extents, extent_nos, offsets, lengths)
        samples = [extents[e].view[o:o + n] for e, o, n in zip(extent_nos, offsets, lengths)]
        if verify:
            for sample, expected, i in zip(samples, index.crc[ids].tolist(), ids.tolist()):
                got = crc32c.crc32c(sample)
                if got != expected:
                    raise DataCorruption(
                        f"checksum mismatch for sample {i} of dataset {self._dataset!r}: stored "
                        f"CRC32C {expected:08x}, read {got:08x}; the extent is damaged")
        return samples

    @staticmethod
    def _looks_cold(extents, extent_nos, offsets, lengths) -> bool:
        """Whether a probe of the first samples finds any byte not in the page cache.

        Probes the middle of each sample: its first page may be cached only
        because it is the last page of the sample before.  A sample of a
        read-ahead chunk or more counts as cold outright: advising it costs
        little next to reading it, and one probe says little about it.
        """
        probe = bytearray(1)
        for e, o, n in list(zip(extent_nos, offsets, lengths))[:limits.nowait_probe_pieces]:
            if n >= limits.willneed_chunk_bytes:
                return True
            try:
                if n and os.preadv(extents[e].fd, [probe], o + n // 2, os.RWF_NOWAIT) == 0:
                    return True
            except BlockingIOError:
                return True
        return False


def _advise_willneed(extents, extent_nos, offsets, lengths) -> None:
    """Start reading every sample's pages at once (madvise WILLNEED).

    The kernel reads at most its read-ahead size per WILLNEED call, so large
    samples are advised in `limits.willneed_chunk_bytes` pieces: a 140 MB
    sample is then all in flight, not faulted in a page at a time.
    """
    page = mmap.PAGESIZE
    step = limits.willneed_chunk_bytes
    for e, o, n in zip(extent_nos, offsets, lengths):
        mapping = extents[e].view.obj
        start, end = o - o % page, o + n
        while start < end:
            length = min(step, end - start)
            mapping.madvise(mmap.MADV_WILLNEED, start, length)
            start += length
