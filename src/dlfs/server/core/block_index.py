"""The block CRC32Cs of a sealed dataset's large samples, by sample id.

Part of `DatasetIndex` (directory.py).  Only samples longer than the block
size that are stored on this daemon have block CRCs (dlfs.formats.block_crcs); they
are kept sparse, so a dataset of small samples pays nothing: a sorted array
of those samples' ids, where each one's CRCs start in one flat array, and
the flat array itself, in the order the ingest wrote them.  Memory: 12 bytes
per large sample plus 4 per block (4 KiB per GiB).  Immutable.
"""

from __future__ import annotations

import numpy as np

from dlfs.formats import block_crcs
from dlfs.formats.disk_layout import NO_EXTENT
from dlfs.server.core.catalog_records import SampleBlock


class BlockIndex:
    """Block CRCs of `block`'s samples, addressed by sorted sample id.

    `perm[i]` is the arrival position (in `block`) of the sample with id i.
    `complete` is False for a dataset ingested before block CRCs: its
    large samples have none.  Build cost O(n) vectorized.
    """

    def __init__(self, block: SampleBlock, perm: np.ndarray):
        self.block_bytes = block.block_bytes
        self.complete = block.block_crc is not None
        self._crc = block.block_crc if self.complete else np.empty(0, np.uint32)
        counts = np.where(block.extent != NO_EXTENT,
                          block_crcs.block_counts(block.length, self.block_bytes), 0)
        if not self.complete or counts.sum() == 0:
            self._ids = np.empty(0, np.uint32)
            self._first = np.empty(0, np.uint64)
        else:
            starts = np.cumsum(counts) - counts  # arrival order
            by_id = counts[perm]
            self._ids = np.flatnonzero(by_id).astype(np.uint32)
            self._first = starts[perm][self._ids].astype(np.uint64)
        if self._crc.size != int(counts.sum()) and self.complete:
            raise ValueError(f"{self._crc.size} block CRCs for samples that need "
                             f"{int(counts.sum())}")
        for array in (self._crc, self._ids, self._first):
            array.flags.writeable = False

    @classmethod
    def from_columns(cls, block_bytes: int, complete: bool, crc: np.ndarray, ids: np.ndarray,
                     first: np.ndarray) -> "BlockIndex":
        """An index over arrays another one gave (`columns`), e.g. views of a shared
        mapping (shared_index.py): nothing is computed or copied.  O(1)."""
        index = cls.__new__(cls)
        index.block_bytes, index.complete = block_bytes, complete
        index._crc, index._ids, index._first = crc, ids, first
        return index

    def columns(self) -> dict[str, np.ndarray]:
        """The index's arrays by name (what `from_columns` takes back): the flat block
        CRCs (uint32), the ids of the samples that have them (uint32, sorted) and where
        each one's CRCs start (uint64)."""
        return {"block_crc": self._crc, "block_ids": self._ids, "block_first": self._first}

    def crcs(self, sample_id: int, length: int, crc: int) -> np.ndarray | None:
        """The CRC32C of each block of sample `sample_id` (`length` bytes, whole-sample
        CRC `crc`): [crc] when it is one block, None when its blocks have no CRCs
        (ingested before block CRCs, or stored on another daemon).  O(log large
        samples); the result is a read-only view."""
        if length <= self.block_bytes:
            return np.array([crc], np.uint32)
        position = int(np.searchsorted(self._ids, sample_id))
        if position == self._ids.size or int(self._ids[position]) != sample_id:
            return None
        first = int(self._first[position])
        return self._crc[first:first + block_crcs.block_count(length, self.block_bytes)]

    @property
    def nbytes(self) -> int:
        return self._crc.nbytes + self._ids.nbytes + self._first.nbytes

    def check_invariants(self, length: np.ndarray, extent: np.ndarray) -> None:
        """Assert every stored large sample has its CRCs (when complete).  O(n); tests."""
        if not self.complete:
            return
        large = np.flatnonzero((length > self.block_bytes) & (extent != NO_EXTENT))
        assert np.array_equal(large.astype(np.uint32), self._ids)
        counts = block_crcs.block_counts(length[large], self.block_bytes)
        assert int(counts.sum()) == self._crc.size
