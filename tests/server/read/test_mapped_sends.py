"""Windows of small cached samples sent from read-only mappings of their extents
(server/read/mapped_sends.py), against real extent files, sockets and the page cache."""

from __future__ import annotations

import os
import socket
import threading
import time

import numpy as np
import pytest

from dlfs.formats.disk_layout import HEADER_BYTES
from dlfs.server.read.batch_planning import PieceColumns
from dlfs.server.read.preadv_reads import ShortRead
from helpers.extent_maps import map_both_extents, mapped_when_ready, pieces_of, receive
from helpers.page_cache import cached


def received_during(there: socket.socket, size: int, send) -> tuple[object, bytes | None]:
    """(what `send()` returned, the `size` bytes `there` received meanwhile, None if
    fewer came): a send over the socket buffer needs a reader at the other end."""
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(receive(there, size)))
    reader.start()
    result = send()
    reader.join(30)
    return result, got[0] if got else None


def test_a_window_of_two_extents_goes_out_in_window_order(extents, wire, make_maps):
    _, files, bodies = extents
    spec = [(1, 5_000, 4096), (0, 200_000, 4096), (0, 7, 1), (1, 0, 10_000), (0, 123, 4096)]
    expected = b"HEAD" + b"".join(bodies[e][o:o + n] for e, o, n in spec)
    maps = make_maps(files)
    here, there = wire
    assert not maps.send(here, 1, pieces_of(spec), b"HEAD")  # nothing mapped yet
    mapped_when_ready(maps, lambda: maps.send(here, 1, pieces_of(spec), b"HEAD"))
    assert maps.mapped_count() == 2
    assert receive(there, len(expected)) == expected
    # Mapped now: every send goes this way, each piece from its place.
    for _ in range(20):
        assert maps.send(here, 1, pieces_of(spec), b"HEAD")
        assert receive(there, len(expected)) == expected


@pytest.mark.parametrize("extent_count", [1, 2])
def test_a_window_over_the_socket_buffer_goes_out_whole_across_partial_sends(
        extents, wire, make_maps, extent_count):
    """A window the socket cannot take in one call is finished piece by piece from
    where each partial `sendmsg` stopped (mid-piece too), in order: from one extent
    (the common case's shorter path) and from two.  The rest goes out blocking
    under SO_SNDTIMEO; the socket's timeout and SO_SNDTIMEO are put back."""
    _, files, bodies = extents
    rng = np.random.default_rng(5)
    spec = [(int(e), int(o), int(n)) for e, o, n in zip(
        rng.integers(0, extent_count, 600), rng.integers(0, 290_000, 600), rng.integers(1, 10_000, 600))]
    expected = b"HEAD" + b"".join(bodies[e][o:o + n] for e, o, n in spec)
    maps = make_maps(files)
    here, there = wire
    here.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    here.settimeout(7.0)
    map_both_extents(maps, here, there)
    sent, got = received_during(there, len(expected), lambda: maps.send(
        here, 1, pieces_of(spec), b"HEAD", deadline=time.monotonic() + 30))
    assert sent and len(expected) > 1_000_000 and got == expected
    # The send blocked in the kernel for the rest; the socket is left as it was found.
    assert here.gettimeout() == 7.0
    assert here.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16) == bytes(16)


def framed(spec: list[tuple[int, int, int]], window: int, bodies: dict[int, bytes]
           ) -> tuple[PieceColumns, list[tuple[int, bytes]], bytes]:
    """(pieces cut at every `window` bytes of the payload, a head per window after the
    first, the bytes a send of them with b"HEAD" first must put on the wire)."""
    payload = b"".join(bodies[e][o:o + n] for e, o, n in spec)
    cuts, at = [], 0
    for e, o, n in spec:
        while n:
            take = min(n, window - at % window)
            cuts.append((e, o, take))
            e, o, n, at = e, o + take, n - take, at + take
    heads = [(start, f"<{start}>".encode()) for start in range(window, len(payload), window)]
    wire = b"HEAD" + b"".join(
        (dict(heads).get(start, b"") + payload[start:start + window])
        for start in range(0, len(payload), window))
    return pieces_of(cuts), heads, wire


@pytest.mark.parametrize("socket_buffer", [None, 64 * 1024])
def test_several_windows_go_out_in_one_send_each_after_its_head(extents, wire, make_maps,
                                                               socket_buffer):
    """A reply of several windows in one send: each later head goes out right before the
    first byte of its window, also when the socket takes the send in many parts."""
    _, files, bodies = extents
    rng = np.random.default_rng(8)
    spec = [(int(e), int(o), int(n)) for e, o, n in zip(
        rng.integers(0, 2, 300), rng.integers(0, 290_000, 300), rng.integers(1, 10_000, 300))]
    pieces, heads, expected = framed(spec, 100_000, bodies)
    assert len(heads) > 5
    maps = make_maps(files)
    here, there = wire
    if socket_buffer:
        here.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, socket_buffer)
    map_both_extents(maps, here, there)
    sent, got = received_during(there, len(expected), lambda: maps.send(
        here, 1, pieces, b"HEAD", later_heads=heads, deadline=time.monotonic() + 30))
    assert sent and got == expected


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Both ends of a loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        here = socket.create_connection(listener.getsockname())
        there, _ = listener.accept()
    return here, there


@pytest.mark.parametrize("family", ["unix", "tcp"])
def test_a_page_that_cannot_be_read_completes_its_own_frame_only(extents, wire, make_maps,
                                                                  family):
    """A fault in the second of four windows sent in one go: the frames before the one
    the send stopped in went out whole, that one is completed with zeros after its
    head, none starts after it, and ShortRead names the piece past the file's end.
    The kernel drops the whole copy a fault falls in (a Unix socket's call, TCP's
    chunk of up to 64 KiB), so the send may stop in the first window."""
    store, files, bodies = extents
    maps = make_maps(files)
    here, there = wire if family == "unix" else tcp_pair()
    spec = [(1, 0, 60_000), (0, 0, 100_000), (1, 100_000, 90_000)]  # windows of 80,000
    pieces, heads, expected = framed(spec, 80_000, bodies)
    frame_ends = [4 + 80_000]
    for _, head in heads:
        frame_ends.append(frame_ends[-1] + len(head) + 80_000)
    map_both_extents(maps, here, there)
    sent, got = received_during(there, len(expected), lambda: maps.send(
        here, 1, pieces, b"HEAD", later_heads=heads))
    assert sent and got == expected
    os.truncate(store.extent_path(1, 0), HEADER_BYTES + 30_000)  # past payload 90,000
    streams: list[bytes] = []
    reader = threading.Thread(target=lambda: streams.append(receive_all(there)))
    reader.start()
    with pytest.raises(ShortRead) as raised:
        maps.send(here, 1, pieces, b"HEAD", later_heads=heads)
    here.close()
    reader.join(30)
    stream = streams[0]
    assert len(stream) in frame_ends[:2]
    frame_start = 0 if len(stream) == frame_ends[0] else frame_ends[0] + len(heads[0][1])
    assert stream[:frame_start] == expected[:frame_start]  # earlier frames, heads: whole
    last = stream[frame_start:]
    differ = next((i for i, (a, b) in enumerate(zip(last, expected[frame_start:])) if a != b),
                  len(last))
    assert last[differ:] == bytes(len(last) - differ)  # the rest of its frame: zeros
    short = raised.value
    assert (short.extent_no, short.file_offset, short.wanted, short.got) == \
        (0, HEADER_BYTES + 20_000, 80_000, 10_000)
    there.close()


def receive_all(sock: socket.socket) -> bytes:
    """Every byte until the peer closes."""
    got = bytearray()
    while chunk := sock.recv(1 << 20):
        got += chunk
    return bytes(got)


def test_pages_the_cache_does_not_hold_take_the_read_path(extents, wire, make_maps):
    """An extent mostly out of the cache is mapped without being read in, and a window
    goes out from it only once every page it needs was cached at the last scan."""
    store, files, bodies = extents
    path = store.extent_path(1, 0)
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    assert not cached(path, HEADER_BYTES, 300_000)
    maps = make_maps(files)
    here, there = wire
    spec = [(0, 0, 4096)]
    for _ in range(30):
        assert not maps.send(here, 1, pieces_of(spec), b"HEAD")
        time.sleep(0.01)
    # Mapping it read nothing in: the rest of the extent is as uncached as before.
    assert not cached(path, HEADER_BYTES + 100_000, 100_000)
    os.pread(fd, 4096, HEADER_BYTES)  # what the read path would have cached
    os.close(fd)
    mapped_when_ready(maps, lambda: maps.send(here, 1, pieces_of(spec), b"HEAD"))
    assert receive(there, 4100) == b"HEAD" + bodies[0][:4096]
    assert not maps.send(here, 1, pieces_of([(0, 150_000, 4096)]), b"HEAD")


def mapped_rss_kib(path: str) -> int:
    """KiB of this process's mappings of `path` resident in its page tables."""
    rss, in_it = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            if "-" in line.split(" ", 1)[0]:  # a mapping's header line
                in_it = line.rstrip().endswith(path)
            elif in_it and line.startswith("Rss:"):
                rss += int(line.split()[1])
    return rss


def test_residency_of_sendfile_windows_comes_from_unpopulated_mappings_scans(extents,
                                                                             make_maps):
    """`resident` answers from the last scans of mappings made for that alone (no page
    table filled): None before an extent is mapped, True while its pages are
    cached, False once a rescan found some gone, None outside the file."""
    store, files, _ = extents
    maps = make_maps(files)
    extent = np.array([0, 1, 0], dtype=np.int64)
    offset = np.array([HEADER_BYTES, HEADER_BYTES + 5_000, HEADER_BYTES + 200_000])
    size = np.array([100_000, 90_000, 50_000])
    assert maps.resident(1, extent, offset, size) is None  # not mapped: ask the kernel
    maps.map_soon(1, extent, populate=False)
    give_up = time.monotonic() + 5
    while maps.resident(1, extent, offset, size) is None:
        assert time.monotonic() < give_up, "the extents were never mapped and scanned"
        time.sleep(0.01)
    assert maps.resident(1, extent, offset, size) is True
    path = store.extent_path(1, 0)
    assert mapped_rss_kib(path) == 0  # mapped for its scans only
    assert maps.resident(1, extent[:1], np.array([HEADER_BYTES + 299_000]),
                         np.array([5_000])) is None  # past the end: the kernel knows
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    assert not cached(path, HEADER_BYTES, 300_000)
    give_up = time.monotonic() + 5
    while maps.resident(1, extent, offset, size):  # asks for a rescan once it is stale
        assert time.monotonic() < give_up, "no rescan found the pages gone"
        time.sleep(0.05)
    assert maps.resident(1, extent[1:2], offset[1:2], size[1:2]) is True  # the other extent


def test_sends_that_do_not_map_missing_extents_leave_them_to_map_soon(extents, wire,
                                                                      make_maps):
    """Large samples' windows (`map_missing=False`) never map an extent themselves;
    `map_soon` maps one the page cache holds whole, and not one it holds in part."""
    store, files, bodies = extents
    maps = make_maps(files)
    here, there = wire
    spec = [(0, 0, 100_000), (0, 150_000, 100_000)]
    for _ in range(30):
        assert not maps.send(here, 1, pieces_of(spec), b"HEAD", map_missing=False)
        time.sleep(0.01)
    assert maps.mapped_count() == 0
    # Extent 1 mostly out of the cache: asked to map both, only extent 0 is mapped.
    fd = os.open(store.extent_path(1, 1), os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.pread(fd, 4096, HEADER_BYTES)
    os.close(fd)
    maps.map_soon(1, np.array([0, 1, 0]))
    mapped_when_ready(maps, lambda: maps.send(here, 1, pieces_of(spec), b"HEAD",
                                              map_missing=False))
    assert receive(there, 200_004) == b"HEAD" + bodies[0][:100_000] + bodies[0][150_000:250_000]
    time.sleep(0.2)  # the thread had its turn at extent 1 too
    assert maps.mapped_count() == 1
    assert not maps.send(here, 1, pieces_of([(1, 0, 4096)]), b"HEAD", map_missing=False)


def test_idle_mappings_are_unmapped_and_their_pages_can_be_dropped_again(extents, wire, make_maps):
    store, files, _ = extents
    maps = make_maps(files, idle_s=0.3)
    here, there = wire
    path = store.extent_path(1, 0)
    spec = [(0, 100_000, 4096)]
    mapped_when_ready(maps, lambda: maps.send(here, 1, pieces_of(spec), b"HEAD"))
    receive(there, 4100)
    # While mapped, DONTNEED cannot drop the pages (they are mapped).
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    assert cached(path, HEADER_BYTES + 100_000, 4096)
    give_up = time.monotonic() + 5
    while maps.mapped_count():
        assert time.monotonic() < give_up, "an idle mapping stayed"
        time.sleep(0.05)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    assert not cached(path, HEADER_BYTES + 100_000, 4096)


def test_a_forgotten_dataset_is_unmapped_at_once(extents, wire, make_maps):
    store, files, _ = extents
    maps = make_maps(files)
    here, there = wire
    spec = [(0, 0, 100), (1, 0, 100)]
    mapped_when_ready(maps, lambda: maps.send(here, 1, pieces_of(spec), b"HEAD"))
    receive(there, 204)
    maps.forget_dataset(1)
    assert maps.mapped_count() == 0
    assert maps.mapped_bytes == 0


def test_an_extent_cut_short_under_its_mapping_pads_the_window_and_says_so(
        extents, wire, make_maps):
    """The kernel, not the daemon, touches the mapping: a page past the file's new end
    fails the send with EFAULT (no SIGBUS), and the window keeps its announced length."""
    store, files, bodies = extents
    maps = make_maps(files)
    here, there = wire
    spec = [(0, 0, 100_000), (0, 200_000, 50_000)]
    total = 4 + 150_000
    mapped_when_ready(maps, lambda: maps.send(here, 1, pieces_of(spec), b"HEAD"))
    receive(there, total)
    os.truncate(store.extent_path(1, 0), HEADER_BYTES + 20_000)
    with pytest.raises(ShortRead) as raised:
        maps.send(here, 1, pieces_of(spec), b"HEAD")
    got = receive(there, total)
    assert got[:4] == b"HEAD"
    # What went out before the fault is the extent's (a Unix socket sends none of
    # it: the whole call fails); the rest is zeros.
    assert got[4:4 + 20_000] in (bodies[0][:20_000], bytes(20_000))
    assert got[-50_000:] == bytes(50_000)
    assert raised.value.extent_no == 0


def test_a_client_that_stops_reading_times_out_and_releases_the_mapping(extents, wire, make_maps):
    _, files, _ = extents
    maps = make_maps(files)
    here, there = wire
    spec = [(0, 0, 250_000)]
    mapped_when_ready(maps, lambda: maps.send(here, 1, pieces_of([(0, 0, 10)]), b"H"))
    receive(there, 11)
    here.settimeout(0.3)
    started = time.monotonic()
    with pytest.raises(socket.timeout):
        for _ in range(100):  # the socket buffers fill; then the wait times out
            maps.send(here, 1, pieces_of(spec), b"HEAD")
    assert time.monotonic() - started < 10
    assert all(m.users == 0 for m in maps._maps.values())
    # A deadline bounds the whole send, however the client trickles.
    here.settimeout(None)
    with pytest.raises(socket.timeout):
        maps.send(here, 1, pieces_of(spec), b"HEAD", deadline=time.monotonic() + 0.2)


def test_extents_beyond_the_mapped_bytes_bound_take_the_read_path(extents, wire, make_maps):
    _, files, _ = extents
    maps = make_maps(files, mapped_bytes_max=400_000)  # one extent, not two
    here, there = wire
    one, both = [(0, 0, 4096)], [(0, 0, 4096), (1, 0, 4096)]
    mapped_when_ready(maps, lambda: maps.send(here, 1, pieces_of(one), b"HEAD"))
    receive(there, 4100)
    for _ in range(30):
        assert not maps.send(here, 1, pieces_of(both), b"HEAD")
        time.sleep(0.01)
    assert maps.mapped_count() == 1 and maps.mapped_bytes <= 400_000
