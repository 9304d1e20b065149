"""Shuffle-and-shard: DistributedSampler's convention, exactly; coverage per epoch across ranks."""

from __future__ import annotations

import collections
import itertools

import pytest

from dlfs.errors import InvalidArgument
from dlfs.training.shard_order import ShuffleShard, numpy_permutation, shard, shard_length

SIZES = (0, 1, 2, 5, 7, 36, 37, 100)


def all_ranks(n, world_size, drop_last, epoch=0, seed=0, shuffle=True, permute=numpy_permutation):
    shards = []
    for rank in range(world_size):
        s = ShuffleShard(n, seed=seed, rank=rank, world_size=world_size, drop_last=drop_last,
                         shuffle=shuffle, permute=permute)
        s.set_epoch(epoch)
        shards.append(list(s))
        assert len(shards[-1]) == len(s)
    return shards


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("world_size", (1, 2, 3, 4))
def test_every_sample_once_per_epoch_across_ranks(n, world_size):
    for epoch in (0, 1):
        # drop_last: every sample at most once, and only the tail beyond a multiple is left out.
        seen = [i for part in all_ranks(n, world_size, True, epoch) for i in part]
        assert len(seen) == len(set(seen)) == (n // world_size) * world_size
        # Padding: every sample at least once; the extras repeat the head of the order.
        shards = all_ranks(n, world_size, False, epoch)
        seen = [i for part in shards for i in part]
        counts = collections.Counter(seen)
        assert set(counts) == set(range(n))
        assert len(seen) == (-(-n // world_size) * world_size if n else 0)
        if n >= world_size:
            assert max(counts.values(), default=1) <= 2
            assert sum(c - 1 for c in counts.values()) == len(seen) - n
        if n % world_size == 0:
            assert all(c == 1 for c in counts.values())


def test_same_seed_and_epoch_same_order_other_epoch_or_seed_differs():
    a = all_ranks(1000, 3, False, epoch=4, seed=7)
    assert a == all_ranks(1000, 3, False, epoch=4, seed=7)
    assert a != all_ranks(1000, 3, False, epoch=5, seed=7)
    assert a != all_ranks(1000, 3, False, epoch=4, seed=8)


def test_order_of_any_epoch_without_changing_the_current_one():
    s = ShuffleShard(50, seed=3, rank=1, world_size=2)
    s.set_epoch(2)
    ahead = s.indices(epoch=3)
    assert s.epoch == 2 and list(s) == s.indices(2) != ahead
    s.set_epoch(3)
    assert list(s) == ahead


def test_no_shuffle_is_identity_order():
    assert all_ranks(7, 2, False, shuffle=False) == [[0, 2, 4, 6], [1, 3, 5, 0]]
    assert all_ranks(7, 2, True, shuffle=False) == [[0, 2, 4], [1, 3, 5]]


def test_shard_lengths_match_the_rule():
    for n, w in itertools.product(range(0, 12), range(1, 5)):
        assert shard_length(n, w, False) == -(-n // w)
        assert shard_length(n, w, True) == (n // w if n % w else n // w)


@pytest.mark.parametrize("kwargs", [
    {"n": -1}, {"n": 10, "world_size": 0}, {"n": 10, "rank": 2, "world_size": 2},
    {"n": 10, "rank": -1}, {"n": 10, "seed": "x"}, {"n": 2.5},
])
def test_bad_arguments_are_refused(kwargs):
    n = kwargs.pop("n")
    with pytest.raises(InvalidArgument):
        ShuffleShard(n, **kwargs)


def test_bad_epoch_and_bad_permute_are_refused():
    s = ShuffleShard(10)
    with pytest.raises(InvalidArgument):
        s.set_epoch(-1)
    broken = ShuffleShard(10, permute=lambda n, seed: list(range(n - 1)))
    with pytest.raises(InvalidArgument, match="returned 9 indices"):
        list(broken)
    with pytest.raises(InvalidArgument):
        shard([1, 2, 3], rank=3, world_size=3, drop_last=False)
