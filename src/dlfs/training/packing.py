"""A batch's samples back to back in one flat uint8 buffer: pack, stack, and `Packed`.

The helper process packs each batch into a ring slot (`pack_into`); the
training process sees it as a `Packed` and takes rows or per-sample slices
from it.  `stack_into` is the same copy for samples that must form one
``[batch, size]`` array (`dlfs.torch.stack_samples`).  Numpy only.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from dlfs.errors import InvalidArgument


def pack_into(samples: Sequence, out: np.ndarray) -> np.ndarray:
    """Copy samples back to back into the flat uint8 array `out`; returns their lengths.

    Raises InvalidArgument when they do not fit.  Cost: O(total bytes),
    copied by numpy without the GIL.
    """
    lengths = _lengths(samples)
    _copy_back_to_back(samples, out, int(lengths.sum()))
    return lengths


class Packed(NamedTuple):
    """One batch from the ring: `count` samples back to back in `data` (flat uint8).

    `size` is every sample's size when they share one, else -1 and
    `lengths` holds each one's.  `data` (and every view of it) keeps the
    batch's slot; see `BatchRing.next_batch`.
    """

    data: np.ndarray
    count: int
    size: int
    lengths: np.ndarray | None = None

    def rows(self) -> np.ndarray:
        """The batch as a ``[count, size]`` view; InvalidArgument when the sizes differ."""
        size = self.size if self.lengths is None else one_size(self.lengths)
        return self.data[:self.count * size].reshape(self.count, size)

    def sizes(self) -> np.ndarray:
        """Each sample's size (int64)."""
        if self.lengths is not None:
            return self.lengths
        return np.full(self.count, self.size, dtype=np.int64)


def stack_into(samples: Sequence, out: np.ndarray) -> np.ndarray:
    """Samples of one size copied into the flat uint8 `out`, as a ``[batch, size]`` view of it.

    Checks the sizes before copying (InvalidArgument, as `rows`).
    """
    size = one_size(_lengths(samples))
    _copy_back_to_back(samples, out, len(samples) * size)
    return out[:len(samples) * size].reshape(len(samples), size)


def _lengths(samples: Sequence) -> np.ndarray:
    return np.fromiter((len(sample) for sample in samples), dtype=np.int64, count=len(samples))


def _copy_back_to_back(samples: Sequence, out: np.ndarray, total: int) -> None:
    if total > len(out):
        raise InvalidArgument(f"a batch of {total} bytes does not fit its {len(out)}-byte buffer")
    if total:
        np.concatenate([np.frombuffer(sample, dtype=np.uint8) for sample in samples],
                       out=out[:total])


def one_size(lengths: np.ndarray) -> int:
    """The one size all of `lengths` share (0 for none); InvalidArgument naming the
    first sample of another size."""
    size = int(lengths[0]) if len(lengths) else 0
    other = np.flatnonzero(lengths != size)
    if len(other):
        raise InvalidArgument(
            f"a batch of raw samples is one [batch, size] array, so its samples need one "
            f"size: sample {int(other[0])} of the batch has {int(lengths[other[0]])} bytes, "
            f"sample 0 has {size}; give the dataset a transform (each sample transformed, "
            "then default_collate), or ask for a list of samples (ReadAhead(..., stack=False))")
    return size
