"""Shuffle-and-shard: which sample ids one rank reads in one epoch.  No torch needed.

The convention is exactly that of `torch.utils.data.DistributedSampler`, so
a job can switch between the two without changing which rank sees what:

1. a permutation of ``range(n)`` drawn from a generator seeded with
   ``seed + epoch`` (identity when ``shuffle=False``);
2. ``drop_last=False``: the permutation is padded to a multiple of
   ``world_size`` by repeating its head (every sample is read at least once,
   a few twice);  ``drop_last=True``: its tail is cut to a multiple of
   ``world_size`` (every sample at most once, a few not at all);
3. rank ``r`` takes ``indices[r:total:world_size]``.

The permutation itself comes from a *permute* function ``(n, seed) -> ints``.
The default, `numpy_permutation`, needs only numpy; `dlfs.torch` plugs in
``torch.randperm`` on a ``torch.Generator`` so its sampler yields the very
lists DistributedSampler yields.  Both are deterministic in (seed, epoch), so
every rank (and a clairvoyant prefetcher) can compute the whole epoch's order
without talking to anyone.
"""

from __future__ import annotations

import math
from typing import Callable, Iterator, Sequence

import numpy as np

from dlfs import limits
from dlfs.training.checks import check_int
from dlfs.errors import InvalidArgument

Permute = Callable[[int, int], Sequence[int]]


def numpy_permutation(n: int, seed: int) -> np.ndarray:
    """A permutation of ``range(n)`` from ``numpy.random.default_rng(seed)``.

    Cost: O(n) time and 8n bytes.  Not the same order as ``torch.randperm``.
    A negative seed is taken modulo 2**64 (numpy accepts only non-negative seeds).
    """
    return np.random.default_rng(seed % (1 << 64)).permutation(n)


def shard(indices: Sequence[int], rank: int, world_size: int, drop_last: bool) -> list[int]:
    """Rank `rank`'s share of the epoch order `indices` (DistributedSampler's rule).

    Pads by repeating the head (``drop_last=False``) or cuts the tail
    (``drop_last=True``) to a multiple of `world_size`, then strides.
    Every rank gets `shard_length` samples.  Cost: O(len(indices)).
    Raises InvalidArgument for a bad rank or world size.
    """
    _check_ranks(rank, world_size)
    indices = list(indices)
    n = len(indices)
    per_rank = shard_length(n, world_size, drop_last)
    total = per_rank * world_size
    if not drop_last:
        padding = total - n
        if padding <= n:
            indices += indices[:padding]
        else:  # fewer samples than ranks: repeat the whole order
            indices += (indices * math.ceil(padding / n))[:padding]
    else:
        indices = indices[:total]
    assert len(indices) == total
    mine = indices[rank:total:world_size]
    assert len(mine) == per_rank
    return mine


def shard_length(n: int, world_size: int, drop_last: bool) -> int:
    """Samples per rank per epoch for `n` samples over `world_size` ranks."""
    if drop_last and n % world_size != 0:
        return math.ceil((n - world_size) / world_size)
    return math.ceil(n / world_size)


class ShuffleShard:
    """The per-epoch sample order of one rank.  Torch-free; iterable like a Sampler.

    ``ShuffleShard(n, seed=0, rank=0, world_size=1, drop_last=False)`` then
    ``set_epoch(e)`` before each epoch; ``iter(s)`` / ``s.indices()`` give
    this rank's ids for the current epoch, ``s.indices(epoch=e)`` those of
    any epoch (for looking ahead).  ``len(s)`` is the per-rank count.

    Cost: each `indices` call draws a fresh permutation: O(n) time and
    memory.  Raises InvalidArgument for bad sizes, ranks or epochs.
    """

    def __init__(self, n: int, *, seed: int = 0, rank: int = 0, world_size: int = 1,
                 drop_last: bool = False, shuffle: bool = True,
                 permute: Permute = numpy_permutation):
        n = check_int("sample count", n, 0, limits.shuffle_samples_max)
        if not isinstance(seed, (int, np.integer)):
            raise InvalidArgument(f"seed must be an integer, not {seed!r}")
        _check_ranks(rank, world_size)
        self.n = n
        self.seed = int(seed)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.drop_last = bool(drop_last)
        self.shuffle = bool(shuffle)
        self.permute = permute
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order `__iter__` yields (a fresh permutation per epoch)."""
        self.epoch = _check_epoch(epoch)

    def __len__(self) -> int:
        return shard_length(self.n, self.world_size, self.drop_last)

    def order(self, epoch: int | None = None) -> list[int]:
        """The global order of `epoch` (default: the current one), before sharding."""
        epoch = self.epoch if epoch is None else _check_epoch(epoch)
        if not self.shuffle:
            return list(range(self.n))
        order = self.permute(self.n, self.seed + epoch)
        order = order.tolist() if isinstance(order, np.ndarray) else list(order)
        if len(order) != self.n:
            raise InvalidArgument(f"the permute function returned {len(order)} indices for "
                                  f"{self.n} samples")
        return order

    def indices(self, epoch: int | None = None) -> list[int]:
        """This rank's sample ids in `epoch` (default: the current one), in reading order."""
        if self.n == 0:
            return []
        return shard(self.order(epoch), self.rank, self.world_size, self.drop_last)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices())

    def __repr__(self) -> str:
        return (f"ShuffleShard(n={self.n}, seed={self.seed}, rank={self.rank}, "
                f"world_size={self.world_size}, drop_last={self.drop_last}, epoch={self.epoch})")


def _check_ranks(rank, world_size) -> None:
    world_size = check_int("world size", world_size, 1, limits.world_size_max)
    check_int(f"rank (of world size {world_size})", rank, 0, world_size - 1)


def _check_epoch(epoch) -> int:
    if not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise InvalidArgument(f"epoch {epoch!r} must be a non-negative integer")
    return int(epoch)
