"""ShuffleShard's saved positions, torch-free: every sample of an epoch once across a restart.

The default state resumes one rank at its own world size; the elastic state
resumes the epoch at any world size.  Each test plays the whole job: every
rank reads k samples, one rank's state is saved, fresh ranks (of the same or
another world size) load it and read to the end of the epoch.
"""

from __future__ import annotations

import collections
import json

import pytest

from dlfs.errors import InvalidArgument
from dlfs.training.shard_order import ShuffleShard, elastic_length, elastic_shard, shard

SIZES = (1, 7, 36, 37, 100)


def ranks(n, world_size, **kwargs):
    return [ShuffleShard(n, rank=r, world_size=world_size, **kwargs) for r in range(world_size)]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("world_size", (1, 3))
@pytest.mark.parametrize("drop_last", (False, True))
def test_default_state_resumes_each_rank_where_it_stopped(n, world_size, drop_last):
    for rank in range(world_size):
        whole = ShuffleShard(n, seed=5, rank=rank, world_size=world_size, drop_last=drop_last)
        whole.set_epoch(2)
        full = list(whole)
        for k in sorted({0, 1, len(full) // 2, len(full)} & set(range(len(full) + 1))):
            first = ShuffleShard(n, seed=5, rank=rank, world_size=world_size,
                                 drop_last=drop_last)
            first.set_epoch(2)
            it = iter(first)
            before = [next(it) for _ in range(k)]
            state = json.loads(json.dumps(first.state_dict()))  # a plain, JSON-able dict
            resumed = ShuffleShard(n, seed=5, rank=rank, world_size=world_size,
                                   drop_last=drop_last)
            resumed.load_state_dict(state)
            assert resumed.epoch == (2 if k < len(full) else 0)
            resumed.set_epoch(2)
            assert before + list(resumed) == full, (rank, k)
            assert list(resumed) == full  # the resume applies to one iteration only


def test_consumed_names_the_position_when_the_sampler_ran_ahead():
    s = ShuffleShard(50, seed=1, rank=1, world_size=2)
    full = list(s)
    it = iter(s)
    for _ in range(20):  # a loader's prefetch: 20 drawn, 12 trained on
        next(it)
    state = s.state_dict(consumed=12)
    assert state["position"] == 12
    t = ShuffleShard(50, seed=1, rank=1, world_size=2)
    t.load_state_dict(state)
    assert full[:12] + list(t) == full
    # Counting restarts with each iteration: 5 done after a resume at 12 is position 17.
    t.load_state_dict(state)
    it = iter(t)
    next(it)
    assert t.state_dict(consumed=5)["position"] == 17
    with pytest.raises(InvalidArgument, match="consumed"):
        t.state_dict(consumed=14)  # beyond the 13 samples that iteration has


def seen_across_restart(n, before_world, after_world, k, drop_last, seed=3, epoch=1):
    """Samples each rank reads: k per rank at `before_world`, then the rest at `after_world`."""
    olds = ranks(n, before_world, seed=seed, drop_last=drop_last, elastic=True)
    states = []
    before = []
    for s in olds:
        s.set_epoch(epoch)
        it = iter(s)
        before += [next(it) for _ in range(k)]
        states.append(s.state_dict())
    # Ranks in lockstep save one and the same state: any of them resumes the job.
    assert all(state == states[0] for state in states)
    news = ranks(n, after_world, seed=seed, drop_last=drop_last, elastic=True)
    after = []
    for s in news:
        s.set_epoch(epoch)  # as the resumed job's loop does, before its loader loads the state
        s.load_state_dict(states[-1])
        after.append(list(s))
    return before, after, states[0]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("before_world,after_world", [(2, 3), (4, 1), (3, 3), (1, 5)])
def test_elastic_state_resumes_the_epoch_at_another_world_size(n, before_world, after_world):
    order = ShuffleShard(n, seed=3).order(epoch=1)
    per_rank = -(-n // before_world)
    for k in sorted({0, 1, per_rank // 2, per_rank - 1} - {-1}):
        if k * before_world > n:
            continue
        before, after, state = seen_across_restart(n, before_world, after_world, k, False)
        done = k * before_world
        assert state["samples_done"] == done
        assert sorted(before) == sorted(order[:done])  # a prefix of the global order is done
        lengths = {len(part) for part in after}
        assert lengths == {elastic_length(n, done, after_world, False)}  # equal shares
        seen = before + [i for part in after for i in part]
        counts = collections.Counter(seen)
        assert set(counts) == set(range(n))  # nothing skipped
        padding = len(seen) - n
        assert padding == -(n - done) % after_world  # repeats only to even out the last ranks
        extra = [i for i, c in counts.items() for _ in range(c - 1)]
        assert sorted(extra) == sorted(order[:padding] if padding <= n else extra)


@pytest.mark.parametrize("n", SIZES)
def test_elastic_with_drop_last_reads_each_sample_at_most_once(n):
    for before_world, after_world in ((2, 3), (3, 2)):
        for k in {0, 1, n // (2 * before_world)} & set(range(n // before_world + 1)):
            before, after, _ = seen_across_restart(n, before_world, after_world, k, True)
            seen = before + [i for part in after for i in part]
            assert len(seen) == len(set(seen))
            assert len({len(part) for part in after}) == 1
            done = k * before_world
            assert len(seen) == done + (n - done) // after_world * after_world


def test_elastic_without_a_resume_is_the_default_order():
    for n, world_size in ((37, 3), (5, 4), (100, 8)):
        order = ShuffleShard(n, seed=2).order()
        for rank in range(world_size):
            assert elastic_shard(order, 0, rank, world_size, False) == \
                shard(order, rank, world_size, False)
            assert elastic_shard(order, 0, rank, world_size, True) == \
                shard(order, rank, world_size, True)
            a = ShuffleShard(n, seed=2, rank=rank, world_size=world_size, elastic=True)
            b = ShuffleShard(n, seed=2, rank=rank, world_size=world_size)
            assert list(a) == list(b)


def test_a_finished_epoch_resumes_as_finished_and_the_next_epoch_whole():
    for elastic in (False, True):
        s = ShuffleShard(20, seed=1, rank=0, world_size=2, elastic=elastic)
        s.set_epoch(4)
        list(s)
        state = s.state_dict()
        # Loaded after set_epoch of the next epoch (StatefulDataLoader's order of calls):
        t = ShuffleShard(20, seed=1, rank=0, world_size=2, elastic=elastic)
        t.set_epoch(5)
        t.load_state_dict(state)
        assert t.epoch == 5 and list(t) == t.indices(5)
        # Loaded, then the finished epoch asked for again: nothing is left of it.
        u = ShuffleShard(20, seed=1, rank=0, world_size=2, elastic=elastic)
        u.load_state_dict(state)
        u.set_epoch(4)
        assert list(u) == []
        u.set_epoch(5)
        assert list(u) == u.indices(5)


def test_a_mid_epoch_state_selects_its_epoch_and_set_epoch_to_another_drops_it():
    s = ShuffleShard(30, seed=1)
    s.set_epoch(3)
    it = iter(s)
    for _ in range(10):
        next(it)
    state = s.state_dict()
    t = ShuffleShard(30, seed=1)
    t.set_epoch(7)
    t.load_state_dict(state)  # the last word: resume epoch 3
    assert t.epoch == 3 and t.state_dict() == state
    assert list(t) == s.indices(3)[10:]
    u = ShuffleShard(30, seed=1)
    u.load_state_dict(state)
    u.set_epoch(4)
    assert list(u) == u.indices(4)


@pytest.mark.parametrize("change,match", [
    ({"seed": 9}, "seed"), ({"n": 31}, "n="), ({"drop_last": True}, "drop_last"),
    ({"elastic": True}, "elastic"), ({"rank": 1, "world_size": 2}, "elastic=True"),
])
def test_a_state_of_another_order_is_refused(change, match):
    args = {"n": 30, "seed": 1, "rank": 0, "world_size": 1, "drop_last": False,
            "elastic": False}
    state = ShuffleShard(**{**args, "n": args["n"]}).state_dict()
    other = {**args, **change}
    with pytest.raises(InvalidArgument, match=match):
        ShuffleShard(other.pop("n"), **other).load_state_dict(state)


def test_a_damaged_state_is_refused():
    s = ShuffleShard(30)
    good = s.state_dict()
    for bad in ({}, {**good, "version": 99}, {**good, "position": 31}, {**good, "epoch": -1},
                "position 3"):
        with pytest.raises(InvalidArgument):
            ShuffleShard(30).load_state_dict(bad)
    elastic = ShuffleShard(30, elastic=True).state_dict()
    with pytest.raises(InvalidArgument, match="samples_done"):
        ShuffleShard(30, elastic=True).load_state_dict({**elastic, "samples_done": 31})
