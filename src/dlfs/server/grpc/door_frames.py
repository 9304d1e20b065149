"""What the gRPC door reads of HTTP/2 (RFC 9113) and the one frame it writes.

The door (`door.py`) holds a new connection until the client's connection
preface has arrived: the 24 fixed bytes, then a SETTINGS frame, whole
(`Handshake`).  It then follows the client's frame headers, not their bodies,
until the first HEADERS frame, a call (`CallWatch`).  It refuses a connection
with the server's preface (an empty SETTINGS) and a GOAWAY whose debug data
says why (`refusal`).  Over TLS it sees none of this: `looks_like_tls` only.
Nothing here touches sockets.
"""

from __future__ import annotations

import struct

from dlfs import limits

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = struct.Struct(">HBBBI")  # length (24 bits: u16 + u8), type, flags, stream
SETTINGS, HEADERS, GOAWAY = 0x4, 0x1, 0x7
SETTINGS_ACK = 0x1
ENHANCE_YOUR_CALM = 0xB
TLS_HANDSHAKE_RECORD = 0x16  # the first byte of a TLS ClientHello


class NotHttp2(ValueError):
    """The bytes are not a client's HTTP/2 connection preface."""


def _header(data, at: int) -> tuple[int, int, int]:
    """(length, type, flags) of the frame header at `data[at:at + 9]`."""
    high, low, kind, flags, _stream = FRAME_HEADER.unpack_from(data, at)
    return high << 8 | low, kind, flags


class Handshake:
    """A connection's first bytes, as they arrive: `feed` says whether the preface and
    the client's first SETTINGS frame are whole.  At most `bytes_max` are kept."""

    bytes_max = len(PREFACE) + FRAME_HEADER.size + limits.grpc_settings_bytes_max

    def __init__(self):
        self.data = bytearray()

    def feed(self, chunk: bytes) -> bool:
        """Add `chunk`; True once the preface and a whole SETTINGS frame are in `data`
        (bytes after them may be there too).  Raises NotHttp2."""
        self.data += chunk
        data = self.data
        head = bytes(data[:len(PREFACE)])
        if not PREFACE.startswith(head):
            raise NotHttp2("not an HTTP/2 client (the connection preface is wrong)")
        at = len(PREFACE)
        if len(data) < at + FRAME_HEADER.size:
            return False
        length, kind, flags = _header(data, at)
        if kind != SETTINGS or flags & SETTINGS_ACK or length % 6 or \
                length > limits.grpc_settings_bytes_max:
            raise NotHttp2("the connection preface is not followed by the client's SETTINGS")
        return len(data) >= at + FRAME_HEADER.size + length


class CallWatch:
    """Follows the frame headers of a client's byte stream after its preface, bodies
    skipped without a copy; `called` once a HEADERS frame (a call) began."""

    def __init__(self):
        self.called = False
        self._skip = 0  # body bytes of the current frame still to pass
        self._header = bytearray()

    def feed(self, chunk) -> bool:
        """Follow `chunk` (the bytes after the last fed); whether a call began.  Cost:
        O(frame headers in it)."""
        view = memoryview(chunk)
        at = 0
        while not self.called and at < len(view):
            if self._skip:
                step = min(self._skip, len(view) - at)
                self._skip -= step
                at += step
                continue
            need = FRAME_HEADER.size - len(self._header)
            self._header += view[at:at + need]
            at += min(need, len(view) - at)
            if len(self._header) == FRAME_HEADER.size:
                length, kind, _flags = _header(self._header, 0)
                self._header.clear()
                self._skip = length
                self.called = kind == HEADERS
        return self.called


def looks_like_tls(first: bytes) -> bool:
    """Whether a connection's first bytes could begin a TLS handshake."""
    return first[:1] == bytes([TLS_HANDSHAKE_RECORD])


def refusal(why: str) -> bytes:
    """The server's preface (an empty SETTINGS) and a GOAWAY (ENHANCE_YOUR_CALM) whose
    debug data is `why`: what a refused client's gRPC library logs."""
    debug = why.encode()[:limits.grpc_refusal_text_bytes_max]
    goaway = struct.pack(">II", 0, ENHANCE_YOUR_CALM) + debug
    return (_frame(SETTINGS, 0, b"") + _frame(GOAWAY, 0, goaway))


def _frame(kind: int, flags: int, body: bytes) -> bytes:
    return FRAME_HEADER.pack(len(body) >> 8, len(body) & 0xFF, kind, flags, 0) + body
