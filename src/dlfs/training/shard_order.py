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

Resuming mid-epoch: `ShuffleShard.state_dict()` says how far the current
epoch has got, `load_state_dict` makes the next iteration of that epoch
start there (the `Stateful` protocol of torchdata's StatefulDataLoader).
Two kinds of state:

- default: per rank ("rank 3 of 8 has read 1,024 of its samples"); it
  resumes only at the same rank and world size, as DistributedSampler's
  order is defined for one world size;
- ``elastic=True``: per epoch ("the first 8,192 samples of the epoch's
  global order are done").  The global order is the permutation of
  (seed, epoch) alone; rank ``r`` of ``W`` takes, from the first sample not
  done, every W-th one (with no resume the very lists of the default rule).
  Ranks of a DDP job move in lockstep, so after k samples per rank the
  first ``k * W`` of the order are done, whatever W was: every rank saves
  the same state, and it resumes at any world size, continuing the same
  epoch with no sample repeated or skipped, each rank getting the same
  number of samples (padding or cut at the epoch's end as above, for the
  world size that finishes the epoch).
"""

from __future__ import annotations

import dataclasses
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


STATE_FORMAT = "dlfs.shuffle_shard"
STATE_VERSION = 1


def elastic_shard(order: Sequence[int], done: int, rank: int, world_size: int,
                  drop_last: bool) -> list[int]:
    """Rank `rank`'s share of the epoch order `order` once its first `done` samples are done.

    The rest of the order, ``order[done:]``, is cut to a multiple of
    `world_size` (``drop_last``) or padded to one with samples from the
    head of `order` (as `shard` pads), and rank ``r`` takes every
    `world_size`-th sample from ``done + r``.  With ``done=0`` this is
    `shard`'s list.  Every rank gets `elastic_length` samples.  Cost:
    O(len(order) / world_size).  Raises InvalidArgument for a bad rank,
    world size or `done`.
    """
    _check_ranks(rank, world_size)
    n = len(order)
    check_int("samples done", done, 0, n)
    per_rank = elastic_length(n, done, world_size, drop_last)
    mine = []
    for position in range(done + rank, done + per_rank * world_size, world_size):
        mine.append(order[position] if position < n else order[(position - n) % n])
    return mine


def elastic_length(n: int, done: int, world_size: int, drop_last: bool) -> int:
    """Samples per rank for the `n - done` samples left of an epoch, over `world_size` ranks."""
    left = n - done
    return left // world_size if drop_last else -(-left // world_size)


@dataclasses.dataclass
class _Pass:
    """One iteration over an epoch: where it started and how many samples it has yielded."""

    epoch: int
    start: int  # default: this rank's samples skipped; elastic: the epoch's samples done
    world_size: int
    length: int  # samples this iteration yields in all
    yielded: int = 0


class ShuffleShard:
    """The per-epoch sample order of one rank.  Torch-free; iterable like a Sampler.

    ``ShuffleShard(n, seed=0, rank=0, world_size=1, drop_last=False, elastic=False)``
    then ``set_epoch(e)`` before each epoch; ``iter(s)`` gives this rank's
    ids for the current epoch (from where a loaded state left off, see
    `load_state_dict`), ``s.indices(epoch=e)`` the whole list of any epoch
    (for looking ahead).  ``len(s)`` is the per-rank count of a whole epoch.
    `elastic` picks the kind of state (module doc); the orders are the same.

    Cost: each `indices` call or iteration draws a fresh permutation: O(n)
    time and memory.  Raises InvalidArgument for bad sizes, ranks, epochs
    or states.
    """

    def __init__(self, n: int, *, seed: int = 0, rank: int = 0, world_size: int = 1,
                 drop_last: bool = False, shuffle: bool = True,
                 permute: Permute = numpy_permutation, elastic: bool = False):
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
        self.elastic = bool(elastic)
        self.epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, start) of a loaded state
        self._pass: _Pass | None = None

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
        """This rank's ids of the current epoch, from where a loaded state of it left off.

        The position is taken when `iter` is called (not at the first
        `next`), so a `state_dict` right after it is already the resumed one.
        """
        start = 0
        if self._resume is not None:
            epoch, resumed = self._resume
            self._resume = None
            if epoch == self.epoch:
                start = resumed
        if self.elastic:
            mine = self._elastic_indices(start)
        else:
            mine = self.indices()[start:] if start < len(self) else []
        self._pass = _Pass(self.epoch, start, self.world_size, len(mine))
        return self._yield(self._pass, mine)

    @staticmethod
    def _yield(current: _Pass, mine: list[int]) -> Iterator[int]:
        for index in mine:
            current.yielded += 1
            yield index

    def _elastic_indices(self, done: int) -> list[int]:
        if self.n == 0 or done >= self.n:
            return []
        return elastic_shard(self.order(), done, self.rank, self.world_size, self.drop_last)

    # --- resuming -------------------------------------------------------------------

    def state_dict(self, consumed: int | None = None) -> dict:
        """How far the current epoch has got, as a plain dict (picklable, JSON-able).

        `consumed`: samples of the current iteration that are done (default:
        as many as it has yielded).  Pass it when the iteration runs ahead
        of the training loop, as a DataLoader's prefetch does: a loop that
        has trained on ``i`` batches of ``B`` passes ``i * B`` (counted
        from this iteration's start, also after a resume).  A sampler never
        iterated in its current epoch reports the epoch's start, or the
        state loaded for it.  Raises InvalidArgument for a `consumed`
        beyond the iteration's length.  Cost: O(1).
        """
        state = {"format": STATE_FORMAT, "version": STATE_VERSION, "n": self.n,
                 "seed": self.seed, "shuffle": self.shuffle, "drop_last": self.drop_last,
                 "permutation": _permute_name(self.permute), "elastic": self.elastic,
                 "epoch": self.epoch, "world_size": self.world_size}
        current = self._pass
        if self._resume is not None and self._resume[0] == self.epoch:
            start, done, length = self._resume[1], 0, None
        elif current is None or current.epoch != self.epoch:
            start, done, length = 0, 0, None
        else:
            start, length = current.start, current.length
            done = current.yielded if consumed is None else \
                check_int("consumed", consumed, 0, current.length)
        if self.elastic:
            # An iteration that is through has done the whole epoch, its cut tail included.
            state["samples_done"] = self.n if length is not None and done == length else \
                min(self.n, start + done * (current.world_size if length is not None else 0))
        else:
            state["rank"] = self.rank
            state["position"] = start + done
        return state

    def load_state_dict(self, state: dict) -> None:
        """Make the next iteration of the state's epoch start where the state left off.

        A state saved mid-epoch also selects its epoch (so loading it after
        ``set_epoch`` of another one, as StatefulDataLoader does, still
        resumes it); a state at an epoch's end leaves the epoch alone, and
        iterating that epoch again yields nothing.  A later `set_epoch` to
        another epoch starts that one from its beginning.  Raises
        InvalidArgument, naming the field, when the state belongs to
        another order (sample count, seed, shuffle, drop_last,
        permutation, elastic or not) or, without ``elastic``, to another
        rank or world size.  Cost: O(1).
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise InvalidArgument(f"not a ShuffleShard state: {state!r:.200}")
        if state.get("version") != STATE_VERSION:
            raise InvalidArgument(f"ShuffleShard state version {state.get('version')!r} is not "
                                  f"{STATE_VERSION}, the one this DLFS reads")
        mine = self.state_dict()
        for field in ("n", "seed", "shuffle", "drop_last", "permutation", "elastic"):
            if state.get(field) != mine[field]:
                raise InvalidArgument(
                    f"the saved state is for {field}={state.get(field)!r}, this sampler has "
                    f"{field}={mine[field]!r}: a state resumes only the order it was saved from")
        epoch = _check_epoch(state.get("epoch"))
        if self.elastic:
            start = check_int("samples_done", state.get("samples_done"), 0, self.n)
            complete = start == self.n
        else:
            for field in ("world_size", "rank"):
                if state.get(field) != mine[field]:
                    raise InvalidArgument(
                        f"the saved state is rank {state.get('rank')!r} of world size "
                        f"{state.get('world_size')!r}, this sampler is rank {self.rank} of "
                        f"{self.world_size}: DistributedSampler's order resumes only at its "
                        "own world size; use elastic=True to resume at another one")
            start = check_int("position", state.get("position"), 0, len(self))
            complete = start == len(self)
        if not complete:
            self.epoch = epoch
        self._resume = (epoch, start)

    def __repr__(self) -> str:
        return (f"ShuffleShard(n={self.n}, seed={self.seed}, rank={self.rank}, "
                f"world_size={self.world_size}, drop_last={self.drop_last}, "
                f"elastic={self.elastic}, epoch={self.epoch})")


def _permute_name(permute: Permute) -> str:
    return getattr(permute, "__qualname__", None) or repr(permute)


def _check_ranks(rank, world_size) -> None:
    world_size = check_int("world size", world_size, 1, limits.world_size_max)
    check_int(f"rank (of world size {world_size})", rank, 0, world_size - 1)


def _check_epoch(epoch) -> int:
    if not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise InvalidArgument(f"epoch {epoch!r} must be a non-negative integer")
    return int(epoch)
