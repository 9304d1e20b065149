"""Read requests -> read plans: which bytes of which extent files go where.

A batch of sample locations becomes a `BatchPlan` (the gRPC payload):

1. duplicate ids are read once;
2. the unique samples are sorted by (extent, offset);
3. runs of samples that sit back to back in one extent (at most
   `coalesce_gap_bytes` apart) merge into ranges of at most about
   `range_bytes_max` bytes: one `pread` each.

The payload is the ranges concatenated in that order (including any
coalesced gap bytes).  Each requested sample maps to an (offset, length)
inside the payload, so duplicates and request order cost no copies.

The data path sends samples back to back in request order instead (the
client receives them straight into a tensor, row by row): `RequestOrder`
maps any window of that payload to its pieces, sorted by (extent, file
offset) so reads go to the device in storage order, with buffer offsets in
request order.

`plan_request` checks a request against the dataset and the daemon's
`BatchLimits` first.  Vectorized throughout: no Python loop per
sample.  Nothing here reads a file or imports grpc.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from dlfs import limits
from dlfs.errors import InvalidArgument
from dlfs.server.core.directory import DatasetIndex
from dlfs.batch_limits import BatchLimits


@dataclasses.dataclass
class BatchPlan:
    """How to read one batch.  Arrays of ranges and unique samples are in payload order."""

    payload_bytes: int
    request_offsets: np.ndarray  # uint64, per requested sample
    request_lengths: np.ndarray  # uint64
    range_extent: np.ndarray  # uint32
    range_file_offset: np.ndarray  # uint64
    range_payload_offset: np.ndarray  # uint64
    range_length: np.ndarray  # uint64
    sample_ids: np.ndarray  # int64, unique samples
    sample_payload_offset: np.ndarray  # uint64
    sample_length: np.ndarray  # uint64
    sample_crc: np.ndarray  # uint32

    @property
    def ranges(self) -> int:
        return int(self.range_extent.size)


def plan_batch(ids: np.ndarray, extent: np.ndarray, offset: np.ndarray, length: np.ndarray,
               crc: np.ndarray, *, coalesce_gap_bytes: int = limits.coalesce_gap_bytes_default,
               range_bytes_max: int = limits.range_bytes_max) -> BatchPlan:
    """Plan the read of samples `ids` (validated, duplicates allowed).

    `extent`, `offset`, `length`, `crc` are the dataset's per-id arrays.
    Vectorized: O(k log k) for k requested ids, no Python loop per sample.
    """
    unique_ids, inverse = np.unique(ids, return_inverse=True)
    n = unique_ids.size
    if n == 0:
        empty_u64 = np.empty(0, np.uint64)
        return BatchPlan(0, empty_u64, empty_u64, np.empty(0, np.uint32), empty_u64, empty_u64,
                         empty_u64, np.empty(0, np.int64), empty_u64, empty_u64,
                         np.empty(0, np.uint32))
    # Signed arithmetic from here on: offsets are far below 2**63 and
    # differences must be allowed to go negative.
    ext = extent[unique_ids].astype(np.int64)
    off = offset[unique_ids].astype(np.int64)
    size = length[unique_ids].astype(np.int64)
    order = np.lexsort((off, ext))
    unique_ids, ext, off, size = unique_ids[order], ext[order], off[order], size[order]
    rank = np.empty_like(order)  # rank[j]: payload position of np.unique's j-th id
    rank[order] = np.arange(n)
    end = off + size
    starts = np.ones(n, dtype=bool)
    starts[1:] = (ext[1:] != ext[:-1]) | (off[1:] - end[:-1] > coalesce_gap_bytes)
    # Split long runs so one range stays near range_bytes_max: a new range
    # begins where a run's running byte count crosses a multiple of it.
    run_start_off = off[starts][np.cumsum(starts) - 1]
    bucket = (np.maximum(end - 1, off) - run_start_off) // max(range_bytes_max, 1)
    starts[1:] |= bucket[1:] != bucket[:-1]
    range_index = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    range_file_offset = off[first]
    range_length = np.maximum.reduceat(end, first) - range_file_offset
    range_payload_offset = np.zeros(first.size, dtype=np.int64)
    np.cumsum(range_length[:-1], out=range_payload_offset[1:])
    sample_payload_offset = range_payload_offset[range_index] + (off - range_file_offset[range_index])
    request_rank = rank[inverse]
    request_offsets = sample_payload_offset[request_rank]
    request_lengths = size[request_rank]
    return BatchPlan(
        payload_bytes=int(range_length.sum()),
        request_offsets=request_offsets.astype(np.uint64, copy=False),
        request_lengths=request_lengths.astype(np.uint64, copy=False),
        range_extent=ext[first].astype(np.uint32, copy=False),
        range_file_offset=range_file_offset.astype(np.uint64, copy=False),
        range_payload_offset=range_payload_offset.astype(np.uint64, copy=False),
        range_length=range_length.astype(np.uint64, copy=False),
        sample_ids=unique_ids.astype(np.int64, copy=False),
        sample_payload_offset=sample_payload_offset.astype(np.uint64, copy=False),
        sample_length=size.astype(np.uint64, copy=False),
        sample_crc=crc[unique_ids].astype(np.uint32, copy=False),
    )


# One contiguous piece of a window: (extent no, file offset, window offset, bytes).
Piece = tuple[int, int, int, int]


class PieceColumns(Sequence):
    """Pieces kept as four int64 arrays (extent, file offset, buffer offset, bytes).

    Reads the page cache holds take the arrays whole (one io_uring
    submission); code that walks pieces one by one sees the list of Piece
    tuples, built on first use.  Immutable.
    """

    __slots__ = ("extent", "file_offset", "buffer_offset", "size", "_tuples")

    def __init__(self, extent: np.ndarray, file_offset: np.ndarray, buffer_offset: np.ndarray,
                 size: np.ndarray):
        self.extent, self.file_offset = extent, file_offset
        self.buffer_offset, self.size = buffer_offset, size
        self._tuples: list[Piece] | None = None

    def tuples(self) -> list[Piece]:
        if self._tuples is None:
            self._tuples = list(zip(self.extent.tolist(), self.file_offset.tolist(),
                                    self.buffer_offset.tolist(), self.size.tolist()))
        return self._tuples

    def __len__(self) -> int:
        return self.size.size

    def __getitem__(self, index):
        """A Piece tuple; a slice of pieces as PieceColumns (views of the arrays)."""
        if isinstance(index, slice):
            return PieceColumns(self.extent[index], self.file_offset[index],
                                self.buffer_offset[index], self.size[index])
        return self.tuples()[index]

    def __iter__(self):
        return iter(self.tuples())

    def __eq__(self, other) -> bool:
        if isinstance(other, PieceColumns):
            other = other.tuples()
        return isinstance(other, list) and self.tuples() == other

    __hash__ = None  # mutable-looking arrays inside: never a dict key

    def __repr__(self) -> str:
        return f"PieceColumns({self.tuples()!r})"


def window_pieces(plan: BatchPlan, start: int, stop: int) -> list[Piece]:
    """The parts of the plan's ranges that fall into payload bytes [start, stop).

    Vectorized: two bisects and a few array operations, one list at the end.
    """
    range_start = plan.range_payload_offset.astype(np.int64)
    range_end = range_start + plan.range_length.astype(np.int64)
    first = int(np.searchsorted(range_end, start, side="right"))
    last = int(np.searchsorted(range_start, stop, side="left"))
    part_start, part_end = range_start[first:last], range_end[first:last]
    lo = np.maximum(part_start, start)
    hi = np.minimum(part_end, stop)
    keep = hi > lo
    file_offset = plan.range_file_offset[first:last].astype(np.int64) + (lo - part_start)
    return list(zip(plan.range_extent[first:last][keep].tolist(), file_offset[keep].tolist(),
                    (lo[keep] - start).tolist(), (hi - lo)[keep].tolist()))


_ZERO_OFFSET = np.zeros(1, dtype=np.int64)
_ZERO_OFFSET.flags.writeable = False


class RequestOrder:
    """The payload of samples (extent, offset, length) sent in the given order."""

    def __init__(self, extent: np.ndarray, offset: np.ndarray, length: np.ndarray):
        self.extent = extent.astype(np.int64)
        self.offset = offset.astype(np.int64)
        self.length = length.astype(np.int64)
        self.end = np.cumsum(self.length)
        self.begin = self.end - self.length
        self.payload_bytes = int(self.end[-1]) if self.end.size else 0

    def windows(self, window_bytes: int) -> list[tuple[int, int]]:
        """[start, stop) payload bounds of windows of at most `window_bytes`."""
        assert window_bytes > 0
        return [(a, min(a + window_bytes, self.payload_bytes))
                for a in range(0, self.payload_bytes, window_bytes)]

    def mapping_kind(self, start: int, stop: int) -> str | None:
        """What a send from mappings of the extents would carry in payload bytes
        [start, stop): "small" for at least `limits.mapped_pieces_min` samples averaging
        under `limits.sendfile_piece_bytes_min` (many reads, each small), "large" for
        that many averaging more (worth it only to a client on this host over TCP),
        None for fewer."""
        first = int(np.searchsorted(self.end, start, side="right"))
        last = int(np.searchsorted(self.begin, stop, side="left"))
        count = last - first
        if count < limits.mapped_pieces_min:
            return None
        return "small" if stop - start < count * limits.sendfile_piece_bytes_min else "large"

    def in_request_order(self, start: int, stop: int) -> PieceColumns:
        """The file pieces filling payload bytes [start, stop) in payload order, one per
        sample (cut at the window's ends), neither sorted nor joined: what a send
        from mappings of the extents takes, one iovec each."""
        if start == 0 and stop == self.payload_bytes:  # the whole reply in one window
            return PieceColumns(self.extent, self.offset, self.begin, self.length)
        return PieceColumns(*self._cut(start, stop))

    def in_request_order_by_window(self, window_bytes: int) -> PieceColumns:
        """The file pieces filling the whole payload in payload order, one per sample
        and window: a sample that crosses a multiple of `window_bytes` is cut there
        (empty samples are left out).  What one send from mappings of a reply of
        several windows takes, so that each window can start a frame.  A few array
        operations for the whole reply, not per window."""
        if not self.length.size:
            return PieceColumns(*(np.zeros(0, dtype=np.int64),) * 4)
        first_window = self.begin // window_bytes
        last_window = (self.end - 1) // window_bytes
        parts = np.where(self.length > 0, last_window - first_window + 1, 0)
        sample = np.repeat(np.arange(parts.size), parts)
        part_of_sample = np.arange(sample.size) - np.repeat(np.cumsum(parts) - parts, parts)
        window = first_window[sample] + part_of_sample
        begin = self.begin[sample]
        lo = np.maximum(begin, window * window_bytes)
        hi = np.minimum(self.end[sample], (window + 1) * window_bytes)
        return PieceColumns(self.extent[sample], self.offset[sample] + (lo - begin), lo, hi - lo)

    def _cut(self, start: int, stop: int) -> tuple[np.ndarray, ...]:
        """(extent, file offset, window offset, bytes) of the samples' parts within
        payload bytes [start, stop), in payload order."""
        first = int(np.searchsorted(self.end, start, side="right"))
        last = int(np.searchsorted(self.begin, stop, side="left"))
        begin, end = self.begin[first:last], self.end[first:last]
        lo = np.maximum(begin, start)
        hi = np.minimum(end, stop)
        keep = hi > lo
        return (self.extent[first:last][keep], (self.offset[first:last] + (lo - begin))[keep],
                (lo - start)[keep], (hi - lo)[keep])

    def pieces(self, start: int, stop: int) -> PieceColumns:
        """The file pieces filling payload bytes [start, stop), window offsets from `start`,
        sorted by extent and offset, adjacent ones joined."""
        if self.length.size == 1:  # one sample, as a mount asks for a file: no search or sort
            return PieceColumns(self.extent, self.offset + start, _ZERO_OFFSET,
                                np.array([stop - start], dtype=np.int64))
        extent, file_offset, window_offset, size = self._cut(start, stop)
        order = np.lexsort((file_offset, extent))
        extent, file_offset = extent[order], file_offset[order]
        window_offset, size = window_offset[order], size[order]
        if size.size > 1:
            joins = ((extent[1:] == extent[:-1])
                     & (file_offset[1:] == file_offset[:-1] + size[:-1])
                     & (window_offset[1:] == window_offset[:-1] + size[:-1]))
            if joins.any():
                starts = np.flatnonzero(np.concatenate(([True], ~joins)))
                size = np.add.reduceat(size, starts)
                extent, file_offset = extent[starts], file_offset[starts]
                window_offset = window_offset[starts]
        return PieceColumns(extent, file_offset, window_offset, size)


def plan_request(dataset: DatasetIndex, ids: Sequence[int] | None, paths: Sequence[str] | None,
                 batch_limits: BatchLimits, *,
                 coalesce_gap_bytes: int = limits.coalesce_gap_bytes_default
                 ) -> tuple[np.ndarray, BatchPlan]:
    """Validate a batch and plan its read.  Returns (ids, plan).

    O(k log k) for k samples (paths add a lookup each).  Raises
    InvalidArgument (bad id, both ids and paths, over `batch_limits`),
    NotFound (unknown path) and FailedPrecondition (a sample other members
    store).
    """
    id_count = 0 if ids is None else len(ids)
    path_count = 0 if paths is None else len(paths)
    if id_count and path_count:
        raise InvalidArgument("give either sample ids or paths, not both")
    count = id_count + path_count
    batch_limits.check_count(count)
    checked = dataset.ids_of(paths) if path_count else dataset.check_ids(ids if id_count else [])
    dataset.check_local(checked)
    plan = plan_batch(checked, dataset.extent, dataset.offset, dataset.length, dataset.crc,
                      coalesce_gap_bytes=coalesce_gap_bytes)
    batch_limits.check_payload(count, plan.payload_bytes)
    return checked, plan
