"""The reader pool: order, bounded memory, errors in their turn, many opens in flight."""

from __future__ import annotations

import random
import threading
import time

import pytest

from dlfs.staging.read_pool import ReadPool
from dlfs.staging.source_files import SourceFile


def unit(index: int, chunks: int, chunk_bytes: int, delay_s: float = 0.0, fail: bool = False):
    file = SourceFile(f"f{index:05d}", f"/src/f{index:05d}", chunks * chunk_bytes, 0o100644, 0)

    def read(ctx):
        time.sleep(delay_s)
        if fail:
            raise OSError(5, f"cannot read {file.source}")
        for i in range(chunks):
            ctx.reserve(chunk_bytes)
            ctx.push(file if i == 0 else None, bytes([index % 251]) * chunk_bytes,
                     i == chunks - 1, chunk_bytes, chunk_bytes)
    return read


def collect(pool):
    out = []
    for file, data, last, _ in pool:
        if file is not None:
            out.append([file.path, 0])
        out[-1][1] += len(data)
        assert last == (out[-1][1] == 4 * 1000) or not last
    return out


def test_records_come_out_in_unit_order_whatever_order_they_are_read_in():
    rng = random.Random(3)
    units = [unit(i, rng.randint(1, 4), 1000, rng.uniform(0, 0.003)) for i in range(300)]
    with ReadPool(units, threads=16, chunk_bytes=1000) as pool:
        files = [f.path for f, _, _, _ in pool if f is not None]
    assert files == [f"f{i:05d}" for i in range(300)]


def test_memory_stays_within_the_budget_plus_the_head():
    chunk = 64 * 1024
    units = [unit(i, 8, chunk) for i in range(200)]
    budget, head = 1024 * 1024, 256 * 1024
    with ReadPool(units, threads=32, budget_bytes=budget, head_bytes=head,
                  chunk_bytes=chunk) as pool:
        for _ in pool:
            time.sleep(0.0002)  # a slow consumer: readers run ahead until the budget stops them
        assert pool.peak_bytes <= budget + head + chunk


def test_an_error_is_raised_in_its_turn_after_everything_before_it():
    units = [unit(i, 1, 10) for i in range(50)]
    units[30] = unit(30, 1, 10, fail=True)
    seen = []
    with ReadPool(units, threads=8, chunk_bytes=10) as pool:
        with pytest.raises(OSError, match="f00030"):
            for file, _, _, _ in pool:
                seen.append(file.path)
    assert seen == [f"f{i:05d}" for i in range(30)]


def test_opens_overlap_when_each_takes_a_millisecond():
    units = [unit(i, 1, 100, delay_s=0.002) for i in range(200)]
    started = time.perf_counter()
    with ReadPool(units, threads=32, chunk_bytes=100) as pool:
        count = sum(1 for f, *_ in pool if f is not None)
    assert count == 200
    assert time.perf_counter() - started < 200 * 0.002 / 4  # one at a time would take 0.4 s


def test_closing_early_stops_the_readers():
    units = [unit(i, 4, 1000, delay_s=0.001) for i in range(10_000)]
    before = threading.active_count()
    pool = ReadPool(units, threads=8, chunk_bytes=1000)
    for n, _ in enumerate(pool):
        if n == 20:
            break
    pool.close()
    assert threading.active_count() <= before


def test_a_unit_larger_than_the_budget_still_goes_through():
    units = [unit(0, 3, 4096), unit(1, 50, 4096), unit(2, 1, 4096)]
    with ReadPool(units, threads=2, budget_bytes=4096, head_bytes=4096, chunk_bytes=4096) as pool:
        sizes = {}
        current = None
        for file, data, _, _ in pool:
            current = file.path if file is not None else current
            sizes[current] = sizes.get(current, 0) + len(data)
    assert sizes == {"f00000": 3 * 4096, "f00001": 50 * 4096, "f00002": 4096}
