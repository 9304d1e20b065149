"""The daemon side of the data path (`dlfs/proto/datapath.md`): sample bytes to sockets.

`DataPathServer` listens on a TCP port and a Unix socket and serves each
connection on a thread of its own, one request at a time: HELLO (token
checked in constant time), then GET_BATCH / READ_RANGE / STAT_DATASET.  A
batch is planned in request order (`sendplan.RequestOrder`), read window
by window by the read engine into a window buffer taken from a fixed pool
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
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
import time
from typing import Iterator, NamedTuple

import numpy as np

from dlfs import datawire, limits, logs
from dlfs.sockio import recv_exactly, send_all, unix_address
from dlfs.errors import (
    DlfsError,
    FailedPrecondition,
    InvalidArgument,
    Overloaded,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from dlfs.server.metrics import OPERATOR_CODES
from dlfs.server.planning import RequestOrder

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


class DataPathServer:
    """Serves the data path of one Store.  `start()` binds, `stop()` closes everything.

    `tcp_host`/`tcp_port`: where to listen for TCP (port 0 picks one; None:
    no TCP); `unix_socket`: a path, or "@name" for the abstract namespace
    ("" for none).  `authorizer`: a `dlfs.server.auth.Authorizer`, or None
    when the daemon has no tokens file.
    """

    def __init__(self, store, *, tcp_host: str | None, tcp_port: int, unix_socket: str,
                 authorizer=None, instance: bytes, connections_max: int,
                 idle_timeout_s: float, stall_timeout_s: float, buffer_bytes_max: int):
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
        self._listeners: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = False

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Bind and listen; raises RuntimeError naming an address that cannot be bound."""
        try:
            if self._tcp_host is not None:
                family = socket.AF_INET6 if ":" in self._tcp_host else socket.AF_INET
                listener = socket.socket(family, socket.SOCK_STREAM)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind((self._tcp_host.strip("[]"), self._tcp_port))
                self.port = listener.getsockname()[1]
                self._listen(listener)
            if self.unix_socket:
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listener.bind(unix_address(self.unix_socket))
                if not self.unix_socket.startswith("@"):
                    os.chmod(self.unix_socket, 0o666)  # tokens, not file modes, guard it
                self._listen(listener)
        except OSError as exc:
            self.stop()
            raise RuntimeError(f"cannot listen for the data path: {exc.strerror or exc}") from None

    def _listen(self, listener: socket.socket) -> None:
        listener.listen(_LISTEN_BACKLOG)
        self._listeners.append(listener)
        thread = threading.Thread(target=self._accept, args=(listener,), daemon=True,
                                  name=f"dlfs-data-accept-{len(self._listeners)}")
        self._threads.append(thread)
        thread.start()

    def stop(self) -> None:
        """Stop accepting, break every connection, free the Unix socket path."""
        with self._lock:
            self._stopped = True
            connections = list(self._connections)
        for listener in self._listeners:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() of its thread
            listener.close()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(limits.datapath_hello_timeout_s)
        if self.unix_socket and not self.unix_socket.startswith("@"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.unix_socket)

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._connections)

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

    def _serve(self, sock: socket.socket) -> None:
        try:
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = _Connection(self, sock)
            if connection.handshake():
                connection.serve()
        except OSError:
            pass  # the client went away or stalled: nothing to answer
        except Exception:  # noqa: BLE001 - a bug must not take the daemon down
            log.exception("data path connection failed")
        finally:
            with self._lock:
                self._connections.discard(sock)
                self.store.metrics.data_connections.set(len(self._connections))
            _close(sock)


class _Connection:
    """The state of one accepted connection: its socket and its request buffer."""

    def __init__(self, server: DataPathServer, sock: socket.socket):
        self.server = server
        self.store = server.store
        self.sock = sock
        self.header = bytearray(datawire.FRAME.size)
        self.body = bytearray(1024)
        self.peer = _peer_name(sock)

    def handshake(self) -> bool:
        """Read HELLO, answer WELCOME; False (after an ERROR) when the client may not stay."""
        self.sock.settimeout(limits.datapath_hello_timeout_s)
        try:
            kind, body = self._request(datawire.HELLO.size + limits.datapath_token_bytes_max)
            if kind != datawire.Kind.HELLO:
                raise datawire.FrameError(f"the first frame must be HELLO, not kind {kind}")
            version, token = datawire.parse_hello(body)
        except datawire.FrameError as exc:
            self._send([datawire.error(InvalidArgument(str(exc)))])
            return False
        authorizer = self.server.authorizer
        if authorizer is not None and authorizer.role(token) is None:
            self._send([datawire.error(Unauthenticated(
                "this daemon requires a token: pass --token (or set DLFS_TOKEN) with a token "
                "from its tokens file"))])
            return False
        if version < 1:
            self._send([datawire.error(FailedPrecondition(
                f"data path version {version} is not supported; this daemon speaks 1 to "
                f"{datawire.VERSION}"))])
            return False
        self._send([datawire.welcome(min(version, datawire.VERSION),
                                     self.server.buffers.window_bytes, self.server.instance)])
        return True

    def serve(self) -> None:
        """Answer requests until the client leaves, idles out, stalls or breaks the protocol."""
        while True:
            self.sock.settimeout(self.server.idle_timeout_s)
            try:
                kind, body = self._request(limits.datapath_request_bytes_max)
            except socket.timeout:
                return  # idle: the client reconnects at its next read
            except datawire.FrameError as exc:
                self._send([datawire.error(InvalidArgument(str(exc)))])
                return
            if not kind:
                return  # orderly close by the client
            self.sock.settimeout(self.server.stall_timeout_s)
            try:
                request, request_id = _parse(kind, body)
            except datawire.FrameError as exc:
                self._send([datawire.error(InvalidArgument(str(exc)))])
                return
            with _serving(request_id) as call:
                try:
                    self._handle(kind, request)
                except DlfsError as exc:
                    call.code = exc.status_code_name
                    self._fail(kind, exc)
                finally:
                    call.end(_METHODS[kind], self.peer)

    def _fail(self, kind: int, exc: DlfsError) -> None:
        """Answer a failed request with an ERROR frame naming the request id; count and
        log it as gRPC calls are."""
        code = exc.status_code_name
        self.store.metrics.errors.labels(code).inc()
        log.log(logging.WARNING if code in OPERATOR_CODES else logging.DEBUG,
                "%s -> %s: %s", _METHODS[kind], code, exc.message,
                extra={"method": _METHODS[kind], "code": code})
        self._send([datawire.error(exc, logs.current_request_id())])

    def _handle(self, kind: int, request) -> None:
        if kind == datawire.Kind.GET_BATCH:
            self._batch(request)
        elif kind == datawire.Kind.READ_RANGE:
            self._range(request)
        elif kind == datawire.Kind.OPEN_DATASET:
            self._open(*request)
        else:
            summary = self.store.dataset(request).summary()
            self._send([datawire.dataset_reply(summary.generation, summary.samples,
                                               summary.bytes)])

    # --- replies ---------------------------------------------------------------------------

    def _batch(self, request: datawire.BatchRequest) -> None:
        started = time.perf_counter()
        config = self.store.config
        if request.ids.size > config.batch_ids_max:
            raise InvalidArgument(
                f"batch of {request.ids.size} samples exceeds the limit of "
                f"{config.batch_ids_max} (--batch-ids-max); split it into smaller batches")
        with self.store.reading(request.dataset) as dataset:
            _check_generation(dataset, request.generation)
            ids = dataset.check_ids(request.ids)
            dataset.check_local(ids)
            lengths = dataset.length[ids]
            payload = int(lengths.sum())
            if payload > config.batch_bytes_max:
                raise InvalidArgument(
                    f"batch of {ids.size} samples holds {payload} bytes, over the limit of "
                    f"{config.batch_bytes_max} (--batch-bytes-max); split it into smaller batches")
            if request.hints.size:
                self.store.hint_ids(dataset, request.hints)
            order = RequestOrder(dataset.extent[ids], dataset.offset[ids], lengths)
            self._send(datawire.batch_header(dataset.generation, lengths, dataset.crc[ids],
                                             datawire.BATCH_CRCS))
            self._send_payload(dataset, order)
        self.store.count_served("DataBatch", ids.size, payload, started)

    def _range(self, request: datawire.RangeRequest) -> None:
        started = time.perf_counter()
        with self.store.reading(request.dataset) as dataset:
            _check_generation(dataset, request.generation)
            sample_id = int(dataset.check_ids(np.array([request.sample_id]))[0])
            dataset.check_local(np.array([sample_id]))
            size = int(dataset.length[sample_id])
            start = min(request.offset, size)
            stop = size if request.length == 0 else min(size, start + request.length)
            if stop - start > self.store.config.batch_bytes_max:
                raise InvalidArgument(
                    f"a range of {stop - start} bytes is over the limit of "
                    f"{self.store.config.batch_bytes_max} (--batch-bytes-max); read it in parts")
            whole = start == 0 and stop == size
            one = slice(sample_id, sample_id + 1)
            order = RequestOrder(dataset.extent[one], dataset.offset[one] + start,
                                 np.array([stop - start]))
            self._send(datawire.batch_header(dataset.generation, np.array([stop - start]),
                                             dataset.crc[one] if whole else np.zeros(1),
                                             datawire.BATCH_CRCS if whole else 0))
            self._send_payload(dataset, order)
        self.store.count_served("DataRange", 1, stop - start, started)

    def _open(self, name: str, generation: int) -> None:
        """Pass the dataset's index and read-only descriptors of its extents (SCM_RIGHTS).

        Only over the Unix socket, to a peer that authenticated at HELLO (a
        token, when the daemon has tokens) and, without tokens, runs as the
        daemon's own user or root (SO_PEERCRED): a passed descriptor reads
        the whole extent and cannot be taken back.
        """
        self._check_local_peer()
        with self.store.reading(name) as dataset, \
                self.store.extent_descriptors(dataset) as descriptors:
            _check_generation(dataset, generation)
            extent_nos = np.array([e for e, _ in descriptors], dtype=np.uint32)
            self._send([datawire.index_header(dataset.generation, len(dataset), extent_nos)])
            step = limits.datapath_fds_per_frame_max
            fds = [fd for _, fd in descriptors]
            for start in range(0, len(fds), step):
                part = fds[start:start + step]
                self.sock.sendmsg([datawire.fds_frame(len(part))], [
                    (socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(part)}i", *part))])
            window = self.server.buffers.window_bytes
            for array, dtype in ((dataset.extent, "<u4"), (dataset.offset, "<u8"),
                                 (dataset.length, "<u8"), (dataset.crc, "<u4")):
                raw = memoryview(np.ascontiguousarray(array, dtype=dtype)).cast("B")
                for start in range(0, len(raw), window):
                    piece = raw[start:start + window]
                    self._send([datawire.data_frame(len(piece)), piece])

    def _check_local_peer(self) -> None:
        if self.sock.family != socket.AF_UNIX:
            raise PermissionDenied("extent descriptors are passed only over the daemon's Unix "
                                   "socket, to a client on its host")
        if self.server.authorizer is None:
            _pid, uid, _gid = struct.unpack("3i", self.sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            if uid not in (0, os.getuid()):
                raise PermissionDenied(
                    f"uid {uid} may not read this daemon's extents directly: without a tokens "
                    "file only its own user and root may; give the daemon --tokens-file and "
                    "the client a token, or read without direct=True")

    def _send_payload(self, dataset, order: RequestOrder) -> None:
        """DATA frames of the payload, window by window; a failed read ends the reply with
        an ERROR frame instead of the remaining DATA (the connection stays usable)."""
        if not order.payload_bytes:
            return
        with self.server.buffers.take() as buffer:
            for start, stop in order.windows(buffer.size):
                window = buffer[:stop - start]
                try:
                    self.store.read_into(dataset, order.pieces(start, stop), window)
                except DlfsError as exc:
                    self._fail(datawire.Kind.DATA, exc)
                    return  # the reply is over: the client raises this error
                self._send([datawire.data_frame(stop - start), window])

    # --- frames -----------------------------------------------------------------------------

    def _request(self, body_bytes_max: int) -> tuple[int, memoryview]:
        """The next frame; kind 0 when the client closed the connection between frames."""
        view = memoryview(self.header)
        if not recv_exactly(self.sock, view, eof_ok=True):
            return 0, memoryview(b"")
        kind, _flags, length = datawire.parse_frame(self.header)
        if length > body_bytes_max:
            raise datawire.FrameError(f"a frame of {length} bytes is over the limit of "
                                      f"{body_bytes_max}")
        if len(self.body) < length:
            self.body = bytearray(length)
        body = memoryview(self.body)[:length]
        recv_exactly(self.sock, body)
        return kind, body

    def _send(self, buffers: list) -> None:
        send_all(self.sock, buffers)


# Requests by kind, named as in logs and in the dlfs_batches_total "method" label.
_METHODS = {datawire.Kind.GET_BATCH: "DataBatch", datawire.Kind.READ_RANGE: "DataRange",
            datawire.Kind.STAT_DATASET: "DataStat", datawire.Kind.OPEN_DATASET: "DataOpen",
            datawire.Kind.DATA: "DataBatch"}


def _parse(kind: int, body: memoryview):
    """(request, request id) of a request frame.  Raises FrameError."""
    if kind == datawire.Kind.GET_BATCH:
        request = datawire.parse_get_batch(body)
        return request, request.request_id
    if kind == datawire.Kind.READ_RANGE:
        request = datawire.parse_read_range(body)
        return request, request.request_id
    if kind == datawire.Kind.STAT_DATASET:
        return datawire.parse_stat_dataset(body)
    if kind == datawire.Kind.OPEN_DATASET:
        name, generation, request_id = datawire.parse_open_dataset(body)
        return (name, generation), request_id
    raise datawire.FrameError(f"unknown request kind {kind}")


class _Served:
    """One request being served: its status for the log line written when it ends."""

    def __init__(self):
        self.code = "OK"
        self.started = time.monotonic()

    def end(self, method: str, peer: str) -> None:
        elapsed = time.monotonic() - self.started
        level = logging.WARNING if elapsed >= limits.slow_rpc_log_s else logging.DEBUG
        if log.isEnabledFor(level):
            log.log(level, "%s %s in %.1f ms from %s%s", method, self.code, elapsed * 1e3, peer,
                    " (slow)" if level == logging.WARNING else "",
                    extra={"method": method, "code": self.code,
                           "duration_ms": round(elapsed * 1e3, 3), "peer": peer})


@contextlib.contextmanager
def _serving(request_id: str):
    """Log lines written while serving a request name its id (a fresh one if none came)."""
    binding = logs.bind_request_id(logs.accept_request_id(request_id))
    try:
        yield _Served()
    finally:
        logs.unbind_request_id(binding)


def _peer_name(sock: socket.socket) -> str:
    """The client as logs name it: ip:port, or unix:pid=PID,uid=UID from SO_PEERCRED."""
    try:
        if sock.family == socket.AF_UNIX:
            pid, uid, _gid = struct.unpack("3i", sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            return f"unix:pid={pid},uid={uid}"
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"


def _check_generation(dataset, generation: int) -> None:
    if generation and generation != dataset.generation:
        raise FailedPrecondition(
            f"dataset {dataset.name!r} was replaced: generation {generation} is no longer "
            f"served (the current one is {dataset.generation}); open it again")


def _refuse(sock: socket.socket, error: DlfsError) -> None:
    """Answer a connection that cannot be served with one ERROR frame, then close it."""
    try:
        sock.settimeout(1.0)
        sock.sendall(datawire.error(error))
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

