"""Prefetch hints in the daemon: skipped when cached, advised in one submission when
not, and dropped with the reply saying so when the queue is full (real extents,
a real data path over loopback TCP)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from dlfs.server.read import uring
from dlfs.client.reply_buffers import BufferPool
from dlfs.client.transport.datapath_pool import DataPath, endpoints
from dlfs.client.transport.datapath_transport import DataPathHint
from dlfs.server.config import ServerConfig
from dlfs.server.datapath.listener import DataPathServer
from dlfs.server.core.extents import ExtentFiles
from dlfs.server.read.batch_planning import plan_batch
from dlfs.server.read.prefetch import Prefetcher
from dlfs.server.store import Store
from helpers.page_cache import cached
from helpers.extents import drop_cached_pages, write_samples


def resident(store, extent_no: int, offset: int) -> bool:
    """Whether the page cache holds the byte at `offset` of dataset 7's extent."""
    return cached(store.extent_path(7, extent_no), offset)


@pytest.mark.skipif(uring.for_this_thread() is None, reason="this kernel refuses io_uring")
def test_a_cold_hint_is_advised_and_a_cached_one_skipped(tmp_path):
    store, (ext, off, length, crc), _ = write_samples(tmp_path, [20_000] * 50, 1 << 20)
    files = ExtentFiles(store)
    prefetcher = Prefetcher(files)
    try:
        drop_cached_pages(store, ext)
        ids = np.arange(0, 50, 2)
        prefetcher.submit(7, plan_batch(ids, ext, off, length, crc))
        deadline = time.monotonic() + 10
        while not all(resident(store, int(ext[i]), int(off[i]) + 10_000) for i in ids):
            assert time.monotonic() < deadline, "the hinted samples never reached the page cache"
            time.sleep(0.01)
        assert prefetcher.ranges_advised >= 1 and prefetcher.hints_cached == 0
        prefetcher.submit(7, plan_batch(ids, ext, off, length, crc))
        while prefetcher.hints_cached == 0:
            assert time.monotonic() < deadline, "a cached hint was advised again"
            time.sleep(0.01)
    finally:
        prefetcher.close()
        files.close()


def test_a_hint_the_full_queue_drops_is_reported_in_the_reply(tmp_path, monkeypatch):
    store = Store.open(ServerConfig(data_dir=str(tmp_path / "data")))
    session = store.ingests.begin("ds")
    for i in range(8):
        session.start_file(f"f{i}", 1000, 0o100644, 1)
        session.write(bytes([i]) * 1000)
    store.ingests.commit(session)
    release = threading.Event()
    monkeypatch.setattr(store.reads.prefetcher, "_advise", lambda *_: release.wait(30))
    server = DataPathServer(store, tcp_host="127.0.0.1", tcp_port=0, unix_socket="",
                            instance=b"i" * 16, connections_max=4, idle_timeout_s=30,
                            stall_timeout_s=30, buffer_bytes_max=64 << 20)
    server.start()
    data = DataPath(endpoints("127.0.0.1:1", server.port, ""),
                    hint=DataPathHint(server.port, "", b"i" * 16), token="",
                    connect_timeout_s=5, reply_timeout_s=30, pool=BufferPool())
    try:
        answers = [data.get_batch("ds", np.array([1]), hints=np.array([2, 3]))
                   for _ in range(70)]  # one taken by the stalled thread, 64 queued, the rest dropped
        assert [bytes(a.samples[0]) for a in answers] == [bytes([1]) * 1000] * 70
        dropped = [a.hints_dropped for a in answers]
        assert not any(dropped[:60]) and all(dropped[66:])
    finally:
        release.set()
        data.close()
        server.stop()
        store.close()


def _ingested_store(tmp_path, **config) -> Store:
    store = Store.open(ServerConfig(data_dir=str(tmp_path / "data"), **config))
    session = store.ingests.begin("ds")
    for i in range(8):
        session.start_file(f"f{i}", 1000, 0o100644, 1)
        session.write(bytes([i]) * 1000)
    store.ingests.commit(session)
    return store


def _data_path(server) -> DataPath:
    return DataPath(endpoints("127.0.0.1:1", server.port, ""),
                    hint=DataPathHint(server.port, "", b"i" * 16), token="",
                    connect_timeout_s=5, reply_timeout_s=30, pool=BufferPool())


def _server(store) -> DataPathServer:
    server = DataPathServer(store, tcp_host="127.0.0.1", tcp_port=0, unix_socket="",
                            instance=b"i" * 16, connections_max=4, idle_timeout_s=30,
                            stall_timeout_s=30, buffer_bytes_max=64 << 20)
    server.start()
    return server


def test_hints_sent_without_waiting_are_answered_before_the_next_read(tmp_path, monkeypatch):
    # io_uring off: no hint is found cached and settled in place, so every one
    # meets the stalled prefetch thread's queue.
    store = _ingested_store(tmp_path, io_uring=False)
    release = threading.Event()
    monkeypatch.setattr(store.reads.prefetcher, "_advise", lambda *_: release.wait(30))
    server = _server(store)
    data = _data_path(server)
    try:
        for _ in range(70):  # one taken by the stalled thread, 64 queued, 5 dropped
            data.send_hints("ds", np.array([2, 3]))
        # The same (only) pooled connection: its 8 unanswered replies are read first.
        answer = data.get_batch("ds", np.array([1, 5]))
        assert [bytes(s) for s in answer.samples] == [bytes([1]) * 1000, bytes([5]) * 1000]
        assert data.hints_dropped == 5
    finally:
        release.set()
        data.close()
        server.stop()
        store.close()


def test_a_refused_hint_sent_without_waiting_leaves_the_connection_usable(tmp_path):
    store = _ingested_store(tmp_path)
    server = _server(store)
    data = _data_path(server)
    try:
        data.send_hints("no-such-dataset", np.array([0]))  # answered NOT_FOUND, dropped
        data.send_hints("ds", np.array([7]))
        assert bytes(data.get_batch("ds", np.array([4])).samples[0]) == bytes([4]) * 1000
        assert data.hints_dropped == 0
    finally:
        data.close()
        server.stop()
        store.close()


def test_a_cached_hint_alone_is_settled_by_the_serving_thread(tmp_path, monkeypatch):
    store = _ingested_store(tmp_path)
    if uring.for_this_thread() is None:
        pytest.skip("this kernel refuses io_uring")
    handed_on = []
    monkeypatch.setattr(store.reads.prefetcher, "_advise", lambda *args: handed_on.append(args))
    server = _server(store)
    data = _data_path(server)
    try:
        data.get_batch("ds", np.arange(8))  # in the page cache now
        assert not data.get_batch("ds", np.empty(0, np.int64),
                                  hints=np.arange(8)).hints_dropped
        assert store.reads.prefetcher.hints_cached == 1 and handed_on == []
    finally:
        data.close()
        server.stop()
        store.close()
