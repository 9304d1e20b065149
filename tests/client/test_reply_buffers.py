"""The reply buffer pool: reuse once unreferenced, reserved buffers, bounds."""

from __future__ import annotations

import gc

from dlfs.client.reply_buffers import BufferPool

MiB = 1024 * 1024


def test_a_buffer_is_reused_only_once_nothing_references_it():
    pool = BufferPool()
    first = pool.take(3 * MiB)
    view = memoryview(first)[10:20]
    del first
    gc.collect()
    second = pool.take(3 * MiB)  # the first is still referenced by `view`
    assert pool.allocations == 2
    del view, second
    gc.collect()
    assert pool.idle_bytes == 2 * 4 * MiB  # both back, in the 4 MiB class
    pool.take(4 * MiB)
    assert pool.allocations == 2


def test_reserved_buffers_serve_the_first_replies():
    pool = BufferPool()
    assert pool.reserve(16 * MiB, 3) == 3
    held = [pool.take(16 * MiB) for _ in range(3)]
    assert pool.allocations == 0 and pool.idle_bytes == 0
    pool.take(MiB)  # another size class: made
    assert pool.allocations == 1
    del held


def test_reserve_stays_within_the_idle_bound():
    pool = BufferPool(idle_bytes_max=40 * MiB)
    assert pool.reserve(16 * MiB, 5) == 2
    assert pool.idle_bytes == 32 * MiB
