"""ShuffleShardSampler yields exactly what torch.utils.data.DistributedSampler yields."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DistributedSampler  # noqa: E402

from dlfs.errors import InvalidArgument  # noqa: E402
from dlfs.training.shard_order import ShuffleShard, shard  # noqa: E402
from dlfs.torch import ShuffleShardSampler  # noqa: E402

SIZES = (1, 2, 5, 7, 36, 37, 100)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("world_size", (1, 2, 3, 4))
@pytest.mark.parametrize("drop_last", (False, True))
def test_identical_index_lists_to_distributed_sampler(n, world_size, drop_last):
    data = list(range(n))
    for shuffle, seed, epoch in ((True, 0, 0), (True, 0, 1), (True, 11, 3), (False, 0, 2)):
        for rank in range(world_size):
            theirs = DistributedSampler(data, num_replicas=world_size, rank=rank,
                                        shuffle=shuffle, seed=seed, drop_last=drop_last)
            ours = ShuffleShardSampler(n, seed=seed, rank=rank, world_size=world_size,
                                       drop_last=drop_last, shuffle=shuffle)
            theirs.set_epoch(epoch)
            ours.set_epoch(epoch)
            assert list(ours) == list(theirs), (n, world_size, rank, shuffle, seed, epoch)
            assert len(ours) == len(theirs)


def test_torch_free_shard_agrees_with_distributed_sampler_given_the_same_permutation():
    from dlfs.torch import torch_permutation

    for n, world_size in ((37, 3), (5, 4), (2, 3)):
        for rank in range(world_size):
            theirs = DistributedSampler(list(range(n)), num_replicas=world_size, rank=rank,
                                        seed=5, drop_last=False)
            theirs.set_epoch(2)
            assert shard(torch_permutation(n, 5 + 2), rank, world_size, False) == list(theirs)


def test_numpy_generator_gives_the_torch_free_order():
    ours = ShuffleShardSampler(40, seed=2, rank=1, world_size=2, generator="numpy")
    ours.set_epoch(1)
    free = ShuffleShard(40, seed=2, rank=1, world_size=2)
    free.set_epoch(1)
    assert list(ours) == list(free)


def test_rank_and_world_size_come_from_torch_distributed(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0,
                            world_size=1)
    try:
        s = ShuffleShardSampler(10, seed=1)
        assert (s.rank, s.num_replicas) == (0, 1)
        with pytest.raises(InvalidArgument):
            ShuffleShardSampler(10, rank=1)  # world size 1 from the process group
    finally:
        dist.destroy_process_group()
    assert (ShuffleShardSampler(10, rank=2, world_size=3).rank) == 2
