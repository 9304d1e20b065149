"""RequestOrder: the file pieces of any window of a request-ordered payload."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dlfs.server.read.batch_planning import RequestOrder

FILE_BYTES = 4096


def payload_from_pieces(order: RequestOrder, files: dict[int, bytes], window: int) -> bytes:
    """Assemble the payload window by window from the pieces, as the daemon does."""
    out = bytearray()
    for start, stop in order.windows(window):
        buffer = bytearray(stop - start)
        covered = np.zeros(stop - start, dtype=int)
        last = (-1, -1)
        for extent, file_offset, window_offset, size in order.pieces(start, stop):
            assert (extent, file_offset) >= last  # storage order
            last = (extent, file_offset)
            buffer[window_offset:window_offset + size] = files[extent][file_offset:
                                                                    file_offset + size]
            covered[window_offset:window_offset + size] += 1
        assert (covered == 1).all()  # every byte of the window exactly once
        out += buffer
    return bytes(out)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, FILE_BYTES - 1),
                          st.integers(0, 300)), max_size=40),
       st.integers(1, 700))
def test_windows_reassemble_the_request_order_payload(samples, window):
    rng = np.random.default_rng(len(samples))
    files = {e: rng.bytes(FILE_BYTES + 300) for e in range(3)}
    extent = np.array([s[0] for s in samples], dtype=np.uint32)
    offset = np.array([s[1] for s in samples], dtype=np.uint64)
    length = np.array([s[2] for s in samples], dtype=np.uint64)
    order = RequestOrder(extent, offset, length)
    expected = b"".join(files[e][o:o + n] for e, o, n in samples)
    assert order.payload_bytes == len(expected)
    assert payload_from_pieces(order, files, window) == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, FILE_BYTES - 1),
                          st.integers(0, 300)), max_size=40),
       st.integers(1, 700))
def test_one_send_of_every_window_is_each_windows_pieces_in_request_order(samples, window):
    """What one send from mappings of a whole reply takes: per window, exactly the
    window's own request-order pieces (empty ones left out), so a frame header can
    go before each window's first piece."""
    order = RequestOrder(np.array([s[0] for s in samples], dtype=np.uint32),
                         np.array([s[1] for s in samples], dtype=np.uint64),
                         np.array([s[2] for s in samples], dtype=np.uint64))
    whole = order.in_request_order_by_window(window)
    per_window = []
    for start, stop in order.windows(window):
        for extent, file_offset, window_offset, size in order.in_request_order(start, stop):
            if size:
                per_window.append((extent, file_offset, start + window_offset, size))
    assert whole.tuples() == per_window
    starts = set(whole.buffer_offset.tolist())
    assert all(start in starts for start, _ in order.windows(window))  # each window's first


def test_consecutive_samples_in_storage_order_are_one_piece():
    order = RequestOrder(np.zeros(4, np.uint32), np.array([100, 110, 120, 130], np.uint64),
                         np.full(4, 10, np.uint64))
    assert order.pieces(0, 40) == [(0, 100, 0, 40)]
    assert order.pieces(5, 25) == [(0, 105, 0, 20)]


def test_duplicates_and_reverse_order_are_read_where_they_go():
    order = RequestOrder(np.zeros(3, np.uint32), np.array([200, 100, 200], np.uint64),
                         np.full(3, 10, np.uint64))
    assert order.pieces(0, 30) == [(0, 100, 10, 10), (0, 200, 0, 10), (0, 200, 20, 10)]


def test_an_empty_batch_has_no_windows():
    order = RequestOrder(np.zeros(0, np.uint32), np.zeros(0, np.uint64), np.zeros(0, np.uint64))
    assert order.payload_bytes == 0 and order.windows(100) == []
