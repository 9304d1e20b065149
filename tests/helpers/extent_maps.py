"""Sends from ExtentMaps in a test: waiting for the mappings, the pieces of a window,
the bytes at the other end of the socket."""

from __future__ import annotations

import socket
import time

import numpy as np

from dlfs.formats.disk_layout import HEADER_BYTES
from dlfs.server.read.batch_planning import PieceColumns
from dlfs.server.read.mapped_sends import ExtentMaps


def mapped_when_ready(maps: ExtentMaps, send, timeout_s: float = 5.0) -> None:
    """Call `send()` until it went from the mappings (the background thread maps an
    extent after the first send that wanted it)."""
    give_up = time.monotonic() + timeout_s
    while not send():
        assert time.monotonic() < give_up, "the extents were never mapped"
        time.sleep(0.01)


def receive(sock: socket.socket, size: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        chunk = sock.recv(size - len(got))
        assert chunk, "the connection closed early"
        got += chunk
    return bytes(got)


def pieces_of(spec: list[tuple[int, int, int]]) -> PieceColumns:
    """(extent, offset in the body, bytes) in window order -> pieces, sorted as the
    planner sorts them (by extent and offset)."""
    buffer_offsets = np.cumsum([0] + [n for _, _, n in spec])[:-1]
    rows = sorted(zip([e for e, _, _ in spec], [HEADER_BYTES + o for _, o, _ in spec],
                      buffer_offsets, [n for _, _, n in spec]))
    return PieceColumns(*(np.array(column, dtype=np.int64) for column in zip(*rows)))


def map_both_extents(maps: ExtentMaps, here: socket.socket, there: socket.socket) -> None:
    """Have both extents mapped (sends of a byte of each until one went from them)."""
    mapped_when_ready(maps, lambda: maps.send(here, 1, pieces_of([(0, 0, 1), (1, 0, 1)]),
                                              b"H"))
    receive(there, 3)
