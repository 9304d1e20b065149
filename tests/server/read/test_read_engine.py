"""Batch planning and the read engine against real extent files."""

from __future__ import annotations

import os
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlfs import limits
from dlfs.errors import DataCorruption, DeadlineExceeded
from dlfs.formats.disk_layout import HEADER_BYTES
from dlfs.server.core.extents import ExtentFiles
from dlfs.server.read.batch_planning import plan_batch
from dlfs.server.read.read_engine import ReadEngine
from helpers.extents import drop_cached_pages, write_samples


def read_all(engine, plan, verify=True):
    payload = bytearray(plan.payload_bytes)
    position = 0
    for start, window in engine.stream(7, plan, verify=verify, describe=lambda i: f"sample {i}"):
        assert start == position
        payload[start:start + len(window)] = window
        position += len(window)
    assert position == plan.payload_bytes
    return payload


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 20000), min_size=1, max_size=40),
       data=st.data(),
       gap=st.sampled_from([0, 100, 5000]),
       range_max=st.sampled_from([1, 4096, 1 << 20]),
       chunk=st.sampled_from([4096, 10000, 1 << 20]),
       threads=st.sampled_from([1, 3, 32]),
       share_bytes=st.sampled_from([1, 4096, limits.reader_share_bytes_min]),
       cold=st.booleans())
def test_stream_returns_every_requested_sample(tmp_path_factory, sizes, data, gap, range_max,
                                               chunk, threads, share_bytes, cold):
    store, (ext, off, length, crc), contents = write_samples(tmp_path_factory.mktemp("x"), sizes)
    if cold:  # the reader threads read what the page cache lacks
        drop_cached_pages(store, ext)
    ids = np.array(data.draw(st.lists(st.integers(0, len(sizes) - 1), min_size=1, max_size=80)))
    plan = plan_batch(ids, ext, off, length, crc, coalesce_gap_bytes=gap,
                      range_bytes_max=range_max)
    # Ranges never overlap in a file and cover every unique sample.
    assert sorted(set(ids.tolist())) == sorted(plan.sample_ids.tolist())
    assert plan.payload_bytes == int(plan.range_length.sum())
    files = ExtentFiles(store, open_extents_max=2)
    engine = ReadEngine(files, threads=threads, chunk_bytes=chunk)
    try:
        # Small shares split a window among many threads, as a large cold one is.
        with mock.patch.object(limits, "reader_share_bytes_min", share_bytes):
            payload = read_all(engine, plan)
    finally:
        engine.close()
        files.close()
    got = [bytes(payload[o:o + n]) for o, n in zip(plan.request_offsets.tolist(),
                                                      plan.request_lengths.tolist())]
    assert got == [contents[i] for i in ids]


def test_adjacent_samples_coalesce_into_one_range(tmp_path):
    store, (ext, off, length, crc), _ = write_samples(tmp_path, [100] * 10, 1 << 20)
    plan = plan_batch(np.array([9, 0, 3, 2, 1, 1]), ext, off, length, crc)
    assert plan.ranges == 2  # 0..3 back to back, then 9
    assert plan.payload_bytes == 500
    plan = plan_batch(np.array([0, 2, 4]), ext, off, length, crc, coalesce_gap_bytes=100)
    assert plan.ranges == 1 and plan.payload_bytes == 500  # gaps read, not requested


def test_checksum_mismatch_names_the_sample(tmp_path):
    store, (ext, off, length, crc), contents = write_samples(tmp_path, [3000, 3000, 3000], 1 << 20)
    path = store.extent_path(7, 0)
    with open(path, "r+b") as f:
        f.seek(int(off[1]) + 10)
        byte = f.read(1)
        f.seek(int(off[1]) + 10)
        f.write(bytes([byte[0] ^ 0xFF]))
    files = ExtentFiles(store)
    engine = ReadEngine(files, threads=4)
    try:
        with pytest.raises(DataCorruption, match="checksum mismatch for sample 1"):
            read_all(engine, plan_batch(np.array([0, 1, 2]), ext, off, length, crc))
        ok = read_all(engine, plan_batch(np.array([0, 2]), ext, off, length, crc))
        assert bytes(ok) == contents[0] + contents[2]
        unverified = read_all(engine, plan_batch(np.array([1]), ext, off, length, crc), verify=False)
        assert bytes(unverified) != contents[1] and len(unverified) == 3000
    finally:
        engine.close()
        files.close()


def test_truncated_extent_is_reported_not_padded(tmp_path):
    store, (ext, off, length, crc), _ = write_samples(tmp_path, [5000, 5000], 1 << 20)
    os.truncate(store.extent_path(7, 0), int(off[1]) + 100)
    files = ExtentFiles(store)
    engine = ReadEngine(files, threads=2)
    try:
        with pytest.raises(DataCorruption, match="truncated.*sample 1"):
            read_all(engine, plan_batch(np.array([1]), ext, off, length, crc))
    finally:
        engine.close()
        files.close()


def test_damaged_extent_header_is_detected(tmp_path):
    store, (ext, off, length, crc), _ = write_samples(tmp_path, [10], 1 << 20)
    with open(store.extent_path(7, 0), "r+b") as f:
        f.write(b"XXXX")
    files = ExtentFiles(store)
    engine = ReadEngine(files, threads=2)
    try:
        with pytest.raises(DataCorruption, match="damaged header"):
            read_all(engine, plan_batch(np.array([0]), ext, off, length, crc))
    finally:
        engine.close()
        files.close()


def test_large_samples_get_their_own_extent_and_stream_in_windows(tmp_path):
    sizes = [10, 200_000, 10]
    store, (ext, off, length, crc), contents = write_samples(tmp_path, sizes, 64 * 1024)
    assert ext.tolist() == [0, 1, 2] and off.tolist() == [HEADER_BYTES] * 3
    files = ExtentFiles(store)
    engine = ReadEngine(files, threads=4, chunk_bytes=8192)
    try:
        plan = plan_batch(np.array([1, 0, 2]), ext, off, length, crc, range_bytes_max=4096)
        payload = read_all(engine, plan)
        windows = list(engine.stream(7, plan, verify=True, describe=str))
        assert len(windows) == -(-plan.payload_bytes // 8192)
    finally:
        engine.close()
        files.close()
    got = [bytes(payload[o:o + n]) for o, n in zip(plan.request_offsets.tolist(),
                                                      plan.request_lengths.tolist())]
    assert got == [contents[1], contents[0], contents[2]]


def test_deadline_stops_a_long_stream(tmp_path):
    store, (ext, off, length, crc), _ = write_samples(tmp_path, [50_000] * 4, 1 << 20)
    files = ExtentFiles(store)
    engine = ReadEngine(files, threads=2, chunk_bytes=4096)
    try:
        plan = plan_batch(np.arange(4), ext, off, length, crc)
        with pytest.raises(DeadlineExceeded):
            list(engine.stream(7, plan, verify=True, describe=str, deadline=0.0))
    finally:
        engine.close()
        files.close()


def test_handle_cache_stays_bounded(tmp_path):
    store, (ext, off, length, crc), _ = write_samples(tmp_path, [30_000] * 10, 32 * 1024)
    files = ExtentFiles(store, open_extents_max=3)
    engine = ReadEngine(files, threads=4)
    try:
        read_all(engine, plan_batch(np.arange(10), ext, off, length, crc))
        assert files.open_count() <= 3
    finally:
        engine.close()
        files.close()


def test_byte_budget_makes_slow_readers_push_back(tmp_path):
    import time as _time

    from dlfs.errors import Overloaded

    store, (ext, off, length, crc), contents = write_samples(tmp_path, [50_000] * 8, 1 << 20)
    files = ExtentFiles(store)
    engine = ReadEngine(files, threads=2, chunk_bytes=65536, inflight_bytes_max=65536)
    try:
        plan = plan_batch(np.arange(8), ext, off, length, crc)
        slow = engine.stream(7, plan, verify=True, describe=str)
        next(slow)  # a client that took one window and stopped reading
        assert engine.budget.free == 0
        blocked = engine.stream(7, plan, verify=True, describe=str,
                                deadline=_time.monotonic() + 0.2)
        with pytest.raises(Overloaded, match="--inflight-bytes-max"):
            next(blocked)
        slow.close()  # the slow client goes away: its window is released
        assert engine.budget.free == engine.budget.total
        payload = read_all(engine, plan)  # and everyone else proceeds, one window at a time
        got = [bytes(payload[o:o + n]) for o, n in zip(plan.request_offsets.tolist(),
                                                          plan.request_lengths.tolist())]
        assert got == contents
        assert engine.budget.free == engine.budget.total
    finally:
        engine.close()
        files.close()
