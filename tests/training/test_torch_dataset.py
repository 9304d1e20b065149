"""DLFSDataset + ShuffleShardSampler in real torch DataLoaders against a real daemon."""

from __future__ import annotations

import collections
import gc
import multiprocessing
import os
import subprocess
import sys
import threading

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from dlfs import InvalidArgument, NotFound  # noqa: E402
from dlfs.torch import (  # noqa: E402
    DLFSDataset, PrefetchHints, ShuffleShardSampler, stack_samples)
from helpers.trees import unique_name, write_tree  # noqa: E402

CLASSES = {"cat": 16, "dog": 11, "fish": 9}  # 36 training samples: divisible by 2 and 3
LOADER_TIMEOUT_S = 60  # a hung worker fails the test instead of hanging it


def sample_bytes(path: str) -> bytes:
    """Contents that name their own path, padded to a size that differs per sample."""
    return path.encode() + b"\0" + bytes(range(256)) * (1 + len(path) % 5)


def path_of(sample) -> str:
    return bytes(sample).split(b"\0", 1)[0].decode()


@pytest.fixture(scope="module")
def tree(shared_daemon, tmp_path_factory):
    files = {f"train/{c}/{i:03d}.bin": None for c, k in CLASSES.items() for i in range(k)}
    files.update({"val/cat/000.bin": None, "val/cat/001.bin": None, "val/dog/000.bin": None,
                  "README.txt": None})
    files = {path: sample_bytes(path) for path in files}
    root = tmp_path_factory.mktemp("tree")
    write_tree(root, files)
    name = unique_name("torch")
    from dlfs import Client

    with Client(shared_daemon.address) as client:
        client.ingest(str(root), name, progress=False)
    return shared_daemon.address, name, sorted(files)


def load(dataset, sampler, num_workers, batch_size=5, *, after_first_batch=None, **kwargs):
    """Every (path, label) a DataLoader delivers, in delivery order.

    `after_first_batch()` runs once the first batch has arrived, with the
    epoch still under way.
    """
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                        timeout=LOADER_TIMEOUT_S if num_workers else 0, **kwargs)
    seen = []
    for samples, labels in loader:
        assert isinstance(samples, (list, tuple)) and isinstance(labels, torch.Tensor)
        seen += [(path_of(s), int(label)) for s, label in zip(samples, labels)]
        if after_first_batch is not None:
            after_first_batch()
            after_first_batch = None
    return seen


def test_imagefolder_style_labels(tree):
    address, name, paths = tree
    ds = DLFSDataset(address, name, root="train")
    assert len(ds) == 36
    assert ds.classes == ["cat", "dog", "fish"]
    assert ds.class_to_idx == {"cat": 0, "dog": 1, "fish": 2}
    train = [p for p in paths if p.startswith("train/")]
    assert [ds.class_to_idx[p.split("/")[1]] for p in train] == ds.targets.tolist()
    assert ds.path(17) == train[17]
    sample, label = ds[17]
    assert isinstance(sample, bytes) and path_of(sample) == train[17]
    assert label == ds.class_to_idx[train[17].split("/")[1]]
    # The whole dataset, with labels from the immediate parent folder, needs every sample
    # in a folder: README.txt is not.
    with pytest.raises(InvalidArgument, match="README.txt"):
        DLFSDataset(address, name)
    everything = DLFSDataset(address, name, target=None)
    assert len(everything) == len(paths) and path_of(everything[0]) == paths[0]
    val = DLFSDataset(address, name, root="val", target=lambda p: p.upper())
    assert [path_of(s) for s, _ in val.__getitems__([2, 0, 2])] == [
        "val/dog/000.bin", "val/cat/000.bin", "val/dog/000.bin"]
    assert val[1][1] == "VAL/CAT/001.BIN"


def test_transform_gets_a_memoryview_per_sample(tree):
    address, name, _ = tree
    ds = DLFSDataset(address, name, root="train",
                     transform=lambda s: (type(s).__name__, s.readonly, path_of(s)))
    items = ds.__getitems__([0, 35])
    assert [t for t, _label in items] == [("memoryview", True, "train/cat/000.bin"),
                                         ("memoryview", True, "train/fish/008.bin")]


def test_errors_are_typed(tree):
    address, name, _ = tree
    with pytest.raises(NotFound):
        DLFSDataset(address, unique_name("missing"))
    with pytest.raises(NotFound, match="no samples below 'nope'"):
        DLFSDataset(address, name, root="nope")
    with pytest.raises(InvalidArgument, match="target"):
        DLFSDataset(address, name, root="train", target="grandparent_dir")
    ds = DLFSDataset(address, name, root="train")
    with pytest.raises(IndexError):
        ds[36]
    with pytest.raises(IndexError):
        ds.__getitems__([0, -1])


@pytest.mark.parametrize("num_workers", (0, 2))
@pytest.mark.parametrize("world_size", (2, 3))
@pytest.mark.parametrize("drop_last", (False, True))
def test_every_sample_exactly_once_per_epoch_across_ranks(tree, num_workers, world_size,
                                                          drop_last):
    address, name, paths = tree
    ds = DLFSDataset(address, name, root="train")
    train = [p for p in paths if p.startswith("train/")]
    for epoch in (0, 1):
        seen = []
        for rank in range(world_size):
            sampler = ShuffleShardSampler(len(ds), seed=42, rank=rank, world_size=world_size,
                                          drop_last=drop_last)
            sampler.set_epoch(epoch)
            got = load(ds, sampler, num_workers)
            # Delivery order is the sampler's order, and labels are the class folder's.
            assert [p for p, _ in got] == [train[i] for i in sampler.indices()]
            assert all(label == ds.class_to_idx[p.split("/")[1]] for p, label in got)
            seen += [p for p, _ in got]
        assert sorted(seen) == train


@pytest.mark.parametrize("drop_last", (False, True))
def test_uneven_split_pads_or_drops_like_distributed_sampler(tree, drop_last):
    address, name, paths = tree
    ds = DLFSDataset(address, name, target=None)  # 40 samples over 3 ranks
    shards = []
    for rank in range(3):
        sampler = ShuffleShardSampler(len(ds), seed=1, rank=rank, world_size=3,
                                      drop_last=drop_last)
        loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2,
                            timeout=LOADER_TIMEOUT_S)
        shards.append([path_of(s) for batch in loader for s in batch])
    counts = collections.Counter(p for shard in shards for p in shard)
    assert all(len(shard) == len(shards[0]) for shard in shards)
    if drop_last:
        assert len(counts) == 39 and set(counts.values()) == {1}
    else:
        assert set(counts) == set(paths) and sum(counts.values()) == 42
        order = ShuffleShardSampler(len(ds), seed=1, world_size=3, rank=0)
        head = [paths[i] for i in order._shard.order()[:2]]  # padding repeats the head
        assert sorted(p for p, c in counts.items() if c == 2) == sorted(head)


def test_same_seed_and_epoch_same_order_across_loaders_and_processes(tree):
    address, name, _ = tree
    ds = DLFSDataset(address, name, root="train")
    runs = {}
    for key, num_workers, epoch in (("w0-e3", 0, 3), ("w2-e3", 2, 3), ("w2-e4", 2, 4)):
        sampler = ShuffleShardSampler(len(ds), seed=9, rank=0, world_size=1)
        sampler.set_epoch(epoch)
        runs[key] = load(ds, sampler, num_workers)
    fresh = DLFSDataset(address, name, root="train")
    sampler = ShuffleShardSampler(len(fresh), seed=9)
    sampler.set_epoch(3)
    assert runs["w0-e3"] == runs["w2-e3"] == load(fresh, sampler, 2)
    assert runs["w2-e4"] != runs["w2-e3"]
    assert sorted(runs["w2-e4"]) == sorted(runs["w2-e3"])


def test_spawned_workers_open_their_own_client(tree):
    address, name, paths = tree
    ds = DLFSDataset(address, name, root="val")
    ds[0]  # this process now holds a client; it must not travel to the workers
    sampler = ShuffleShardSampler(len(ds), seed=0)
    got = load(ds, sampler, 1, batch_size=2, multiprocessing_context="spawn")
    assert sorted(p for p, _ in got) == [p for p in paths if p.startswith("val/")]


def test_direct_mode_reads_the_same_samples(tree):
    address, name, _ = tree
    remote = DLFSDataset(address, name, root="train", client_options={"direct": False})
    local = DLFSDataset(address, name, root="train", client_options={"direct": True})
    assert (remote.reads, local.reads) == ("daemon", "extents")
    sampler = ShuffleShardSampler(len(remote), seed=5)
    assert load(local, sampler, 2) == load(remote, sampler, 0)


def test_on_the_daemons_host_the_default_reads_the_extents(tree):
    """The README's DataLoader, without client options: its workers map the extents, and
    no sample passes through the daemon."""
    from dlfs import Client

    address, name, paths = tree
    ds = DLFSDataset(address, name, root="train")
    assert ds.reads == "extents" and ds.client_options == {"direct": True}
    with Client(address) as client:
        served = client.status().samples_served
    got = load(ds, ShuffleShardSampler(len(ds), seed=3), 2)
    assert sorted(p for p, _ in got) == [p for p in paths if p.startswith("train/")]
    with Client(address) as client:
        assert client.status().samples_served == served


def test_a_user_the_daemon_passes_no_extents_reads_through_it(tree):
    """Another user than the daemon's, without a token: the default falls back to the data
    path, said once in the log, and reads the same samples."""
    address, name, paths = tree
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout);"
            "from dlfs.torch import DLFSDataset;"
            f"ds = DLFSDataset({address!r}, {name!r}, root='val');"
            "print(ds.reads, sorted(bytes(s).split(b'\\0')[0].decode() "
            "for s in ds[list(range(len(ds)))][0]))")
    done = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                           sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr
    log_line, result = done.stdout.strip().splitlines()[-2:]
    assert f"dataset {name!r} is read through the DLFS daemon at {address}, not from its " \
        "extents: uid 65534 may not read" in log_line
    assert result == f"daemon {[p for p in paths if p.startswith('val/')]}"


def test_clairvoyant_hints_keep_the_order_and_reach_the_daemon(tree):
    address, name, _ = tree
    ds = DLFSDataset(address, name, root="train")
    sampler = ShuffleShardSampler(len(ds), seed=3)
    sampler.set_epoch(2)
    hinted = PrefetchHints(sampler, ds, ahead=15, chunk=5)
    one_accepted = threading.Event()
    send = ds.hint

    def hint(indices, wait=False):  # what PrefetchHints' thread calls: tells when one was taken
        accepted = send(indices, wait=wait)
        if accepted:
            one_accepted.set()
        return accepted

    def wait_for_a_hint():  # mid-epoch, so the sender is still open to send one
        assert one_accepted.wait(LOADER_TIMEOUT_S)

    ds.hint = hint
    assert load(ds, hinted, 2, after_first_batch=wait_for_a_hint) == load(ds, sampler, 0)
    # 36 samples in chunks of <= 5: 8 hints, sent in the background (those still queued
    # when the epoch ends are discarded).
    assert 1 <= hinted.stats.hints_sent + hinted.stats.hints_dropped <= 8
    assert hinted.stats.hints_sent >= 1
    assert len(hinted) == len(sampler) == 36
    assert not [t for t in threading.enumerate() if t.name == "dlfs-torch-hints"]
    with pytest.raises(InvalidArgument):
        PrefetchHints(sampler, ds, ahead=0)


def test_breaking_out_early_leaves_no_worker_or_thread_behind(tree):
    address, name, _ = tree
    ds = DLFSDataset(address, name, root="train")
    threads_before = set(threading.enumerate())
    loader = DataLoader(ds, batch_size=2, sampler=ShuffleShardSampler(len(ds), seed=0),
                        num_workers=2, timeout=LOADER_TIMEOUT_S)
    iterator = iter(loader)
    next(iterator)
    workers = [w.pid for w in iterator._workers]
    assert len(workers) == 2
    del iterator
    gc.collect()
    assert multiprocessing.active_children() == []
    for pid in workers:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped: not a zombie of ours either
    # The loader's queue feeder threads end once their queues are closed: wait for them.
    for thread in set(threading.enumerate()) - threads_before:
        thread.join(LOADER_TIMEOUT_S)
    assert set(threading.enumerate()) <= threads_before


def test_stack_samples_makes_one_batch_tensor_of_samples_of_one_size():
    """The public helper for samples already fetched (the dataset's batch form now
    receives straight into its tensor instead)."""
    batch = stack_samples([b"abc", memoryview(b"def"), bytearray(b"ghi")])
    assert batch.dtype == torch.uint8 and batch.shape == (3, 3)
    assert bytes(batch.numpy()) == b"abcdefghi"
    assert stack_samples([]).shape == (0, 0)
    with pytest.raises(InvalidArgument, match="sample 1 of the batch has 2 bytes"):
        stack_samples([b"abc", b"de"])
