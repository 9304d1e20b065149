"""Samplers for a DataLoader: DistributedSampler's order (`ShuffleShardSampler`), and hints (`PrefetchHints`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from dlfs import limits
from dlfs.training.checks import check_int
from dlfs.errors import InvalidArgument
from dlfs.training.pipeline import HintSender, PipelineStats
from dlfs.training.shard_order import ShuffleShard, numpy_permutation

if TYPE_CHECKING:
    from dlfs.torch.torch_dataset import DLFSDataset


def torch_permutation(n: int, seed: int) -> list[int]:
    """``torch.randperm(n)`` on a ``torch.Generator`` seeded with `seed` (DistributedSampler's)."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    return torch.randperm(n, generator=generator).tolist()


class ShuffleShardSampler(Sampler[int]):
    """A fresh global permutation per epoch, split across ranks like DistributedSampler.

    ``ShuffleShardSampler(len(ds), seed=0, rank=None, world_size=None, drop_last=False)``;
    call ``set_epoch(e)`` before each epoch.  `rank`/`world_size` default
    to those of an initialised ``torch.distributed`` process group, else
    0 and 1.  ``generator="torch"`` (default) draws ``torch.randperm`` on a
    generator seeded with ``seed + epoch``, so the index lists equal
    DistributedSampler's for the same arguments; ``generator="numpy"``
    draws the order of the torch-free `dlfs.training.shard_order.ShuffleShard` (for
    tools that must compute the order without torch).

    `indices(epoch)` gives any epoch's list without changing the current
    epoch, which is what clairvoyant prefetch needs.  Cost per epoch:
    O(n) time and memory.  Raises InvalidArgument for bad arguments.

    Resuming mid-epoch: `state_dict` / `load_state_dict` (torchdata's
    ``Stateful`` protocol, so a ``StatefulDataLoader`` saves and restores
    it, with or without workers); with a plain DataLoader, which runs the
    sampler ahead of the loop, save ``state_dict(consumed=batches * B)``.
    ``elastic=True`` keeps one state for the whole job that resumes at any
    world size (`dlfs.training.shard_order`).
    """

    def __init__(self, data_source_or_len, *, seed: int = 0, rank: int | None = None,
                 world_size: int | None = None, drop_last: bool = False, shuffle: bool = True,
                 generator: str = "torch", elastic: bool = False):
        n = data_source_or_len if isinstance(data_source_or_len, (int, np.integer)) \
            else len(data_source_or_len)
        if rank is None or world_size is None:
            dist_rank, dist_world = _distributed_rank()
            rank = dist_rank if rank is None else rank
            world_size = dist_world if world_size is None else world_size
        if generator not in ("torch", "numpy"):
            raise InvalidArgument(f"generator must be 'torch' or 'numpy', not {generator!r}")
        permute = torch_permutation if generator == "torch" else numpy_permutation
        self._shard = ShuffleShard(n, seed=seed, rank=rank, world_size=world_size,
                                   drop_last=drop_last, shuffle=shuffle, permute=permute,
                                   elastic=elastic)

    num_replicas = property(lambda self: self._shard.world_size)
    rank = property(lambda self: self._shard.rank)
    seed = property(lambda self: self._shard.seed)
    epoch = property(lambda self: self._shard.epoch)
    drop_last = property(lambda self: self._shard.drop_last)
    elastic = property(lambda self: self._shard.elastic)

    def set_epoch(self, epoch: int) -> None:
        self._shard.set_epoch(epoch)

    def indices(self, epoch: int | None = None) -> list[int]:
        """This rank's indices of `epoch` (default: the current one)."""
        return self._shard.indices(epoch)

    def __iter__(self) -> Iterator[int]:
        """This rank's indices of the current epoch, from where a loaded state left off."""
        return iter(self._shard)

    def __len__(self) -> int:
        """This rank's samples in a whole epoch (an iteration resumed mid-epoch yields fewer)."""
        return len(self._shard)

    def state_dict(self, consumed: int | None = None) -> dict:
        """How far the current epoch has got (`dlfs.training.shard_order.ShuffleShard.state_dict`)."""
        return self._shard.state_dict(consumed)

    def load_state_dict(self, state: dict) -> None:
        """Resume the state's epoch where it left off (`ShuffleShard.load_state_dict`)."""
        self._shard.load_state_dict(state)

    def __repr__(self) -> str:
        return repr(self._shard).replace("ShuffleShard", "ShuffleShardSampler", 1)


class PrefetchHints(Sampler[int]):
    """Clairvoyant prefetch for a DataLoader: a sampler that hints the daemon ahead of use.

    ``DataLoader(ds, sampler=PrefetchHints(sampler, ds, ahead=8 * batch, chunk=batch))``
    yields what `sampler` yields.  Before it hands out position ``i`` it
    makes sure items ``[i, i + ahead)`` of the epoch's order have been
    queued as hints (`DLFSDataset.hint`, one Prefetch RPC per `chunk`
    items), which a `dlfs.training.pipeline.HintSender` thread of the main process
    sends, so the DataLoader never waits for a hint's round trip.  Choose
    `ahead` beyond what the loader already has in flight
    (``num_workers * prefetch_factor`` batches) so the daemon reads ahead of
    the workers' requests.

    Opt-in by design: it tells the storage the future access order, which
    benchmark rules such as MLPerf Storage forbid.  `stats` counts the hints
    of the last epoch (``hints_sent``, ``hints_dropped``).  Cost: the epoch's
    order is materialised once per epoch (O(n)); the hint thread lives while
    an epoch is being iterated.

    Stateful when `sampler` is (``state_dict(consumed=)`` and
    `load_state_dict`, as `ShuffleShardSampler`): its state is the
    sampler's after the items it has handed out, since it draws the
    sampler's whole order at once.
    """

    def __init__(self, sampler: Sampler, dataset: DLFSDataset, *, ahead: int, chunk: int = 256):
        # The bound on `ahead` is the longest epoch a ShuffleShardSampler has: looking
        # further ahead than a whole epoch hints nothing more.
        self.ahead = check_int("ahead", ahead, 1, limits.shuffle_samples_max)
        self.chunk = check_int("chunk", chunk, 1, limits.pipeline_hint_ids_max)
        self.sampler = sampler
        self.dataset = dataset
        self.stats = PipelineStats()
        self._handed_out = 0

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def state_dict(self) -> dict:
        """The sampler's state after the items handed out by the current iteration."""
        return self.sampler.state_dict(consumed=self._handed_out)

    def load_state_dict(self, state: dict) -> None:
        """Resume where `state` (from `state_dict`) left off: the sampler's own load."""
        self.sampler.load_state_dict(state)

    def __iter__(self) -> Iterator[int]:
        order = list(iter(self.sampler))
        self._handed_out = 0
        return self._hinted(order)

    def _hinted(self, order: list[int]) -> Iterator[int]:
        self.stats = PipelineStats()
        # A thread of its own: it may wait for each answer, so that the counts are exact.
        sender = HintSender(lambda ids: self.dataset.hint(ids, wait=True), name="dlfs-torch-hints",
                            stats=self.stats)
        try:
            hinted = 0
            for position, index in enumerate(order):
                want = min(position + self.ahead, len(order))
                if want - hinted >= self.chunk or (want == len(order) and hinted < want):
                    while hinted < want:
                        end = min(hinted + self.chunk, want)
                        sender.submit(order[hinted:end])
                        hinted = end
                self._handed_out += 1
                yield index
        finally:
            sender.close()


def _distributed_rank() -> tuple[int, int]:
    """(rank, world size) of the initialised default process group, else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
