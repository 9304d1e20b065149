"""The read cache in-process against a real daemon: bytes, fetch counts, bounds."""

from __future__ import annotations

import random

import numpy as np
import pytest
import trio

from dlfs import Client, NotFound
from dlfs.fuse.backend import Backend
from dlfs.fuse.errno_map import Stale
from dlfs.fuse.inodes import Node
from dlfs.fuse.readcache import ReadCache
from helpers.trees import unique_name, write_tree

MiB = 1024 * 1024
KiB = 1024


@pytest.fixture(scope="module")
def files(shared_daemon, tmp_path_factory):
    rng = np.random.default_rng(2)
    tree = {"big.bin": rng.bytes(20 * MiB + 12345), "small.bin": rng.bytes(3 * MiB + 7),
            "tiny.bin": rng.bytes(4096)}
    source = tmp_path_factory.mktemp("rc")
    write_tree(source, tree)
    name = unique_name("rc")
    with Client(shared_daemon.address) as client:
        client.ingest(str(source), name, progress=False)
    return shared_daemon.address, name, tree


def run_with_cache(address: str, test, *, store=None, with_backend: bool = False,
                   **cache_args) -> None:
    """Run `test(cache, node_of)` in trio with a ReadCache over a real backend,
    wired as the file system wires it (fetches in threads; page-cache pushes
    go to `store`, none without it).  `with_backend`: also pass the backend."""
    backend = Backend(address)
    inodes = iter(range(10, 1 << 30))

    async def fetch_whole(node):
        return await trio.to_thread.run_sync(backend.read, node.dataset, node.path, 0, 0)

    async def fetch_range(node, offset, length, deliver):
        token = trio.lowlevel.current_trio_token()
        return await trio.to_thread.run_sync(
            backend.read_chunks, node.dataset, node.path, offset, length,
            lambda position, piece: trio.from_thread.run_sync(deliver, position, piece,
                                                              trio_token=token))

    def node_of(dataset: str, path: str, size: int) -> Node:
        return Node(next(inodes), (dataset, 1, path), False, size, 0o100644, 0)

    async def main():
        async with trio.open_nursery() as nursery:
            cache = ReadCache(fetch_whole, fetch_range, nursery, store, **cache_args)
            await (test(cache, node_of, backend) if with_backend else test(cache, node_of))
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        backend.close()


def test_sequential_read_uses_few_large_fetches(files):
    address, name, tree = files
    data = tree["big.bin"]

    async def test(cache, node_of):
        node = node_of(name, "big.bin", len(data))
        got = bytearray()
        for offset in range(0, len(data), 128 * KiB):
            got += await cache.read(node, offset, 128 * KiB)
            cache.check_invariants()
            assert cache.bytes_held <= cache.bytes_max
        assert bytes(got) == data
        # One unit before the reader looks sequential, then runs of 16 MiB.
        assert cache.fetches <= 1 + -(-len(data) // (16 * MiB)) + 1
        await trio.sleep(0)
        assert cache.bytes_held == 0  # everything was handed out, nothing kept

    run_with_cache(address, test)


def test_random_reads_fetch_only_what_they_touch(files):
    address, name, tree = files
    data = tree["big.bin"]
    rng = random.Random(4)

    async def test(cache, node_of):
        node = node_of(name, "big.bin", len(data))
        end = 0
        for _ in range(40):
            offset = rng.randrange(len(data))
            while abs(offset - end) < 2 * MiB:  # random: never where the last read ended
                offset = rng.randrange(len(data))
            end = offset + 4096
            before = cache.fetches
            assert await cache.read(node, offset, 4096) == data[offset:offset + 4096]
            assert cache.fetches - before <= 2  # a unit, or two when it straddles
            cache.check_invariants()
        assert cache.bytes_held <= 40 * 2 * MiB

    run_with_cache(address, test)


def test_concurrent_first_reads_share_one_fetch(files):
    address, name, tree = files
    data = tree["small.bin"]

    async def test(cache, node_of):
        node = node_of(name, "small.bin", len(data))
        results = {}

        async def reader(i):
            offset = i * 256 * KiB
            results[i] = bytes(await cache.read(node, offset, 256 * KiB))

        async with trio.open_nursery() as nursery:
            for i in range(13):  # 3 MiB + 7 bytes: the last reader gets 7
                nursery.start_soon(reader, i)
        assert cache.fetches == 1  # the whole sample, once
        assert b"".join(results[i] for i in range(13)) == data
        assert cache.bytes_held == 0
        cache.check_invariants()

    run_with_cache(address, test)


def test_bounded_memory(files):
    address, name, tree = files
    data = tree["big.bin"]

    async def test(cache, node_of):
        node = node_of(name, "big.bin", len(data))
        for offset in range(0, len(data), 64 * KiB):  # touch every unit, take little of each
            await cache.read(node, offset, 4096)
            assert cache.bytes_held <= cache.bytes_max + 16 * MiB  # demand may overshoot a run
            cache.check_invariants()

    run_with_cache(address, test, bytes_max=4 * MiB, run_bytes_max=2 * MiB, ahead_bytes=2 * MiB)


def test_pushed_units_are_dropped_so_run_buffers_are_reused(files):
    """A sequential reader whose read-ahead is pushed into the page cache:
    the cache keeps only the last `pushed_keep_bytes` of pushed units, so
    each run's reply buffer goes back to the pool and the read recycles a
    few buffers instead of allocating one per run."""
    address, name, tree = files
    data = tree["big.bin"]
    page = 4096
    page_cache = bytearray(len(data))
    present = bytearray(-(-len(data) // page))

    def pages(start, end):  # the pages holding bytes [start, end)
        return slice(start // page, -(-end // page))

    async def store(node, offset, piece):  # what notify_store does to the page cache
        page_cache[offset:offset + len(piece)] = piece
        held = pages(offset, offset + len(piece))
        present[held] = b"\1" * len(present[held])

    async def test(cache, node_of, backend):
        node = node_of(name, "big.bin", len(data))
        got = bytearray()
        for offset in range(0, len(data), 128 * KiB):
            end = min(offset + 128 * KiB, len(data))
            if all(present[pages(offset, end)]):  # the kernel has these pages
                got += page_cache[offset:end]
            else:
                got += await cache.read(node, offset, end - offset)
            cache.check_invariants()
        assert bytes(got) == data
        await trio.sleep(0.2)  # the last pushes finish
        assert cache.stored_bytes > len(data) // 2  # most of the file was pushed, not replied
        assert cache.pushed_bytes_held <= cache.pushed_keep_bytes
        runs = -(-len(data) // MiB)
        # In flight or kept at once: the read-ahead window, the run being
        # read, the pushed units kept; each held unit pins its run's buffer.
        assert backend.client.transport.pool.allocations <= 8 < runs

    run_with_cache(address, test, store=store, with_backend=True, run_bytes_max=MiB,
                   ahead_bytes=2 * MiB, pushed_keep_bytes=MiB)


def test_reserved_reply_buffers_receive_the_first_runs(files):
    """The mount maps its run buffers at start: the first ranged reads of a run's
    size land in them, nothing is allocated while the reader waits."""
    address, name, tree = files
    backend = Backend(address)
    try:
        assert backend.reserve_reply_buffers(16 * MiB, 2) == 2
        pool = backend.client.reply_buffers
        assert pool.idle_bytes == 32 * MiB
        pieces = []
        backend.read_chunks(name, "big.bin", 0, 16 * MiB, lambda _at, piece: pieces.append(piece))
        assert b"".join(pieces) == tree["big.bin"][:16 * MiB]
        assert pool.allocations == 0
    finally:
        backend.close()


def test_failures_are_raised_and_not_kept(files):
    address, name, tree = files

    async def test(cache, node_of):
        missing = node_of(name, "missing.bin", 100)
        for _ in range(2):  # the second read asks the daemon again
            with pytest.raises(NotFound):
                await cache.read(missing, 0, 100)
        assert cache.fetches == 2 and cache.bytes_held == 0
        wrong_size = node_of(name, "tiny.bin", 5000)  # as if the dataset had been replaced
        with pytest.raises(Stale):
            await cache.read(wrong_size, 0, 5000)
        big_wrong = node_of(name, "big.bin", len(tree["big.bin"]) + 3 * MiB)
        with pytest.raises(Stale):
            await cache.read(big_wrong, len(tree["big.bin"]) + 2 * MiB, 4096)
        tiny = node_of(name, "tiny.bin", 4096)
        assert await cache.read(tiny, 4000, 500) == tree["tiny.bin"][4000:]
        assert cache.bytes_held == 4096  # staged until the kernel took all of it
        assert await cache.read(tiny, 4096, 10) == b""
        assert await cache.read(tiny, 0, 4000) == tree["tiny.bin"][:4000]
        cache.check_invariants()
        assert cache.bytes_held == 0

    run_with_cache(address, test)
