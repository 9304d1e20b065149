"""ReadAhead (a helper process filling a shared ring) and whole-batch items, against a real daemon."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import BatchSampler, DataLoader  # noqa: E402

from dlfs import Client, InvalidArgument, NotFound, Unavailable  # noqa: E402
from dlfs.ring import BatchRing, stack_into  # noqa: E402
from dlfs.torch import DLFSDataset, ReadAhead, ShuffleShardSampler  # noqa: E402
from helpers.trees import unique_name, write_tree  # noqa: E402

CLASSES = {"ant": 9, "bee": 14, "cow": 6}  # 29 samples: batches of 4 leave a short one
RECORD_BYTES = 300
LOADER_TIMEOUT_S = 60


def record(path: str) -> bytes:
    """A fixed-size record that names its own path."""
    return path.encode().ljust(RECORD_BYTES, b"\0")


def path_of(row) -> str:
    return bytes(row.numpy() if isinstance(row, torch.Tensor) else row).rstrip(b"\0").decode()


@pytest.fixture(scope="module")
def records(shared_daemon, tmp_path_factory):
    files = {f"{c}/{i:02d}.rec": None for c, n in CLASSES.items() for i in range(n)}
    files = {path: record(path) for path in files}
    root = tmp_path_factory.mktemp("records")
    write_tree(root, files)
    name = unique_name("records")
    with Client(shared_daemon.address) as client:
        client.ingest(str(root), name, progress=False)
    return shared_daemon.address, name, sorted(files)


def read_epoch(loader):
    """(path, label) of every row, and the batch shapes, in delivery order."""
    seen, shapes = [], []
    for samples, labels in loader:
        if isinstance(samples, list):  # stack=False: one 1-D tensor per sample
            samples = torch.stack(samples)
        assert samples.dtype == torch.uint8 and labels.dtype == torch.int64
        shapes.append(tuple(samples.shape))
        seen += [(path_of(row), int(label)) for row, label in zip(samples, labels)]
    return seen, shapes


@pytest.mark.parametrize("direct", (False, True))
def test_epochs_arrive_whole_in_sampler_order_with_labels(records, direct):
    address, name, paths = records
    ds = DLFSDataset(address, name, client_options={"direct": direct})
    assert path_of(ds[[5]][0][0]) == paths[5]  # this process has a live client when the helper forks
    sampler = ShuffleShardSampler(len(ds), seed=4)
    read_ahead = ReadAhead(sampler, ds, batch_size=4, batches=2)
    try:
        orders = []
        for epoch in (0, 1, 0):
            read_ahead.set_epoch(epoch)
            seen, shapes = read_epoch(DataLoader(ds, batch_size=None, sampler=read_ahead))
            assert [p for p, _ in seen] == [paths[i] for i in sampler.indices()]
            assert all(label == ds.class_to_idx[p.split("/")[0]] for p, label in seen)
            assert shapes == [(4, RECORD_BYTES)] * 7 + [(1, RECORD_BYTES)]
            orders.append([p for p, _ in seen])
        assert orders[0] != orders[1] and orders[0] == orders[2]
        assert len(read_ahead) == 8
    finally:
        read_ahead.close()


def test_drop_last_and_sharding_cover_every_sample_once(records):
    address, name, paths = records
    ds = DLFSDataset(address, name, target=None)
    seen = []
    for rank in range(2):
        sampler = ShuffleShardSampler(len(ds), seed=8, rank=rank, world_size=2, drop_last=True)
        read_ahead = ReadAhead(sampler, ds, batch_size=5, drop_last=True)
        batches = list(DataLoader(ds, batch_size=None, sampler=read_ahead))
        read_ahead.close()
        assert [tuple(b.shape) for b in batches] == [(5, RECORD_BYTES)] * 2  # 14 per rank
        seen += [path_of(row) for batch in batches for row in batch]
    assert len(seen) == len(set(seen)) == 20 and set(seen) <= set(paths)


@pytest.mark.parametrize("stack", (True, False))
def test_a_batch_keeps_its_bytes_until_dropped_and_holding_all_buffers_is_an_error(records,
                                                                                   stack):
    address, name, paths = records
    ds = DLFSDataset(address, name)
    sampler = ShuffleShardSampler(len(ds), seed=1)
    read_ahead = ReadAhead(sampler, ds, batch_size=2, batches=1, stack=stack)  # 3 buffers
    try:
        iterator = iter(DataLoader(ds, batch_size=None, sampler=read_ahead))
        first, _ = next(iterator)
        # Any view keeps the whole buffer: a row of the stacked batch, one sample of the list.
        kept = first[1]
        del first
        before = kept.clone()
        for _ in range(5):  # later batches reuse the other buffers, never kept's
            next(iterator)
        assert torch.equal(kept, before)
        assert path_of(kept) == paths[sampler.indices()[1]]
        held = [kept, next(iterator)[0], next(iterator)[0]]
        with pytest.raises(InvalidArgument, match="still referenced"):
            next(iterator)
        del held, kept, iterator
        gc.collect()
        seen, _ = read_epoch(DataLoader(ds, batch_size=None, sampler=read_ahead))
        assert sorted(p for p, _ in seen) == paths  # the buffers came back
    finally:
        read_ahead.close()


def test_leaving_early_and_closing_leave_no_process_behind(records):
    address, name, paths = records
    ds = DLFSDataset(address, name)
    read_ahead = ReadAhead(ShuffleShardSampler(len(ds), seed=2), ds, batch_size=3)
    for _samples, _labels in DataLoader(ds, batch_size=None, sampler=read_ahead):
        break
    gc.collect()
    seen, _ = read_epoch(DataLoader(ds, batch_size=None, sampler=read_ahead))
    assert sorted(p for p, _ in seen) == paths  # the abandoned epoch's batches were dropped
    helper = read_ahead._ring._process
    assert helper.is_alive()
    read_ahead.close()
    assert not helper.is_alive() and helper.exitcode == 0
    assert multiprocessing.active_children() == []


def test_dataloader_workers_are_refused_with_a_clear_error(records):
    address, name, _ = records
    ds = DLFSDataset(address, name)
    read_ahead = ReadAhead(ShuffleShardSampler(len(ds), seed=2), ds, batch_size=3)
    loader = DataLoader(ds, batch_size=None, sampler=read_ahead, num_workers=2,
                        timeout=LOADER_TIMEOUT_S)
    try:
        with pytest.raises(InvalidArgument, match="num_workers=0"):
            list(loader)
    finally:
        read_ahead.close()


def test_bad_arguments_are_refused(records, tmp_path):
    address, name, _ = records
    ds = DLFSDataset(address, name)
    sampler = ShuffleShardSampler(len(ds))
    with pytest.raises(InvalidArgument, match="no transform"):
        ReadAhead(sampler, DLFSDataset(address, name, transform=bytes), batch_size=2)
    with pytest.raises(InvalidArgument, match="batch_size"):
        ReadAhead(sampler, ds, batch_size=0)
    with pytest.raises(InvalidArgument, match="batches"):
        ReadAhead(sampler, ds, batch_size=2, batches=0)
    with pytest.raises(InvalidArgument, match="exceed"):
        BatchRing(ds.ticket, slot_bytes=1 << 40, slots=4)
    with pytest.raises(InvalidArgument, match="one size: sample 1 of the batch has 2 bytes"):
        stack_into([b"abc", b"ab"], np.empty(8, dtype=np.uint8))


def test_samples_of_different_sizes_come_as_a_list_or_fail_to_stack(shared_daemon, tmp_path):
    files = {"a/0": b"x" * 10, "a/1": b"", "a/2": b"y" * 10, "b/0": b"z" * 11}
    write_tree(tmp_path, files)
    name = unique_name("ragged")
    with Client(shared_daemon.address) as client:
        client.ingest(str(tmp_path), name, progress=False)
    ds = DLFSDataset(shared_daemon.address, name)
    paths = sorted(files)
    order = [3, 1, 0, 2]
    read_ahead = ReadAhead(order, ds, batch_size=3, stack=False)
    try:
        batches = list(DataLoader(ds, batch_size=None, sampler=read_ahead))
    finally:
        read_ahead.close()
    assert [[bytes(t.numpy()) for t in samples] for samples, _ in batches] == [
        [files[paths[i]] for i in order[:3]], [files[paths[3 - 1]]]]
    assert [labels.tolist() for _, labels in batches] == [[1, 0, 0], [0]]
    assert all(t.dtype == torch.uint8 and t.dim() == 1 for samples, _ in batches for t in samples)
    stacked = ReadAhead([0, 2, 3, 1], ds, batch_size=2)  # a/0 a/2 | b/0 a/1
    try:
        iterator = iter(DataLoader(ds, batch_size=None, sampler=stacked))
        samples, _labels = next(iterator)
        assert samples.shape == (2, 10)
        with pytest.raises(InvalidArgument, match="sample 1 of the batch has 0 bytes"):
            next(iterator)
        with pytest.raises(InvalidArgument, match="one size"):
            ds[[0, 3]]  # outside a read-ahead epoch: fetched and stacked at once
    finally:
        stacked.close()


def test_a_dataset_deleted_mid_epoch_raises_not_found_at_the_next_batch(shared_daemon, tmp_path):
    files = {f"c/{i:02d}": record(f"c/{i:02d}") for i in range(40)}
    write_tree(tmp_path, files)
    name = unique_name("vanishing")
    with Client(shared_daemon.address) as client:
        client.ingest(str(tmp_path), name, progress=False)
        ds = DLFSDataset(shared_daemon.address, name)
        read_ahead = ReadAhead(range(40), ds, batch_size=2, batches=1)
        try:
            iterator = iter(DataLoader(ds, batch_size=None, sampler=read_ahead))
            next(iterator)
            client.delete(name)
            with pytest.raises(NotFound, match=name):
                for _batch in iterator:  # batches already read may still arrive first
                    pass
        finally:
            read_ahead.close()


def test_a_killed_helper_raises_unavailable(records):
    address, name, _ = records
    ds = DLFSDataset(address, name)
    read_ahead = ReadAhead(ShuffleShardSampler(len(ds)), ds, batch_size=1, batches=1)
    try:
        iterator = iter(DataLoader(ds, batch_size=None, sampler=read_ahead))
        next(iterator)
        helper = read_ahead._ring._process
        os.kill(helper.pid, signal.SIGKILL)
        helper.join(10)
        with pytest.raises(Unavailable, match="read-ahead process"):
            for _batch in iterator:
                pass
    finally:
        read_ahead.close()
    # The next epoch starts a new helper.
    seen, _ = read_epoch(DataLoader(ds, batch_size=None, sampler=read_ahead))
    read_ahead.close()
    assert len(seen) == len(ds)


@pytest.mark.parametrize("num_workers", (0, 2))
def test_whole_batch_items_through_a_batch_sampler(records, num_workers):
    address, name, paths = records
    ds = DLFSDataset(address, name)
    samples, labels = ds[[3, 0, 3]]
    assert samples.shape == (3, RECORD_BYTES) and labels.tolist() == [0, 0, 0]
    assert [path_of(row) for row in samples] == [paths[3], paths[0], paths[3]]
    # Received straight into the batch tensor: no reply buffer was taken.
    assert ds._remote().client.reply_buffers.allocations == 0
    sampler = ShuffleShardSampler(len(ds), seed=6)
    loader = DataLoader(ds, batch_size=None, sampler=BatchSampler(sampler, 4, drop_last=False),
                        num_workers=num_workers, timeout=LOADER_TIMEOUT_S if num_workers else 0)
    seen, shapes = read_epoch(loader)
    assert [p for p, _ in seen] == [paths[i] for i in sampler.indices()]
    assert shapes[-1] == (1, RECORD_BYTES)
    with_transform = DLFSDataset(address, name, transform=lambda s: len(s))
    assert [x.tolist() for x in with_transform[[1, 2]]] == [[RECORD_BYTES] * 2, [0, 0]]


def test_a_spawned_helper_reads_the_same_batches(records):
    address, name, _ = records
    ds = DLFSDataset(address, name)
    sampler = ShuffleShardSampler(len(ds), seed=12)
    results = []
    for context in ("spawn", None):
        read_ahead = ReadAhead(sampler, ds, batch_size=8, multiprocessing_context=context)
        try:
            results.append(read_epoch(DataLoader(ds, batch_size=None, sampler=read_ahead)))
        finally:
            read_ahead.close()
    assert results[0] == results[1]
