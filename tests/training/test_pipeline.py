"""dlfs.training.pipeline.iter_batches against a real daemon: order, bounds, hints, clean shutdown."""

from __future__ import annotations

import gc
import itertools
import threading

import pytest

from dlfs import Client, InvalidArgument
from dlfs import limits
from dlfs.training import pipeline
from dlfs.training.pipeline import iter_batches
from dlfs.training.shard_order import ShuffleShard
from helpers.trees import unique_name, write_tree

SAMPLES = 53
# A wait for another thread that never ends fails the test instead of hanging it.  Not
# a speed bound: on a correct pipeline every wait ends as soon as the event happens.
HANG_GUARD_S = 60


@pytest.fixture(scope="module")
def dataset(shared_daemon, tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")
    write_tree(root, {f"s/{i:04d}": f"sample {i:04d}".encode() * (1 + i % 7)
                      for i in range(SAMPLES)})
    name = unique_name("pipe")
    with Client(shared_daemon.address) as client:
        client.ingest(str(root), name, progress=False)
        yield client.dataset(name)


def pipeline_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("dlfs-")]


def content(i: int) -> bytes:
    return f"sample {i:04d}".encode() * (1 + i % 7)


class Concurrency:
    """Delegates to a real Dataset and records how many get_batch calls overlap.

    With `fill`, the first get_batch calls wait for one another until `fill`
    of them run at once (the window is full), so the overlap does not depend
    on how fast the threads are scheduled.  See `send_hints_first` for hints.
    Events are numbered in the order they happen (`requested`, `hints`).
    """

    def __init__(self, ds, fill: int = 0):
        self.ds = ds
        self.fill = fill
        self.hints_first = False
        self.running = 0
        self.most = 0
        self.calls = 0
        self.hints: list[tuple[int, list[int]]] = []  # (event number, ids) per hint sent
        self.requested: dict[int, int] = {}  # sample id -> event number of its get_batch
        self.hints_pending = 0  # queued by the pipeline, not yet sent
        self._events = itertools.count()
        self._changed = threading.Condition()

    def get_batch(self, ids, verify=True):
        with self._changed:
            if self.hints_first:
                assert self._changed.wait_for(lambda: self.hints_pending == 0, HANG_GUARD_S)
            event = next(self._events)
            self.requested.update((int(i), event) for i in ids)
            self.running += 1
            self.calls += 1
            self.most = max(self.most, self.running)
            self._changed.notify_all()
            assert self._changed.wait_for(lambda: self.most >= self.fill, HANG_GUARD_S)
        try:
            return self.ds.get_batch(ids, verify=verify)
        finally:
            with self._changed:
                self.running -= 1

    def prefetch(self, ids, wait=False):
        with self._changed:
            self.hints.append((next(self._events), [int(i) for i in ids]))
        try:
            return self.ds.prefetch(ids, wait=wait)
        finally:
            if self.hints_first:
                with self._changed:
                    self.hints_pending -= 1
                    self._changed.notify_all()

    def send_hints_first(self, monkeypatch) -> None:
        """Make each get_batch wait until every hint the pipeline has queued was sent.

        The hint thread then always wins its race to the daemon.  Hints are
        counted as the pipeline's HintSender queues them.
        """
        self.hints_first = True
        counting = self

        class CountedHintSender(pipeline.HintSender):
            def submit(self, ids) -> bool:
                with counting._changed:  # counted before the hint thread can send it
                    counting.hints_pending += 1
                accepted = super().submit(ids)
                if not accepted:
                    with counting._changed:
                        counting.hints_pending -= 1
                        counting._changed.notify_all()
                return accepted

        monkeypatch.setattr(pipeline, "HintSender", CountedHintSender)


@pytest.mark.parametrize("batch_size,prefetch,drop_last", [(1, 1, False), (5, 4, False),
                                                           (5, 4, True), (53, 2, False),
                                                           (100, 3, False)])
def test_batches_in_order_with_the_right_bytes(dataset, batch_size, prefetch, drop_last):
    order = ShuffleShard(SAMPLES, seed=4).indices(epoch=1)
    got = []
    with iter_batches(dataset, order, batch_size, prefetch=prefetch,
                      drop_last=drop_last) as batches:
        for ids, samples in batches:
            assert len(ids) == len(samples) <= batch_size
            got += [(int(i), bytes(s)) for i, s in zip(ids, samples)]
    expected = order[:len(order) // batch_size * batch_size] if drop_last else order
    assert [i for i, _ in got] == expected
    assert all(data == content(i) for i, data in got)
    assert pipeline_threads() == []


def test_at_most_prefetch_batches_in_flight(dataset):
    counting = Concurrency(dataset, fill=3)  # the first calls wait until the window is full
    batches = iter_batches(counting, list(range(SAMPLES)), 4, prefetch=3)
    for _ in batches:
        pass
    assert counting.calls == 14
    assert counting.most == 3
    assert batches.stats.batches == 14 and batches.stats.samples == SAMPLES
    assert pipeline_threads() == []


def test_clairvoyant_hints_cover_the_batches_beyond_the_window(dataset, monkeypatch):
    counting = Concurrency(dataset)
    counting.send_hints_first(monkeypatch)  # a consumer never faster than the hint thread
    order = ShuffleShard(SAMPLES, seed=1).indices()
    batches = iter_batches(counting, order, 5, prefetch=2, hint_ahead=3)
    got = []
    for ids, _ in batches:
        got += [int(i) for i in ids]
    assert got == order
    hinted = [i for _when, hint in counting.hints for i in hint]
    # Batches 0 and 1 are fetched at once; 2.. are hinted (in order, each once) before
    # they are requested.
    assert hinted == order[10:]
    for when, hint in counting.hints:
        assert when < counting.requested[hint[0]]
    assert batches.stats.hints_sent + batches.stats.hints_dropped == len(counting.hints)
    assert [t for t in threading.enumerate() if t.name == "dlfs-pipeline-hints"] == []
    none = Concurrency(dataset)
    list(iter_batches(none, order, 5, prefetch=2))
    assert none.hints == []  # opt-in: no hints by default


@pytest.mark.parametrize("how", ["break", "with-break", "exception", "close", "never-started"])
def test_early_exit_stops_every_thread(dataset, how):
    before = set(threading.enumerate())
    slow = Concurrency(dataset, fill=4)  # the first 4 calls wait until all 4 run at once
    order = list(range(SAMPLES))
    if how == "break":
        for n, _batch in enumerate(iter_batches(slow, order, 2, prefetch=4)):
            if n == 1:
                break
    elif how == "with-break":
        with iter_batches(slow, order, 2, prefetch=4) as batches:
            for _ in batches:
                assert len(pipeline_threads()) == 4
                break
    elif how == "exception":
        with pytest.raises(RuntimeError, match="training failed"):
            with iter_batches(slow, order, 2, prefetch=4) as batches:
                for _ in batches:
                    raise RuntimeError("training failed")
    elif how == "close":
        batches = iter_batches(slow, order, 2, prefetch=4)
        next(batches)
        batches.close()
        assert list(batches) == []  # closed: iteration ends at once
    else:
        iter_batches(slow, order, 2, prefetch=4)
    gc.collect()
    assert pipeline_threads() == []
    assert set(threading.enumerate()) <= before
    assert slow.running == 0
    # At most the window (4) plus one batch per next() (2 at most here) was ever
    # requested; the 27 batches of the order were never all fetched.
    assert slow.calls <= 6


def test_a_failing_batch_raises_its_typed_error_at_its_turn(dataset):
    order = [0, 1, 2, 3, SAMPLES + 5, 4, 5, 6, 7, 8]
    got = []
    with pytest.raises(InvalidArgument):
        for ids, _ in iter_batches(dataset, order, 2, prefetch=3):
            got += [int(i) for i in ids]
    assert got == [0, 1, 2, 3]
    assert pipeline_threads() == []


@pytest.mark.parametrize("kwargs,match", [
    ({"batch_size": 0}, "batch_size"), ({"prefetch": 0}, "prefetch"),
    ({"prefetch": limits.pipeline_prefetch_batches_max + 1}, "prefetch"), ({"hint_ahead": -1}, "hint_ahead"),
    ({"order": [1, -2]}, "negative"), ({"order": ["a/b"]}, "ds.index"),
    ({"order": [[1, 2]]}, "flat"), ({"batch_size": True}, "batch_size"),
])
def test_bad_arguments_are_refused_at_once(dataset, kwargs, match):
    args = {"order": [1, 2, 3], "batch_size": 2} | kwargs
    with pytest.raises(InvalidArgument, match=match):
        iter_batches(dataset, args.pop("order"), args.pop("batch_size"), **args)


def test_empty_order_yields_nothing(dataset):
    assert list(iter_batches(dataset, [], 4)) == []
    assert pipeline_threads() == []


# --- iter_rows: batches of one sample size received straight into [B, L] arrays ---------

ROW_BYTES = 1000
ROW_SAMPLES = 40


def row_content(i: int) -> bytes:
    return bytes([i % 251]) * (ROW_BYTES - 4) + i.to_bytes(4, "little")


@pytest.fixture(scope="module")
def rows_dataset(shared_daemon, tmp_path_factory):
    """ROW_SAMPLES samples of ROW_BYTES each (r/0000...) and one of 7 bytes (z/odd)."""
    root = tmp_path_factory.mktemp("rows")
    files = {f"r/{i:04d}": row_content(i) for i in range(ROW_SAMPLES)}
    files["z/odd"] = b"7 bytes"
    write_tree(root, files)
    name = unique_name("rows")
    with Client(shared_daemon.address) as client:
        client.ingest(str(root), name, progress=False)
        ds = client.dataset(name)
        ids = [ds.index(f"r/{i:04d}") for i in range(ROW_SAMPLES)]
        yield ds, ids, ds.index("z/odd")


@pytest.mark.parametrize("transport", ["data path", "direct"])
def test_rows_arrive_as_writable_arrays_in_order(rows_dataset, shared_daemon, transport):
    ds, ids, _odd = rows_dataset
    order = list(reversed(ids))
    with Client(shared_daemon.address, direct=transport == "direct") as client:
        reader = client.dataset(ds.name)
        with pipeline.iter_rows(reader, order, batch_size=16, prefetch=2) as batches:
            got = list(batches)
    assert [len(b.samples) for b in got] == [16, 16, 8]
    for start, batch in zip(itertools.count(0, 16), got):
        assert batch.samples.shape == (len(batch.ids), ROW_BYTES)
        assert batch.samples.flags.writeable
        assert list(batch.ids) == order[start:start + 16]
        for row, i in zip(batch.samples, range(ROW_SAMPLES - 1 - start, -1, -1)):
            assert row.tobytes() == row_content(i)


def test_rows_reuse_dropped_buffers_and_never_a_held_one(rows_dataset):
    ds, ids, _odd = rows_dataset
    order = ids * 10  # 400 samples, 50 batches of 8
    kept = None
    with pipeline.iter_rows(ds, order, batch_size=8, prefetch=3) as batches:
        for number, batch in enumerate(batches):
            if number == 0:
                kept = batch.samples  # held across the whole epoch
            else:
                assert batch.samples.tobytes() == b"".join(row_content(ids.index(i))
                                                           for i in batch.ids)
            del batch
        allocations = batches._rows.pool.allocations
    # prefetch in flight, the one being handed out, the one the loop still holds, the kept one.
    assert allocations <= 3 + 3
    assert kept.tobytes() == b"".join(row_content(i) for i in range(8))


def test_rows_of_different_sizes_fail_at_their_batch(rows_dataset):
    ds, ids, odd = rows_dataset
    order = ids[:8] + [ids[8], odd] + ids[10:16]
    with pipeline.iter_rows(ds, order, batch_size=8, prefetch=4) as batches:
        first = next(batches)
        assert first.samples.shape == (8, ROW_BYTES)
        with pytest.raises(InvalidArgument, match="need one size"):
            next(batches)


def test_rows_take_the_sizes_given(rows_dataset):
    ds, ids, _odd = rows_dataset
    sizes = ds.listing()[1]
    with pipeline.iter_rows(ds, ids[:4], 4, sizes=sizes) as batches:
        assert next(batches).samples.shape == (4, ROW_BYTES)
    with pytest.raises(InvalidArgument, match="beyond the 3 sizes"):
        pipeline.iter_rows(ds, [0, 1, 5], batch_size=2, sizes=sizes[:3])
    with pytest.raises(InvalidArgument, match="flat array of sample sizes"):
        pipeline.iter_rows(ds, [0], batch_size=1, sizes=[[1]])
