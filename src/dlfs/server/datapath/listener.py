"""The daemon side of the data path (`dlfs/proto/datapath.md`): sample bytes to sockets.

`DataPathServer` listens on a TCP port and a Unix socket and serves each
connection on a thread of its own (`conn_handler.DataConnection`), one request
at a time: HELLO (token checked in constant time), then GET_BATCH /
READ_RANGE / STAT_DATASET / OPEN_DATASET (`replies`).  A batch is
planned in request order (`planning.RequestOrder`), read window by window
by the read engine into a window buffer taken from a fixed pool
(`WindowBuffers`: no allocation per request), and each window is sent with
one `sendmsg` of its frame header and buffer: no copy in Python.  The
daemon does not checksum what it sends; the reply header carries the
stored CRC32Cs and the client verifies.

Bounds: connections (`datapath_connections_max`), request size, one
request in flight per connection, idle connections closed after
`datapath_idle_timeout_s`, and a reply that makes no progress for
`datapath_stall_timeout_s` (a client that stopped reading) abandoned, so
its buffer returns to the pool.  A malformed frame is answered with an
ERROR where possible and the connection is closed; it never reaches the
storage core.  Nothing here imports grpc.

The same server runs in each data path worker process (workers.py): there
it is given the listening sockets the main process bound (`listeners`),
which it shares with the other workers and never shuts down, and an
`ingest` hook that hands INGEST_START connections to the main process;
the main process serves those with `adopt`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from typing import Iterator, NamedTuple

import numpy as np

from dlfs import limits
from dlfs.formats import datapath_frames as frames
from dlfs.errors import DlfsError, Overloaded, Unavailable
from dlfs.server.datapath import uploads
from dlfs.server.datapath.conn_handler import DataConnection
from dlfs.sockio import unix_address

log = logging.getLogger(__name__)

_LISTEN_BACKLOG = 128


class DataPathInfo(NamedTuple):
    """Where the data path listens (the GetDataPath reply, before conversion)."""

    enabled: bool
    reason: str
    version: int
    port: int
    unix_socket: str
    instance: bytes


class WindowBuffers:
    """A fixed pool of window buffers, created on first need, reused forever.  Thread-safe.

    At most `bytes_max // window_bytes` exist (at least one); a request
    that finds none free waits up to `wait_s` and is refused with Overloaded.
    """

    def __init__(self, window_bytes: int, bytes_max: int):
        self.window_bytes = window_bytes
        self.count_max = max(1, bytes_max // window_bytes)
        self._free: list[np.ndarray] = []
        self._created = 0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def take(self, wait_s: float = limits.budget_wait_s_max) -> Iterator[np.ndarray]:
        buffer = self._take(wait_s)
        try:
            yield buffer
        finally:
            with self._cond:
                self._free.append(buffer)
                self._cond.notify()

    def _take(self, wait_s: float) -> np.ndarray:
        give_up = time.monotonic() + wait_s
        with self._cond:
            while not self._free and self._created >= self.count_max:
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    raise Overloaded(
                        f"every data path window buffer is in use ({self.count_max} of "
                        f"{self.window_bytes} bytes, --datapath-buffer-bytes-max); retry later")
                self._cond.wait(remaining)
            if self._free:
                return self._free.pop()
            self._created += 1
        return np.empty(self.window_bytes, dtype=np.uint8)


def bind_listeners(tcp_host: str | None, tcp_port: int,
                   unix_socket: str) -> tuple[list[socket.socket], int]:
    """(listening sockets, the TCP port bound): TCP on `tcp_host`:`tcp_port` (port 0
    picks one; no TCP when `tcp_host` is None) and the Unix socket `unix_socket` (a
    path, "@name" in the abstract namespace, "" for none).  Raises RuntimeError
    naming an address that cannot be bound (nothing stays bound then)."""
    bound: list[socket.socket] = []
    port = 0
    path_bound = ""  # the Unix socket's path once it is ours to free
    try:
        if tcp_host is not None:
            family = socket.AF_INET6 if ":" in tcp_host else socket.AF_INET
            listener = socket.socket(family, socket.SOCK_STREAM)
            bound.append(listener)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((tcp_host.strip("[]"), tcp_port))
            port = listener.getsockname()[1]
            listener.listen(_LISTEN_BACKLOG)
        if unix_socket:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            bound.append(listener)
            listener.bind(unix_address(unix_socket))
            path_bound = unix_socket
            if not unix_socket.startswith("@"):
                os.chmod(unix_socket, 0o666)  # tokens, not file modes, guard it
            listener.listen(_LISTEN_BACKLOG)
    except OSError as exc:
        close_listeners(bound, path_bound)
        raise RuntimeError(f"cannot listen for the data path: {exc.strerror or exc}") from None
    return bound, port


def close_listeners(listeners: list[socket.socket], unix_socket: str) -> None:
    """Close listening sockets this process bound (every process that shares them
    stops accepting) and free the Unix socket's path."""
    for listener in listeners:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept()
        listener.close()
    if unix_socket and not unix_socket.startswith("@"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(unix_socket)


class DataPathServer:
    """Serves the data path of one Store.  `start()` binds, `stop()` closes everything.

    `tcp_host`/`tcp_port`: where to listen for TCP (port 0 picks one; None:
    no TCP); `unix_socket`: a path, or "@name" for the abstract namespace
    ("" for none).  Or `listeners`: sockets already listening, shared with
    other processes (a data path worker's): `stop()` then leaves them open
    for the others and frees no path.  `authorizer`: a
    `dlfs.server.auth.Authorizer`, or None when the daemon has no tokens
    file.  `ingest(connection, request)` serves an INGEST_START
    (uploads.ingest; a worker hands the connection over instead).
    """

    def __init__(self, store, *, tcp_host: str | None, tcp_port: int, unix_socket: str,
                 authorizer=None, instance: bytes, connections_max: int,
                 idle_timeout_s: float, stall_timeout_s: float, buffer_bytes_max: int,
                 listeners: list[socket.socket] | None = None):
        self.store = store
        self.instance = instance
        self.authorizer = authorizer
        self.connections_max = connections_max
        self.idle_timeout_s = idle_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.buffers = WindowBuffers(store.config.chunk_bytes, buffer_bytes_max)
        self._tcp_host, self._tcp_port = tcp_host, tcp_port
        self.unix_socket = unix_socket
        self.port = 0
        self.ingest = uploads.ingest
        self._given = list(listeners or [])
        self._listeners: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = False
        self._requests = 0

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Bind and listen (or accept on the given listeners); raises RuntimeError naming
        an address that cannot be bound."""
        if self._given:
            for listener in self._given:
                self._listen(listener)
            return
        listeners, self.port = bind_listeners(self._tcp_host, self._tcp_port, self.unix_socket)
        for listener in listeners:
            self._listen(listener)

    def _listen(self, listener: socket.socket) -> None:
        self._listeners.append(listener)
        thread = threading.Thread(target=self._accept, args=(listener,), daemon=True,
                                  name=f"dlfs-data-accept-{len(self._listeners)}")
        self._threads.append(thread)
        thread.start()

    def stop(self) -> None:
        """Stop accepting, break every connection, free the Unix socket path (listeners
        given at construction stay open: other processes accept on them)."""
        with self._lock:
            self._stopped = True
            connections = list(self._connections)
        if not self._given:
            close_listeners(self._listeners, self.unix_socket)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        if not self._given:  # a shared listener's accept() ends when its owner closes it
            for thread in self._threads:
                thread.join(limits.datapath_hello_timeout_s)

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._connections)

    @property
    def requests(self) -> int:
        """Requests served since the start (answered or failed)."""
        return self._requests

    def count_request(self) -> None:
        self._requests += 1  # under the GIL; a counter for status lines, not an invariant

    def adopt(self, sock: socket.socket, role: str | None, kind: int, body: bytes) -> None:
        """Serve a connection another process accepted and handed over (a worker's
        INGEST_START): its HELLO was answered there (`role` is its token's role), and
        `kind`/`body` is the request frame it read last, answered first here."""
        with self._lock:
            if self._stopped:
                _refuse(sock, Unavailable("the daemon is shutting down"))
                return
            self._connections.add(sock)
            self.store.metrics.data_connections.set(len(self._connections))
        threading.Thread(target=self._serve, args=(sock, (role, kind, body)), daemon=True,
                         name="dlfs-data-conn").start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _peer = listener.accept()
            except OSError:
                return  # the listener was shut down
            with self._lock:
                full = len(self._connections) >= self.connections_max
                if not full and not self._stopped:
                    self._connections.add(sock)
                    self.store.metrics.data_connections.set(len(self._connections))
            if full or self._stopped:
                _refuse(sock, Overloaded(
                    f"the daemon serves its limit of {self.connections_max} data connections "
                    "(--datapath-connections-max); retry later") if full
                    else Unavailable("the daemon is shutting down"))
                continue
            threading.Thread(target=self._serve, args=(sock,), daemon=True,
                             name="dlfs-data-conn").start()

    # --- one connection ------------------------------------------------------------------

    def _serve(self, sock: socket.socket, adopted: tuple | None = None) -> None:
        connection = None
        try:
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            else:
                # Room for a whole window (TCP grows its buffer by itself; a Unix
                # socket keeps the default 208 KiB, and a window sent by sendfile then
                # waits for the client some twenty times: 110 KB and 140 MB samples
                # 5-30% faster with it).  The kernel caps it at net.core.wmem_max.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.buffers.window_bytes)
            connection = DataConnection(self, sock)
            if adopted is not None:
                connection.role = adopted[0]
                connection.serve(first=adopted[1:])
            elif connection.handshake():
                connection.serve()
        except OSError:
            pass  # the client went away or stalled: nothing to answer
        except Exception:  # noqa: BLE001 - a bug must not take the daemon down
            log.exception("data path connection failed")
        finally:
            with self._lock:
                self._connections.discard(sock)
                self.store.metrics.data_connections.set(len(self._connections))
            if connection is not None and connection.detached:
                sock.close()  # handed over: the connection lives on in another process
            else:
                _close(sock)


def _refuse(sock: socket.socket, error: DlfsError) -> None:
    """Answer a connection that cannot be served with one ERROR frame, then close it."""
    try:
        sock.settimeout(1.0)
        sock.sendall(frames.error(error))
    except OSError:
        pass
    _close(sock)


def _close(sock: socket.socket) -> None:
    """Close so that a last ERROR frame arrives: closing with unread input would reset
    the connection and drop it.  Reads at most `limits.datapath_drain_bytes_max`."""
    try:
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(limits.datapath_drain_s)
        drained = 0
        while drained < limits.datapath_drain_bytes_max:
            chunk = sock.recv(65536)
            if not chunk:
                break
            drained += len(chunk)
    except OSError:
        pass
    finally:
        sock.close()

