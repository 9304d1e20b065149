"""The data path's checks of a reply as it arrives: each sample against its CRC32C.

`ReplyChecker` verifies every sample (or, for a range, every block) once
the payload bytes received cover it, while the rest of the reply is still
on its way; the first mismatch is kept and raised after the whole reply
arrived, so the connection stays usable.
"""

from __future__ import annotations

import bisect

import numpy as np

from dlfs.client.transport.checksum_errors import block_prefix, checksum_mismatch, renamable
from dlfs.errors import DataCorruption
from dlfs.formats import block_crcs


class ReplyChecker:
    """Verifies each item's CRC32C once the payload bytes received cover it.

    Items are whole samples (`ids` one per item), or with `first_byte` the
    blocks of one sample whose payload starts at that byte of it.  The
    first mismatch is kept in `failure`.  O(items) in all, no Python loop
    per item (`block_crcs.first_bad_piece` checks runs of them).
    """

    def __init__(self, samples: list[memoryview], ends: list[int], crcs: np.ndarray,
                 ids: np.ndarray, dataset: str, label: str, first_byte: int | None = None):
        self.first_byte = first_byte
        self.samples = samples
        self.ends = ends
        self.crcs = crcs.tolist()
        self.ids = ids
        self.dataset = dataset
        self.label = label
        self.next = 0
        self.failure: DataCorruption | None = None

    def check_until(self, received: int) -> None:
        """Check the items that the first `received` payload bytes complete."""
        i = self.next
        j = bisect.bisect_right(self.ends, received, i)
        if j == i:
            return
        expected = self.crcs[i:j]
        bad = block_crcs.first_bad_piece(self.samples[i:j], expected)
        if bad is not None and self.failure is None:
            k, got = bad
            self.failure = self._mismatch(i + k, expected[k], got)
        self.next = j

    def _mismatch(self, i: int, expected: int, got: int) -> DataCorruption:
        block = None
        if self.first_byte is not None:
            hi = self.first_byte + self.ends[i]
            block = (hi - len(self.samples[i]), hi)
        return sample_mismatch(int(self.ids[i]), self.dataset, self.label, expected, got,
                               block)


def sample_mismatch(sample_id: int, dataset: str, label: str, expected: int, got: int,
                    block: tuple[int, int] | None = None) -> DataCorruption:
    """The error for a sample (or its `block`, a byte range) received from `label` whose
    CRC32C is `got` where the reply said `expected`."""
    error = checksum_mismatch(block_prefix(block) + f"sample {sample_id} of dataset "
                              f"{dataset!r}", label, expected, got)
    # What a transport needs to name the sample's path (`named_checksum_error`).
    return renamable(error, sample_id, block,
                     lambda what: checksum_mismatch(what, label, expected, got))
