"""Whole GET_BATCH replies sent from mappings of extents in one call of the C extension
(server/read/native_send.c through ExtentMaps.send_batch), against real extent files,
sockets and the page cache: the bytes against the protocol's own frames, what does not
qualify, a client that stops reading, a page that cannot be read, and mappings retired
while a send is in flight."""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time

import numpy as np
import pytest

from dlfs import limits
from dlfs.formats import datapath_frames as frames
from dlfs.formats.disk_layout import HEADER_BYTES, NO_EXTENT
from dlfs.server.read import mapped_sends
from dlfs.server.read.preadv_reads import ShortRead
from helpers.extent_maps import map_both_extents

native = mapped_sends.native
pytestmark = pytest.mark.skipif(native is None and os.environ.get("DLFS_NATIVE") == "0",
                                reason="DLFS_NATIVE=0: the daemon's C send is off")

WINDOW = 64 * 1024


class Dataset:
    """Per-sample columns of samples cut from the two extents' bodies."""

    def __init__(self, spec: list[tuple[int, int, int]]):
        self.spec = spec  # (extent, offset in its body, bytes) per sample id
        self.extent = np.array([e for e, _, _ in spec], dtype=np.uint32)
        self.offset = np.array([HEADER_BYTES + o for _, o, _ in spec], dtype=np.uint64)
        self.length = np.array([n for _, _, n in spec], dtype=np.uint64)
        self.crc = np.arange(len(spec), dtype=np.uint32) * 7919

    @property
    def columns(self):
        return self.extent, self.offset, self.length, self.crc

    def reply(self, bodies, ids, generation: int, flags: int, window: int = WINDOW) -> bytes:
        """The reply as dlfs/formats/datapath_frames.py frames it: BATCH, then DATA frames
        of at most `window` bytes."""
        payload = b"".join(bodies[self.spec[i][0]][self.spec[i][1]:self.spec[i][1] +
                                                   self.spec[i][2]] for i in ids)
        head = frames.batch_header(generation, self.length[ids], self.crc[ids], flags)
        out = b"".join(bytes(part) for part in head)
        for start in range(0, len(payload), window):
            part = payload[start:start + window]
            out += frames.data_frame(len(part)) + part
        return out


def samples(count: int, seed: int = 5, size_max: int = 9000) -> Dataset:
    """`count` samples of 0 to `size_max` bytes at random places of either extent."""
    rng = np.random.default_rng(seed)
    spec = []
    for _ in range(count):
        size = int(rng.integers(0, size_max)) if rng.random() > 0.05 else 0
        spec.append((int(rng.integers(0, 2)), int(rng.integers(0, 300_000 - size)), size))
    return Dataset(spec)


def send(maps, sock, dataset: Dataset, ids, *, generation: int = 9, flags: int = frames.BATCH_CRCS,
         window: int = WINDOW, large_ok: bool = True, payload_max: int = 1 << 40,
         stall_s: float = 10.0, before=None):
    return maps.send_batch(sock, 1, np.asarray(ids, dtype=np.int64), dataset.columns,
                           generation, flags, window_bytes=window, large_ok=large_ok,
                           payload_max=payload_max, stall_s=stall_s,
                           before=before or (lambda payload: None))


def drain(sock: socket.socket, into: list) -> threading.Thread:
    """A thread that reads `sock` until its peer closes or shuts down writing."""
    def run():
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                return
            into.append(chunk)
    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    return reader


@pytest.fixture
def ready(extents, wire, make_maps):
    """(maps with both extents mapped and scanned, here, there, the extents' bodies)."""
    assert native is not None, "the daemon's C send was not built"
    _, files, bodies = extents
    maps = make_maps(files)
    here, there = wire
    map_both_extents(maps, here, there)
    return maps, here, there, bodies


def test_the_layout_is_the_protocols():
    assert native is not None, "the daemon's C send was not built"
    assert (native.KIND_BATCH, native.KIND_DATA) == (frames.Kind.BATCH, frames.Kind.DATA)
    assert (native.FRAME_BYTES, native.BATCH_FIXED_BYTES) == (frames.FRAME.size,
                                                              frames.BATCH.size)
    assert native.NO_EXTENT == NO_EXTENT
    assert (native.T_BASE, native.T_SIZE, native.T_RESIDENT, native.T_RESIDENT_ENTRIES,
            native.T_WHOLE, native.T_USED, native.TABLE_COLUMNS) == (
        mapped_sends.TABLE_BASE, mapped_sends.TABLE_SIZE, mapped_sends.TABLE_RESIDENT,
        mapped_sends.TABLE_RESIDENT_ENTRIES, mapped_sends.TABLE_WHOLE, mapped_sends.TABLE_USED,
        mapped_sends.TABLE_COLUMNS)


def test_a_reply_is_the_frames_the_protocol_defines(ready):
    """Samples of both extents, duplicates, empty ones, samples across windows' ends:
    the BATCH frame and then a DATA frame per window, byte for byte."""
    maps, here, there, bodies = ready
    dataset = samples(400)
    rng = np.random.default_rng(1)
    for ids in (rng.permutation(400), np.concatenate([np.arange(50), np.arange(50)[::-1]]),
                rng.integers(0, 400, 300)):
        expected = dataset.reply(bodies, ids, 9, frames.BATCH_CRCS)
        got: list[bytes] = []
        reader = drain(there, got)
        paid = []
        sent = send(maps, here, dataset, ids, before=paid.append)
        here.shutdown(socket.SHUT_WR)
        reader.join(30)
        assert sent == int(dataset.length[ids].sum()) == paid[0]
        assert b"".join(got) == expected
        here, there = socket.socketpair()


def test_what_does_not_qualify_sends_nothing(ready, tmp_path):
    maps, here, there, _ = ready
    dataset = samples(64)
    ids = np.arange(64)
    outside = Dataset([*dataset.spec[:63], (0, 299_000, 5000)])  # past the extent's end
    remote = Dataset(dataset.spec)
    remote.extent[10] = NO_EXTENT  # stored by another member
    unmapped = Dataset(dataset.spec)
    unmapped.extent[3] = 2  # no such extent mapped
    large = Dataset([(0, 4096 * k, 70_000) for k in range(3)] * 6)
    cases = {
        "an id out of range": (dataset, [*ids[:-1], 64], {}),
        "a negative id": (dataset, [*ids[:-1], -1], {}),
        "a sample past its mapping": (outside, ids, {}),
        "a sample another member stores": (remote, ids, {}),
        "an extent not mapped": (unmapped, ids, {}),
        "fewer samples than a send from mappings takes": (
            dataset, ids[:limits.mapped_pieces_min - 1], {}),
        "large samples where only small ones may go": (large, np.arange(18),
                                                        {"large_ok": False}),
        "a reply over the payload limit": (dataset, ids, {"payload_max": 1000}),
        "no ids": (dataset, [], {}),
    }
    for what, (columns, batch, options) in cases.items():
        called = []
        assert send(maps, here, columns, batch, before=called.append, **options) == -1, what
        assert not called, what
        with pytest.raises(BlockingIOError):
            there.recv(1, socket.MSG_DONTWAIT)
    # Large samples go where they may (a client on this host over TCP).
    got: list[bytes] = []
    reader = drain(there, got)
    assert send(maps, here, large, np.arange(18)) == 18 * 70_000
    here.shutdown(socket.SHUT_WR)
    reader.join(30)


def send_drained(maps, here, there, dataset: Dataset, ids) -> tuple[int, bytes]:
    """`send` while a thread reads `there`: (what it returned, every byte `there` got
    until `here` shut down writing)."""
    got: list[bytes] = []
    reader = drain(there, got)
    sent = send(maps, here, dataset, ids)
    here.shutdown(socket.SHUT_WR)
    reader.join(30)
    return sent, b"".join(got)


def scanned_as(maps, monkeypatch, resident: np.ndarray) -> None:
    """Extent 0's row as a scan that found `resident` (its prefix sums) would leave it,
    and no scan after it to rewrite the row.  The caller keeps `resident` alive."""
    monkeypatch.setattr(maps, "_spend", lambda now: False)
    rows = maps._tables[1]
    with maps._lock:
        rows[0, mapped_sends.TABLE_RESIDENT] = resident.ctypes.data
        rows[0, mapped_sends.TABLE_RESIDENT_ENTRIES] = len(resident)
        rows[0, mapped_sends.TABLE_WHOLE] = 0


def test_a_page_the_last_scan_did_not_find_cached_is_left_to_the_python_path(ready,
                                                                            monkeypatch):
    maps, here, there, _ = ready
    # As a scan that found page 3 of extent 0 missing would leave it.
    resident = np.arange(maps._tables[1][0, mapped_sends.TABLE_SIZE] // 4096 + 2,
                         dtype=np.int32)
    resident[4:] -= 1
    scanned_as(maps, monkeypatch, resident)
    touching = Dataset([(0, 3 * 4096 - HEADER_BYTES + 10, 100)] * 20)
    assert send(maps, here, touching, np.arange(20)) == -1
    elsewhere = Dataset([(0, 8 * 4096, 100)] * 20)
    assert send_drained(maps, here, there, elsewhere, np.arange(20))[0] == 2000
    del resident


def test_ids_at_any_byte_of_the_request_frame_are_read_as_they_are(ready):
    """The daemon's ids are a view of the GET_BATCH frame right after its dataset name
    and request id, at any byte offset: the reply is the same as from aligned ids."""
    maps, here, there, bodies = ready
    dataset = samples(100)
    ids = np.random.default_rng(3).permutation(100)
    frame = b"".join(bytes(part) for part in frames.get_batch("abc", ids, generation=9))
    request = frames.parse_get_batch(frame[frames.FRAME.size:])
    assert request.ids.ctypes.data % 8, "the ids of this frame happen to be aligned"
    expected = dataset.reply(bodies, ids, 9, frames.BATCH_CRCS)
    assert send_drained(maps, here, there, dataset, request.ids) == (
        int(dataset.length[ids].sum()), expected)


def test_a_sample_past_its_scans_prefix_sums_is_left_to_the_python_path(ready, monkeypatch):
    """The C send reads a scan's prefix sums only below the count its row gives: a
    sample on a page the scan does not cover is not sent from the mappings (nothing
    past the array is read)."""
    maps, here, there, _ = ready
    resident = np.arange(9, dtype=np.int32)  # a scan of the first 8 pages, none missing
    scanned_as(maps, monkeypatch, resident)
    past = Dataset([(0, 8 * 4096, 100)] * 20)  # on page 8 or 9 of the extent file
    assert send(maps, here, past, np.arange(20)) == -1
    covered = Dataset([(0, 4096, 100)] * 20)
    assert send_drained(maps, here, there, covered, np.arange(20))[0] == 2000
    del resident


def test_a_client_that_stops_reading_is_timed_out_and_the_socket_kept_as_it_was(ready):
    maps, here, there, _ = ready
    dataset = samples(400)
    here.settimeout(7.0)  # non-blocking underneath, as the daemon's sockets are
    mode = fcntl.fcntl(here.fileno(), fcntl.F_GETFL)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="the client stopped reading the reply"):
        send(maps, here, dataset, np.tile(np.arange(400), 20), stall_s=0.3)
    assert 0.25 < time.monotonic() - started < 5
    assert fcntl.fcntl(here.fileno(), fcntl.F_GETFL) == mode
    assert here.gettimeout() == 7.0
    assert here.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16) == bytes(16)


def test_a_page_that_cannot_be_read_ends_the_frame_with_zeros_and_names_the_piece(
        extents, wire, make_maps):
    """An extent cut short under its mapping: the send fails where the kernel could not
    read (EFAULT), the DATA frame it was in is completed with zeros so the stream
    stays framed, and the ShortRead names the first piece past the file's end."""
    store, files, bodies = extents
    maps = make_maps(files)
    here, there = wire
    map_both_extents(maps, here, there)
    dataset = Dataset([(1, 1000 * k, 1000) for k in range(200)])  # 200 KB of extent 1
    cut = HEADER_BYTES + 150_000  # samples 150.. lie past the end
    os.truncate(store.extent_path(1, 1), cut)
    got: list[bytes] = []
    reader = drain(there, got)
    with pytest.raises(ShortRead) as failed:
        send(maps, here, dataset, np.arange(200), window=32 * 1024)
    here.shutdown(socket.SHUT_WR)
    reader.join(30)
    assert (failed.value.extent_no, failed.value.file_offset) == (1, HEADER_BYTES + 150_000)
    stream = b"".join(got)
    kind, _, body = frames.parse_frame(stream[:8])
    assert kind == frames.Kind.BATCH
    at = 8 + body
    payload = bytearray()
    while at < len(stream):  # whole frames only, each a window at most
        kind, _, body = frames.parse_frame(stream[at:at + 8])
        assert kind == frames.Kind.DATA and body <= 32 * 1024
        assert at + 8 + body <= len(stream), "a frame was left incomplete"
        payload += stream[at + 8:at + 8 + body]
        at += 8 + body
    assert at == len(stream)
    assert 0 < len(payload) < 200_000 and len(payload) % (32 * 1024) == 0
    good = bodies[1][:min(len(payload), 150_000)]
    sent = next((k for k in range(len(good)) if payload[k] != good[k]), len(good))
    assert not any(payload[sent:]), "after the last byte read come zeros only"


def test_a_mapping_retired_while_a_send_is_in_flight_outlives_the_send(ready):
    """A dataset forgotten (its extents retired) as a reply begins: the reply still goes
    out whole from the mappings, which are unmapped once it ended; later sends find
    no table."""
    maps, here, there, bodies = ready
    dataset = samples(400)
    ids = np.random.default_rng(2).permutation(400)
    expected = dataset.reply(bodies, ids, 9, frames.BATCH_CRCS)
    got: list[bytes] = []
    reader = drain(there, got)
    sent = send(maps, here, dataset, ids, before=lambda payload: maps.forget_dataset(1))
    here.shutdown(socket.SHUT_WR)
    reader.join(30)
    assert sent == int(dataset.length[ids].sum())
    assert b"".join(got) == expected
    assert maps.mapped_count() == 0 and not maps._graveyard
    assert send(maps, here, dataset, ids) == -1


def test_extents_sent_from_stay_mapped_and_idle_ones_are_unmapped(extents, wire,
                                                                  make_maps):
    """The marks a C send leaves count as a use: a mapping in steady use is kept past
    the idle time; once the sends stop it is unmapped."""
    _, files, _ = extents
    maps = make_maps(files, idle_s=0.3)
    here, there = wire
    map_both_extents(maps, here, there)
    dataset = Dataset([(0, 1000 * k, 100) for k in range(32)])  # extent 0 only
    got: list[bytes] = []
    reader = drain(there, got)
    until = time.monotonic() + 1.5
    while time.monotonic() < until:
        assert send(maps, here, dataset, np.arange(32)) == 3200
        time.sleep(0.02)
    assert ((0 in [key[1] for key in maps._maps]), maps.mapped_count()) == (True, 1)
    here.shutdown(socket.SHUT_WR)
    reader.join(30)
    give_up = time.monotonic() + 5
    while maps.mapped_count():
        assert time.monotonic() < give_up, "an idle mapping was never unmapped"
        time.sleep(0.05)
