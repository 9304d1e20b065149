"""Byte ranges of one sample, planned so that every byte sent can be verified.

A range that covers a whole sample is read as that sample, checked by its
CRC32C.  A part of a sample is widened to whole blocks (dlfs.formats.block_crcs):
the plan reads the blocks as items of their own, each with its block CRC,
so the read engine's verifier checks each block, and `trim` cuts the asked
part out of the verified windows.  A sample without block CRCs (ingested
before them) is read as asked and cannot be checked (`checkable` False).

Both read paths use it: gRPC ReadRange (the daemon verifies) and the data
path's READ_RANGE with the blocks flag (the client verifies; see
`dlfs/proto/datapath.md`).  Nothing here reads a file or imports grpc.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

import numpy as np

from dlfs.formats import block_crcs
from dlfs.server.core.directory import DatasetIndex
from dlfs.batch_limits import BatchLimits
from dlfs.server.read.batch_planning import BatchPlan, plan_batch


@dataclasses.dataclass
class RangeRead:
    """How to read bytes [start, start + length) of sample `sample_id`.

    The plan's payload is bytes [first, first + plan.payload_bytes) of the
    sample; the asked bytes are the `length` bytes after the first `skip`.
    Its items are the blocks (`blocks`), or one item: the whole sample or
    the range.  `crcs` has the items' CRC32Cs when `checkable`.
    """

    sample_id: int
    plan: BatchPlan
    first: int
    skip: int
    length: int
    checkable: bool
    blocks: bool
    lengths: np.ndarray  # uint64 per item
    crcs: np.ndarray  # uint32 per item (zeros when not checkable)

    @property
    def whole(self) -> bool:
        """The range is the whole sample, read as one item."""
        return self.checkable and not self.blocks


def plan_range(dataset: DatasetIndex, sample_id: int, offset: int, length: int,
               batch_limits: BatchLimits, *, blocks: bool = True) -> RangeRead:
    """Plan `length` bytes (0: to the end) at `offset` of one sample, clipped to it.

    With `blocks` (default), a part of a sample with block CRCs is widened
    to whole blocks.  O(blocks).  Raises InvalidArgument (bad id, a range
    over `batch_limits`), FailedPrecondition (stored by other members).
    """
    dataset.check_local(dataset.check_ids([sample_id]))
    size = int(dataset.length[sample_id])
    start = min(offset, size)
    stop = size if length == 0 else min(size, start + length)
    batch_limits.check_range(stop - start)
    extent, base = int(dataset.extent[sample_id]), int(dataset.offset[sample_id])
    if start == 0 and stop == size:
        lengths = np.array([size], np.uint64)
        crcs = dataset.crc[sample_id:sample_id + 1].astype(np.uint32)
        return RangeRead(sample_id, _plan(extent, base, lengths, crcs, [sample_id]), 0, 0,
                         size, True, False, lengths, crcs)
    crcs = dataset.block_crcs(sample_id) if blocks and start < stop else None
    if crcs is None:  # an empty range, or no block CRCs: read as asked, unchecked
        lengths = np.array([stop - start], np.uint64)
        crcs = np.zeros(1, np.uint32)
        return RangeRead(sample_id, _plan(extent, base + start, lengths, crcs, [sample_id]),
                         start, 0, stop - start, False, False, lengths, crcs)
    block_bytes = dataset.blocks.block_bytes
    first, last = block_crcs.widen(start, stop, size, block_bytes)
    k0 = first // block_bytes
    lengths = block_crcs.block_lengths(first, last, block_bytes)
    crcs = np.asarray(crcs[k0:k0 + lengths.size], np.uint32)
    numbers = list(range(k0, k0 + lengths.size))
    return RangeRead(sample_id, _plan(extent, base + first, lengths, crcs, numbers), first,
                     start - first, stop - start, True, True, lengths, crcs)


def _plan(extent: int, offset: int, lengths: np.ndarray, crcs: np.ndarray,
          names: list[int]) -> BatchPlan:
    """A plan reading consecutive items of one extent from `offset`; its sample ids are
    `names` (the sample id, or block numbers for describing a failure)."""
    n = lengths.size
    starts = offset + np.concatenate(([0], np.cumsum(lengths[:-1], dtype=np.int64)))
    plan = plan_batch(np.arange(n, dtype=np.int64), np.full(n, extent, np.uint32),
                      starts.astype(np.uint64), lengths.astype(np.uint64), crcs)
    plan.sample_ids = np.asarray(names, np.int64)
    return plan


def describe(dataset: DatasetIndex, read: RangeRead) -> Callable[[int], str]:
    """How a verification failure names an item of `read`: the sample, or its block."""
    if not read.blocks:
        return dataset.describe
    block_bytes = dataset.blocks.block_bytes
    size = int(dataset.length[read.sample_id])

    def block(number: int) -> str:
        lo = number * block_bytes
        return (f"block {number} (bytes {lo}..{min(lo + block_bytes, size)}) of "
                f"{dataset.describe(read.sample_id)}")

    return block


def window_bytes(read: RangeRead, chunk_bytes: int, block_bytes: int) -> int:
    """Window size for reading `read`: whole blocks per window when it is read in blocks,
    so each window is verified before any of it is sent."""
    if not read.blocks:
        return chunk_bytes
    return max(block_bytes, chunk_bytes - chunk_bytes % block_bytes)


def trim(windows, skip: int, length: int) -> Iterator[tuple[int, memoryview]]:
    """The asked bytes of a range's payload windows: (offset from the range's start,
    bytes) for each window that holds any of payload bytes [skip, skip + length)."""
    end = skip + length
    for start, window in windows:
        lo, hi = max(start, skip), min(start + len(window), end)
        if hi > lo:
            yield lo - skip, window[lo - start:hi - start]
