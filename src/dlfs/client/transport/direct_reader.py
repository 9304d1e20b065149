"""`DirectReader`: one dataset's extent files, passed by the daemon, mapped here.

A sample is a read-only memoryview straight into the page cache: no sample
byte crosses a socket or is copied.  The daemon passes the dataset's
location arrays (24 bytes per sample) and read-only descriptors of its
extent files over its Unix socket (`DataPath.open_dataset`, SCM_RIGHTS; see
`dlfs/proto/datapath.md`).  What `DirectTransport` serves batches from, and
what a co-located mount reads small files and checked parts of large ones
from (`Client.extent_reader`).

A little over 400 lines: one class, whose reads (batches, whole samples,
checked parts, extent pieces for splicing) share its mapped state and the
checks of ids, extents, CRCs and versions against it.
"""

from __future__ import annotations

import mmap
import os
import threading

import numpy as np

from dlfs import limits
from dlfs.client.transport.checksum_errors import block_prefix, renamable
from dlfs.client.transport.datapath_pool import DataPath
from dlfs.crc import crc32c
from dlfs.errors import (
    DataCorruption,
    FailedPrecondition,
    InvalidArgument,
    StaleGeneration,
    StoredElsewhere,
    Unavailable,
)
from dlfs.formats import block_crcs, disk_layout as layout


class _Extent:
    """One extent file, from a passed descriptor, mapped read-only; views of it are samples."""

    __slots__ = ("fd", "view", "size")

    def __init__(self, fd: int, dataset_id: int, extent_no: int, label: str):
        self.fd = fd
        layout.check_header(os.pread(fd, layout.HEADER_BYTES, 0), dataset_id, extent_no, label)
        self.size = os.fstat(fd).st_size
        mapping = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        # No read-ahead around page faults: random samples want only their own pages.
        mapping.madvise(mmap.MADV_RANDOM)
        self.view = memoryview(mapping)

    def release_pages(self) -> None:
        """Drop this process's page table entries of the mapping (MADV_DONTNEED).  The
        pages stay in the page cache and views stay valid: the next touch maps a page
        again, from the cache or the file (an extent never changes)."""
        self.view.obj.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        # The mapping itself lives as long as any sample view of it.
        os.close(self.fd)


class DirectReader:
    """Serves batches of one dataset from its extent files, mapped into this process.

    A sample is a read-only memoryview straight into the page cache (no copy
    at all).  Cold data: the first `limits.nowait_probe_pieces` samples of a
    batch are probed with `preadv(RWF_NOWAIT)`; if any is not cached, every
    sample's pages get `madvise(WILLNEED)` first, so the device sees the
    whole batch at once instead of one page fault at a time.  CRC32C checks
    (on by default) touch every byte, so a returned sample is resident.

    Extents are immutable and never truncated, only unlinked; a mapping of
    a deleted dataset stays valid while views of it exist.  Sample ends are
    checked against the file size, so a damaged (short) extent raises
    DataCorruption rather than faulting.  Thread-safe.
    """

    def __init__(self, data_path: DataPath, dataset: str):
        self._data_path = data_path
        self._dataset = dataset
        self._lock = threading.Lock()
        self._extents: dict[int, _Extent] = {}
        # (generation, sample id) -> (block bytes, CRC32C per block or None);
        # asked of the daemon at a sample's first partial read, at most
        # `limits.direct_block_crc_samples_max` kept (oldest dropped first).
        self._block_crcs: dict[int, tuple[int, np.ndarray | None]] = {}
        self._load()

    def _load(self) -> None:
        try:
            opened = self._data_path.open_dataset(self._dataset)
        except Unavailable as exc:
            if self._data_path.ever_connected:
                raise
            raise FailedPrecondition(
                f"direct reads need the DLFS daemon's Unix socket on this host "
                f"({self._data_path.endpoint.label}): {exc}; use Client(address) without "
                "direct=True") from None
        extents = {}
        try:
            for extent_no, fd in list(opened.fds.items()):
                label = f"extent {extent_no} of dataset {self._dataset!r}"
                extents[extent_no] = _Extent(opened.fds.pop(extent_no), opened.generation,
                                             extent_no, label)
        except BaseException:
            for fd in opened.fds.values():
                os.close(fd)
            for extent in extents.values():
                extent.close()
            raise
        with self._lock:
            old, self._extents = self._extents, extents
            self._index = opened
            self._block_crcs = {}
            # Any extent tells when the dataset was replaced or deleted: all go together.
            self._sentinel = next(iter(extents.values())).fd if extents else -1
        for extent in old.values():
            extent.close()

    def release_mapped_pages(self) -> int:
        """Let go of the pages of this dataset's extents that this process has mapped;
        returns the bytes of the mappings released.

        Pages a process maps count in its RSS, and the kernel's drop_caches
        skips mapped pages, so a long-lived reader (a mount) would otherwise
        keep every page it ever read mapped.  The pages stay in the page
        cache, and views handed out stay valid (a touch maps the page again).
        Thread-safe; costs one `madvise` per extent.
        """
        with self._lock:
            extents = list(self._extents.values())
        for extent in extents:
            extent.release_pages()
        return sum(extent.size for extent in extents)

    def close(self) -> None:
        with self._lock:
            old, self._extents = self._extents, {}
        for extent in old.values():
            extent.close()

    def _snapshot(self, generation: int, *, check_links: bool = True):
        """(index, extents) of the version to read, taken together (see `_version`)."""
        self._version(generation, check_links=check_links)
        with self._lock:
            index, extents = self._index, self._extents
        if generation and generation != index.generation:
            raise self._stale(generation, index)
        return index, extents

    def _version(self, generation: int, *, check_links: bool = True):
        """The mapped version's index, reloaded first when `generation` names another
        or (`check_links`, one fstat) the daemon unlinked the mapped one.  Raises
        StaleGeneration when the version asked for is no longer served."""
        if (generation and generation != self._index.generation) or \
                (check_links and self._replaced()):
            self._load()
        index = self._index
        if generation and generation != index.generation:
            raise self._stale(generation, index)
        return index

    def _stale(self, generation: int, index) -> StaleGeneration:
        return StaleGeneration(
            f"dataset {self._dataset!r} was replaced: version {generation} is no longer "
            f"served (the current one is {index.generation}); open it again")

    def _elsewhere(self, sample_id: int) -> StoredElsewhere:
        """The error for a sample of a striped dataset that other daemons store (readers
        that can ask the daemons instead catch its class)."""
        return StoredElsewhere(
            f"sample {sample_id} of dataset {self._dataset!r} is stored on other daemons, "
            "not on this one; read the striped dataset through its cluster: Client(etcd=URL)")

    def _replaced(self) -> bool:
        """Whether the daemon unlinked this version's extents (one fstat)."""
        return self._sentinel >= 0 and os.fstat(self._sentinel).st_nlink == 0

    def get_batch(self, ids, *, verify: bool = True, generation: int = 0) -> list[memoryview]:
        """Samples `ids` (integer ids) as read-only memoryviews into the mapped extents.

        With a `generation`, only that version of the dataset will do:
        StaleGeneration when the daemon now has another (the mapped one is
        reloaded first if it was replaced).
        """
        self._version(generation)
        return self._read(ids, verify)

    def sample(self, sample_id: int, *, generation: int = 0) -> memoryview:
        """One whole sample, CRC32C verified, as a read-only view of the mapped extent:
        what `get_batch([sample_id])` returns, without its per-batch array work (a
        mount reads one file at a time; that work was most of its cost).  Raises what
        get_batch does."""
        index, extents = self._snapshot(generation)
        return self._whole(index, extents, sample_id, verify=True)

    def read_range(self, sample_id: int, offset: int, length: int, *, verify: bool = True,
                   generation: int = 0) -> memoryview:
        """`length` bytes (0: to the end) at `offset` of one sample, clipped to it, as a
        read-only view of the mapped extent.

        Verified as the daemon's ranges are: a whole sample against its
        CRC32C, a part of one against the CRC32Cs of the blocks around it
        (dlfs.formats.block_crcs; asked of the daemon once per sample), so every
        byte returned was checked.  A large sample of a dataset ingested
        before block CRCs cannot be checked in part.  Raises what get_batch
        does, DataCorruption naming the block.
        """
        index, extents = self._snapshot(generation)
        if offset < 0 or length < 0:
            raise InvalidArgument(f"a range needs offset and length >= 0, not {offset} and "
                                  f"{length}")
        whole = self._sample_view(index, extents, sample_id)
        size = len(whole)
        start = min(offset, size)
        stop = size if length == 0 else min(size, start + length)
        if start == 0 and stop == size:
            return self._whole(index, extents, sample_id, verify)
        if start < stop:
            block_bytes, crcs = (self._crcs_of(index, sample_id) if verify
                                 else (limits.crc_block_bytes, None))
            self._advise_blocks(index, extents, sample_id, start, stop, block_bytes)
            if crcs is not None:  # None: ingested before block CRCs, nothing to check against
                self._verify_blocks(sample_id, whole, start, stop, block_bytes, crcs)
        return whole[start:stop]

    def extent_part(self, sample_id: int, offset: int, length: int, *, generation: int = 0
                    ) -> tuple[int, int, int] | None:
        """(descriptor, offset in the extent file, bytes) of a part of one sample, once
        the blocks around it were checked, for a reader that hands the extent's pages
        on without reading them itself (the mount's splice READs).  The descriptor is
        the caller's to close (a duplicate: a reload cannot close it under it).  None
        when the part is empty or cannot be checked by blocks (a dataset stored
        without block CRCs), or the dataset was reloaded
        meanwhile: read it another way.  Raises what read_range does."""
        # A part of a named version needs no fstat: the mapped version serves it or
        # is reloaded (then the new one serves it, or StaleGeneration).
        index, extents = self._snapshot(generation, check_links=not generation)
        whole = self._sample_view(index, extents, sample_id)
        size = len(whole)
        start = min(max(offset, 0), size)
        stop = min(size, start + max(length, 0))
        if start >= stop:
            return None
        block_bytes, crcs = self._crcs_of(index, sample_id)
        if crcs is None:
            return None
        self._advise_blocks(index, extents, sample_id, start, stop, block_bytes)
        self._verify_blocks(sample_id, whole, start, stop, block_bytes, crcs)
        extent_no, base = int(index.extent[sample_id]), int(index.offset[sample_id])
        try:
            fd = os.dup(extents[extent_no].fd)
        except OSError:
            fd = -1
        # A reload swaps the extents before it closes the old ones: if they are still
        # the current ones now, the duplicate is of the right file.
        if self._extents is not extents:
            if fd >= 0:
                os.close(fd)
            return None
        return fd, base + start, stop - start

    def _sample_view(self, index, extents, sample_id: int) -> memoryview:
        """One sample's bytes in its mapped extent (nothing read), its id and extent
        checked as `_read` checks them.  O(1)."""
        if not 0 <= sample_id < index.samples:
            raise InvalidArgument(
                f"sample id {sample_id} is out of range for dataset {self._dataset!r}: valid "
                f"ids are 0..{index.samples - 1}")
        extent = extents.get(int(index.extent[sample_id]))
        if extent is None:
            raise self._elsewhere(sample_id)
        base, size = int(index.offset[sample_id]), int(index.length[sample_id])
        if base + size > extent.size:
            raise DataCorruption(
                f"extent {int(index.extent[sample_id])} of dataset {self._dataset!r} is "
                f"truncated: sample {sample_id} ends past its {extent.size} bytes; re-ingest "
                "the dataset")
        return extent.view[base:base + size]

    def _whole(self, index, extents, sample_id: int, verify: bool) -> memoryview:
        """One whole sample of version `index` (advised when cold), checked against its
        CRC32C when `verify`."""
        view = self._sample_view(index, extents, sample_id)
        self._advise_if_cold(extents, int(index.extent[sample_id]),
                             int(index.offset[sample_id]), len(view))
        if verify:
            expected = int(index.crc[sample_id])
            got = crc32c(view)
            if got != expected:
                raise _mismatch(f"sample {sample_id} of dataset {self._dataset!r}", sample_id,
                                None, expected, got)
        return view

    def _advise_blocks(self, index, extents, sample_id: int, start: int, stop: int,
                       block_bytes: int) -> None:
        """Only a part of the sample is read (and the blocks around it, to check them):
        advise just those pages when they look cold."""
        first, last = block_crcs.widen(start, stop, int(index.length[sample_id]), block_bytes)
        self._advise_if_cold(extents, int(index.extent[sample_id]),
                             int(index.offset[sample_id]) + first, last - first)

    @classmethod
    def _advise_if_cold(cls, extents, extent_no: int, offset: int, length: int) -> None:
        """One piece of one extent: WILLNEED when a probe finds it not cached."""
        piece = ([extent_no], [offset], [length])
        if cls._looks_cold(extents, *piece):
            _advise_willneed(extents, *piece)

    def _verify_blocks(self, sample_id: int, whole: memoryview, start: int, stop: int,
                       block_bytes: int, crcs: np.ndarray) -> None:
        """Check the blocks of `whole` (one sample) around bytes [start, stop)."""
        first, last = block_crcs.widen(start, stop, len(whole), block_bytes)
        k0 = first // block_bytes
        blocks = [whole[b:min(b + block_bytes, last)] for b in range(first, last, block_bytes)]
        expected = crcs[k0:k0 + len(blocks)].tolist()
        bad = block_crcs.first_bad_piece(blocks, expected)
        if bad is not None:
            k, got = bad
            lo = first + k * block_bytes
            block = (lo, lo + len(blocks[k]))
            raise _mismatch(block_prefix(block) + f"sample {sample_id} of dataset "
                            f"{self._dataset!r}", sample_id, block, expected[k], got)

    def _crcs_of(self, index, sample_id: int) -> tuple[int, np.ndarray | None]:
        """(block bytes, CRC32C per block or None) of a sample of version `index`."""
        key = (index.generation, sample_id)  # a reload meanwhile must not mix versions
        known = self._block_crcs.get(key)
        if known is not None:
            return known
        _generation, block_bytes, crcs = self._data_path.block_crcs(
            self._dataset, sample_id, index.generation)
        known = (block_bytes, crcs)
        with self._lock:
            if self._index is index:
                if len(self._block_crcs) >= limits.direct_block_crc_samples_max:
                    del self._block_crcs[next(iter(self._block_crcs))]
                self._block_crcs[key] = known
        return known

    def prefetch(self, ids) -> None:
        """Start reading samples `ids` into the page cache (madvise WILLNEED); returns at once."""
        index, extents = self._index, self._extents
        ids = np.asarray(ids, dtype=np.int64)
        ids = ids[(ids >= 0) & (ids < index.samples)]  # a hint; bad ids fail at get_batch
        extent_nos = index.extent[ids].tolist()
        if all(e in extents for e in set(extent_nos)):
            _advise_willneed(extents, extent_nos, index.offset[ids].tolist(),
                             index.length[ids].tolist())

    def _read(self, ids, verify: bool) -> list[memoryview]:
        index, all_extents = self._index, self._extents
        ids = np.asarray(ids, dtype=np.int64)
        bad = (ids < 0) | (ids >= index.samples)
        if bad.any():
            raise InvalidArgument(
                f"sample id {int(ids[np.argmax(bad)])} is out of range for dataset "
                f"{self._dataset!r}: valid ids are 0..{index.samples - 1}")
        extent_array = index.extent[ids]
        ends = index.offset[ids] + index.length[ids]
        extents = {}
        for e in np.unique(extent_array).tolist():
            extent = all_extents.get(e)
            if extent is None:
                raise self._elsewhere(int(ids[np.argmax(extent_array == e)]))
            beyond = (extent_array == e) & (ends > extent.size)
            if beyond.any():
                raise DataCorruption(
                    f"extent {e} of dataset {self._dataset!r} is truncated: sample "
                    f"{int(ids[np.argmax(beyond)])} ends past its {extent.size} bytes; "
                    "re-ingest the dataset")
            extents[e] = extent
        extent_nos = extent_array.tolist()
        offsets = index.offset[ids].tolist()
        lengths = index.length[ids].tolist()
        if self._looks_cold(extents, extent_nos, offsets, lengths):
            _advise_willneed(extents, extent_nos, offsets, lengths)
        samples = [extents[e].view[o:o + n] for e, o, n in zip(extent_nos, offsets, lengths)]
        if verify:
            expected = index.crc[ids].tolist()
            bad = block_crcs.first_bad_piece(samples, expected)
            if bad is not None:
                k, got = bad
                raise _mismatch(f"sample {int(ids[k])} of dataset {self._dataset!r}",
                                int(ids[k]), None, expected[k], got)
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


def _mismatch(what: str, sample_id: int, block, expected: int, got: int) -> DataCorruption:
    """The error for bytes of a mapped extent that fail their CRC32C (`what` names the
    sample, and the block when a part was checked)."""
    error = DataCorruption(f"checksum mismatch for {what}: stored CRC32C {expected:08x}, "
                           f"read {got:08x}; the extent is damaged (`dlfs scrub` lists the "
                           "damaged samples)")
    # What the transport needs to name the sample's path (`named_checksum_error`).
    return renamable(error, sample_id, block,
                     lambda other: _mismatch(other, sample_id, block, expected, got))


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
