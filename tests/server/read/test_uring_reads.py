"""Windows of many small pieces through io_uring (server/read/uring.py and uring_reads.py),
against real extent files, with the preadv path as the reference."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from dlfs import limits
from dlfs.server.read import uring
from dlfs.errors import DataCorruption
from dlfs.server.core.extents import ExtentFiles
from dlfs.server.read.batch_planning import RequestOrder
from dlfs.server.read.read_engine import ReadEngine
from helpers.extents import drop_cached_pages, write_samples

pytestmark = pytest.mark.skipif(uring.for_this_thread() is None,
                                reason="this kernel refuses io_uring")


def random_file(path, size: int, seed: int = 0) -> bytes:
    data = np.random.default_rng(seed).bytes(size)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return data


def test_reads_match_pread_over_many_rounds_of_a_small_ring(tmp_path):
    data = random_file(tmp_path / "f", 1 << 20)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    ring = uring.RingReads(entries=8)  # 8 slots: every call wraps the ring several times
    rng = np.random.default_rng(1)
    try:
        for _ in range(50):
            count = int(rng.integers(1, 40))
            lengths = rng.integers(1, 5000, count).astype(np.uint32)
            offsets = rng.integers(0, len(data) - 5000, count).astype(np.uint64)
            starts = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)[:-1]))
            buffer = np.zeros(int(lengths.sum()), np.uint8)
            got = ring.read(np.full(count, fd, np.int32), offsets,
                            buffer.ctypes.data + starts.astype(np.uint64), lengths)
            assert got.tolist() == lengths.tolist()
            for start, offset, length in zip(starts.tolist(), offsets.tolist(), lengths.tolist()):
                assert bytes(buffer[start:start + length]) == data[offset:offset + length]
    finally:
        ring.close()
        os.close(fd)


def test_a_read_past_the_end_is_short_and_a_bad_descriptor_an_errno(tmp_path):
    data = random_file(tmp_path / "f", 10_000)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    buffer = np.zeros(200, np.uint8)
    ring = uring.RingReads(entries=4)
    try:
        got = ring.read(np.array([fd, 1_000_000], np.int32), np.array([9_900, 0], np.uint64),
                        np.array([buffer.ctypes.data] * 2, np.uint64), np.array([200, 200], np.uint32))
        assert got.tolist() == [100, -9]  # -EBADF
        assert bytes(buffer[:100]) == data[9_900:]
    finally:
        ring.close()
        os.close(fd)


def test_nowait_reads_report_what_the_page_cache_lacks(tmp_path):
    data = random_file(tmp_path / "f", 1 << 20)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    offsets = np.arange(0, 1 << 20, 64 << 10, dtype=np.uint64)
    buffer = np.zeros(4096 * len(offsets), np.uint8)
    addresses = buffer.ctypes.data + np.arange(len(offsets), dtype=np.uint64) * 4096
    ring = uring.for_this_thread()
    try:
        got = ring.read(np.full(len(offsets), fd, np.int32), offsets, addresses,
                        np.full(len(offsets), 4096, np.uint32), uring.RWF_NOWAIT)
        assert got[0] == -11  # EAGAIN: evicted, so not read; the kernel starts reading it
        os.pread(fd, 1 << 20, 0)
        got = ring.read(np.full(len(offsets), fd, np.int32), offsets, addresses,
                        np.full(len(offsets), 4096, np.uint32), uring.RWF_NOWAIT)
        assert (got == 4096).all()
        for k, offset in enumerate(offsets.tolist()):
            assert bytes(buffer[k * 4096:(k + 1) * 4096]) == data[offset:offset + 4096]
    finally:
        os.close(fd)


def test_each_thread_has_its_own_ring_and_a_refusal_stops_all(monkeypatch):
    rings = []
    thread = threading.Thread(target=lambda: rings.append(uring.for_this_thread()))
    thread.start()
    thread.join()
    assert rings[0] is not None and rings[0] is not uring.for_this_thread()
    monkeypatch.setattr(uring, "_refused", None)
    uring.refuse("test")
    assert uring.for_this_thread() is None


@pytest.mark.parametrize("io_uring", [True, False])
@pytest.mark.parametrize("cold", [False, True])
def test_read_into_a_window_of_many_small_samples(tmp_path, io_uring, cold):
    sizes = [4000 + (i % 7) * 100 for i in range(400)]
    store, (ext, off, length, _crc), contents = write_samples(tmp_path, sizes, 256 * 1024)
    ids = np.random.default_rng(2).permutation(len(sizes))[:300]
    order = RequestOrder(ext[ids], off[ids], length[ids])
    pieces = order.pieces(0, order.payload_bytes)
    assert len(pieces) >= limits.uring_pieces_min
    files = ExtentFiles(store)
    engine = ReadEngine(files, threads=2, io_uring=io_uring)
    buffer = np.zeros(order.payload_bytes, np.uint8)
    try:
        if cold:
            drop_cached_pages(store, ext)
        else:
            engine.read_into(7, pieces, buffer, describe_extent=str)
            buffer[:] = 0
        missed = engine.read_into(7, pieces, buffer, describe_extent=str)
    finally:
        engine.close()
        files.close()
    # Neither eviction nor RWF_NOWAIT is exact (a page under writeback stays, a
    # locked folio is refused): cold means most pieces came from the device,
    # warm nearly all from the page cache.
    assert missed > len(pieces) // 2 if cold else missed < len(pieces) // 10
    assert bytes(buffer) == b"".join(contents[i] for i in ids.tolist())


@pytest.mark.parametrize("cold", [False, True])
def test_a_truncated_extent_in_a_window_of_many_pieces_is_reported(tmp_path, cold):
    sizes = [4096] * 200
    store, (ext, off, length, _crc), _ = write_samples(tmp_path, sizes, 1 << 20)
    os.truncate(store.extent_path(7, 0), int(off[150]) + 100)
    order = RequestOrder(ext[::2], off[::2], length[::2])  # 100 pieces, not adjacent
    files = ExtentFiles(store)
    engine = ReadEngine(files, threads=2)
    try:
        if cold:
            drop_cached_pages(store, ext)
        else:
            with open(store.extent_path(7, 0), "rb") as f:
                f.read()
        with pytest.raises(DataCorruption, match="truncated"):
            engine.read_into(7, order.pieces(0, order.payload_bytes),
                             np.zeros(order.payload_bytes, np.uint8),
                             describe_extent=lambda e: f"extent {e}")
    finally:
        engine.close()
        files.close()


def test_a_finished_threads_ring_closes_with_it():
    uring.for_this_thread()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):  # the data path serves each connection on a thread of its own
        thread = threading.Thread(target=uring.for_this_thread)
        thread.start()
        thread.join()
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_ring_that_fails_leaves_reads_to_preadv(tmp_path, monkeypatch):
    sizes = [4096] * 200
    store, (ext, off, length, _crc), contents = write_samples(tmp_path, sizes, 1 << 20)
    broken = uring.RingReads(entries=8)
    spare = os.open(store.extent_path(7, 0), os.O_RDONLY)
    monkeypatch.setattr(broken, "fd", spare)  # io_uring_enter on a plain file: EOPNOTSUPP
    monkeypatch.setattr(uring, "_refused", None)
    monkeypatch.setattr(uring, "for_this_thread",
                        lambda: None if uring._refused else broken)
    order = RequestOrder(ext[::2], off[::2], length[::2])
    files = ExtentFiles(store)
    engine = ReadEngine(files, threads=2)
    buffer = np.zeros(order.payload_bytes, np.uint8)
    try:
        for cold in (False, True):
            if cold:
                drop_cached_pages(store, ext)
            buffer[:] = 0
            engine.read_into(7, order.pieces(0, order.payload_bytes), buffer,
                             describe_extent=str)
            assert bytes(buffer) == b"".join(contents[::2])
            assert uring._refused is not None
    finally:
        engine.close()
        files.close()
        os.close(spare)
