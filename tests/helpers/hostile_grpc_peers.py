"""Hostile peers of a daemon's gRPC port, for tests against real daemons.

They speak raw HTTP/2 (RFC 9113) or nothing at all over TCP from a chosen
source address (another 127.0.0.0/8 address is another host to the daemon):
an idle flood that never sends the connection preface, and connections that
complete HTTP/2's handshake and answer every PING but never make a call.
`SourceForwarder` lets a real gRPC client, which cannot choose its source
address, reach the daemon from another loopback address.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS, PING, GOAWAY = 0x4, 0x6, 0x7
ACK = 0x1


def frame(kind: int, flags: int = 0, body: bytes = b"", stream: int = 0) -> bytes:
    return struct.pack(">HBBBI", len(body) >> 8, len(body) & 0xFF, kind, flags, stream) + body


def split_frames(data: bytes) -> tuple[list[tuple[int, int, bytes]], bytes]:
    """The whole frames at the start of `data` as (type, flags, body), and the rest."""
    frames = []
    while len(data) >= 9:
        high, low, kind, flags, _stream = struct.unpack_from(">HBBBI", data)
        length = high << 8 | low
        if len(data) < 9 + length:
            break
        frames.append((kind, flags, data[9:9 + length]))
        data = data[9 + length:]
    return frames, data


def connect(address: tuple[str, int], source: str = "", timeout_s: float = 10.0
            ) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if source:
        sock.bind((source, 0))
    sock.settimeout(timeout_s)
    sock.connect(address)
    return sock


def idle_flood(address: tuple[str, int], count: int, source: str = "") -> list[socket.socket]:
    """`count` TCP connections that never send a byte."""
    return [connect(address, source) for _ in range(count)]


def goaway_text(sock: socket.socket, timeout_s: float = 10.0) -> str | None:
    """The debug text of the GOAWAY the daemon sent on `sock` before it closed it, or
    None when it sent none (read until the close)."""
    sock.settimeout(timeout_s)
    data = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            data += chunk
    for kind, _flags, body in split_frames(data)[0]:
        if kind == GOAWAY:
            return body[8:].decode(errors="replace")
    return None


def closed_by_daemon(sock: socket.socket, wait_s: float = 0.2) -> bool:
    """Whether the daemon closed `sock` (what it sent before is read and dropped)."""
    sock.settimeout(wait_s)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


class Http2Idlers(threading.Thread):
    """`count` connections from `source` that send the preface and SETTINGS, ACK the
    daemon's SETTINGS, answer each PING, and never make a call.  `alive()`: those the
    daemon has not closed; `settled()`: of them, those that got the daemon's SETTINGS
    (past HTTP/2's handshake)."""

    def __init__(self, address: tuple[str, int], count: int, source: str = ""):
        super().__init__(daemon=True, name="http2-idlers")
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._open: dict[socket.socket, bytes] = {}
        self._settled: set[socket.socket] = set()
        self.pings_answered = 0
        self._halt = threading.Event()
        for _ in range(count):
            sock = connect(address, source)
            sock.sendall(PREFACE + frame(SETTINGS))
            sock.setblocking(False)
            self._open[sock] = b""
            self._selector.register(sock, selectors.EVENT_READ)

    def alive(self) -> int:
        with self._lock:
            return len(self._open)

    def settled(self) -> int:
        with self._lock:
            return len(self._settled & self._open.keys())

    def run(self) -> None:
        while not self._halt.is_set() and self.alive():
            for key, _ in self._selector.select(0.1):
                self._serve(key.fileobj)

    def _serve(self, sock: socket.socket) -> None:
        try:
            chunk = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._selector.unregister(sock)
            sock.close()
            with self._lock:
                self._open.pop(sock, None)
            return
        with self._lock:
            frames, rest = split_frames(self._open[sock] + chunk)
            self._open[sock] = rest
        for kind, flags, body in frames:
            with contextlib.suppress(OSError):
                if kind == SETTINGS and not flags & ACK:
                    sock.sendall(frame(SETTINGS, ACK))
                    with self._lock:
                        self._settled.add(sock)
                elif kind == PING and not flags & ACK:
                    sock.sendall(frame(PING, ACK, body))
                    self.pings_answered += 1

    def close(self) -> None:
        self._halt.set()
        self.join(10)
        with self._lock:
            for sock in self._open:
                sock.close()
            self._open.clear()


class SourceForwarder(threading.Thread):
    """Listens on 127.0.0.1 (`address`) and forwards each connection to `target` from
    the source address `source`, byte for byte (a thread a direction)."""

    def __init__(self, target: tuple[str, int], source: str):
        super().__init__(daemon=True, name="source-forwarder")
        self.target, self.source = target, source
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.start()

    def run(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = connect(self.target, self.source)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self._listener.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
