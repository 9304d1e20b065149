"""The client side of the data path: sample bytes received straight into memory.

`DataPath` keeps a pool of connections to one daemon's data path
(`dlfs/proto/datapath.md`), one request in flight on each, and receives
every reply's payload with `recv_into` into a buffer: the caller's `out`,
or a recycled buffer from a `BufferPool` that lives as long as any of the
batch's samples does.  No sample byte is copied in Python.  Each sample is
checked against the CRC32C the reply header carries (default on), so
damage anywhere between the daemon's disk and this process is caught here.

Connections are per process: after `os.fork` the child opens its own (a
DataLoader worker needs no gRPC to read).  A connection that breaks is
dropped; UNAVAILABLE is retried by the caller (`dlfs.client.retry`).
"""

from __future__ import annotations

import array
import os
import socket
import threading
import weakref
from typing import NamedTuple

import crc32c
import numpy as np

from dlfs import datawire, limits, logs
from dlfs.sockio import recv_exactly, send_all, unix_address
from dlfs.client.buffers import BufferPool, out_array
from dlfs.errors import (
    DataCorruption,
    DeadlineExceeded,
    DlfsError,
    FailedPrecondition,
    Unavailable,
)


class Endpoint(NamedTuple):
    """Where a data path listens: (socket family, address) and a label for messages."""

    family: int
    address: object  # (host, port) for TCP, a path or b"\0name" for a Unix socket
    label: str


def endpoints(grpc_address: str, port: int, unix_socket: str) -> list[Endpoint]:
    """The endpoints to try, best first: the Unix socket (same host only), then TCP.

    `grpc_address` is the HOST:PORT the client reached the daemon's gRPC
    service at; the data path's TCP port is on the same host.
    """
    found = []
    if unix_socket:
        found.append(Endpoint(socket.AF_UNIX, unix_address(unix_socket), f"unix:{unix_socket}"))
    if port:
        host = grpc_address.rpartition(":")[0].strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        found.append(Endpoint(family, (host, port), f"{grpc_address.rpartition(':')[0]}:{port}"))
    return found


class OpenedDataset(NamedTuple):
    """A dataset's version, its location arrays (id order) and its extents' descriptors."""

    generation: int
    samples: int
    fds: dict  # extent no -> read-only descriptor (the receiver closes them)
    extent: np.ndarray  # uint32 per sample; 0xFFFFFFFF: stored by another daemon
    offset: np.ndarray  # uint64
    length: np.ndarray  # uint64
    crc: np.ndarray  # uint32


class Received(NamedTuple):
    """One reply: the generation it was served from and the samples in request order."""

    generation: int
    samples: list[memoryview]


class DataConnection:
    """One connection to a daemon's data path; one request at a time.  Not thread-safe.

    Raises Unavailable when the daemon cannot be reached or the connection
    breaks, DeadlineExceeded when a reply stalls past `reply_timeout_s`,
    and the daemon's typed errors.  After any exception but a typed error
    from the daemon, `broken` is set and the connection must be closed.
    """

    def __init__(self, endpoint: Endpoint, token: str, instance: bytes, *,
                 connect_timeout_s: float, reply_timeout_s: float):
        self.endpoint = endpoint
        self.reply_timeout_s = reply_timeout_s
        self.broken = False
        self._header = bytearray(datawire.FRAME.size)
        self._sock = socket.socket(endpoint.family, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(connect_timeout_s)
            self._sock.connect(endpoint.address)
            if endpoint.family != socket.AF_UNIX:
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock.sendall(datawire.hello(token))
            kind, body = self._frame(limits.datapath_reply_header_bytes_max)
            if kind != datawire.Kind.WELCOME:
                raise self._unexpected(kind, "WELCOME")
            version, self.window_bytes, got_instance = datawire.parse_welcome(body)
        except OSError as exc:
            self._sock.close()
            raise Unavailable(f"DLFS daemon's data path at {endpoint.label} cannot be reached "
                              f"({exc.strerror or exc}); is dlfs-server running there?") from None
        except BaseException:
            self._sock.close()
            raise
        if instance and got_instance != instance:
            self._sock.close()
            raise FailedPrecondition(f"{endpoint.label} is another daemon's data path")
        self.version = version

    def close(self) -> None:
        self._sock.close()

    # --- requests ---------------------------------------------------------------------

    def get_batch(self, request: list, ids: np.ndarray, dataset: str, *, verify: bool,
                  out, pool: BufferPool) -> Received:
        """Send a GET_BATCH frame (`request`, from `datawire.get_batch`) and receive its reply."""
        return self._exchange(request, ids, dataset, verify, out, pool)

    def read_range(self, request: bytes, sample_id: int, dataset: str, *, verify: bool,
                   pool: BufferPool) -> Received:
        return self._exchange([request], np.array([sample_id]), dataset, verify, None, pool)

    def stat_dataset(self, dataset: str) -> tuple[int, int, int]:
        """(generation, samples, bytes) of the dataset's current version."""
        try:
            self._sock.settimeout(self.reply_timeout_s)
            self._sock.sendall(datawire.stat_dataset(dataset))
            kind, body = self._frame(datawire.DATASET.size)
        except BaseException as exc:
            raise self._failed(exc) from None
        if kind != datawire.Kind.DATASET:
            raise self._unexpected(kind, "DATASET")
        return datawire.parse_dataset_reply(body)

    def open_dataset(self, dataset: str, generation: int = 0) -> "OpenedDataset":
        """The dataset's index and read-only descriptors of its extents (Unix socket only).

        The caller owns the descriptors (close them).  Raises the daemon's
        typed errors (PermissionDenied over TCP or for a foreign user).
        """
        fds: list[int] = []
        try:
            self._sock.settimeout(self.reply_timeout_s)
            self._sock.sendall(datawire.open_dataset(dataset, generation,
                                                     logs.current_request_id()))
            kind, body = self._frame(limits.datapath_reply_header_bytes_max)
            if kind != datawire.Kind.INDEX:
                raise self._unexpected(kind, "INDEX")
            generation, samples, extent_nos = datawire.parse_index_header(body)
            while len(fds) < len(extent_nos):
                fds.extend(self._receive_fds())
            if len(fds) != len(extent_nos):
                raise datawire.FrameError("more descriptors than extents arrived")
            arrays = np.empty(samples * datawire.INDEX_BYTES_PER_SAMPLE, dtype=np.uint8)
            self._receive_payload(arrays)
        except BaseException as exc:
            for fd in fds:
                os.close(fd)
            raise self._failed(exc) from None
        n = samples
        return OpenedDataset(
            generation, samples, dict(zip(extent_nos.tolist(), fds)),
            arrays[:4 * n].view("<u4"), arrays[4 * n:12 * n].view("<u8"),
            arrays[12 * n:20 * n].view("<u8"), arrays[20 * n:].view("<u4"))

    def _receive_fds(self) -> list[int]:
        """One FDS frame: its descriptors, which ride on its first byte (SCM_RIGHTS)."""
        size = datawire.FRAME.size + datawire.FDS.size
        space = socket.CMSG_SPACE(limits.datapath_fds_per_frame_max * 4)
        data, ancillary, flags, _ = self._sock.recvmsg(size, space)
        fds = [fd for level, kind, raw in ancillary
               if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
               for fd in array.array("i", raw[:len(raw) - len(raw) % 4])]
        try:
            if flags & socket.MSG_CTRUNC:
                raise datawire.FrameError("descriptors were cut off (too many in one frame)")
            if not data:
                raise ConnectionResetError(0, "connection closed before the descriptors")
            frame = bytearray(data)
            if len(frame) < size:
                rest = bytearray(size - len(frame))
                recv_exactly(self._sock, memoryview(rest))
                frame += rest
            kind, _flags, length = datawire.parse_frame(frame[:datawire.FRAME.size])
            if kind != datawire.Kind.FDS or length != datawire.FDS.size:
                raise self._unexpected(kind, "FDS")
            (count,) = datawire.FDS.unpack_from(frame, datawire.FRAME.size)
            if count != len(fds):
                raise datawire.FrameError(f"an FDS frame announced {count} descriptors and "
                                          f"carried {len(fds)}")
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def _exchange(self, request: list, ids: np.ndarray, dataset: str, verify: bool, out,
                  pool: BufferPool) -> Received:
        try:
            self._sock.settimeout(self.reply_timeout_s)
            send_all(self._sock, request)
            kind, body = self._frame(limits.datapath_reply_header_bytes_max)
            if kind != datawire.Kind.BATCH:
                raise self._unexpected(kind, "BATCH")
            reply = datawire.parse_batch_header(body)
            payload = _target(out, reply.payload_bytes, pool)
            self._receive_payload(payload)
        except BaseException as exc:
            raise self._failed(exc) from None
        ends = np.cumsum(reply.lengths, dtype=np.uint64).tolist()
        view = memoryview(payload).cast("B")
        samples = [view[end - n:end] for end, n in zip(ends, reply.lengths.tolist())]
        if verify and reply.flags & datawire.BATCH_CRCS:
            _verify(samples, reply.crcs, ids, dataset, self.endpoint.label)
        return Received(reply.generation, [s.toreadonly() for s in samples] if out is None
                        else samples)

    def _receive_payload(self, payload: np.ndarray) -> None:
        view = memoryview(payload).cast("B")
        filled = 0
        while filled < len(view):
            kind, length = self._frame_header()
            if kind == datawire.Kind.ERROR:
                raise datawire.parse_error(self._body(length), self.endpoint.label)
            if kind != datawire.Kind.DATA or length > len(view) - filled:
                raise self._unexpected(kind, "DATA within the announced payload")
            recv_exactly(self._sock, view[filled:filled + length])
            filled += length

    # --- frames -------------------------------------------------------------------------

    def _frame_header(self) -> tuple[int, int]:
        recv_exactly(self._sock, memoryview(self._header))
        kind, _flags, length = datawire.parse_frame(self._header)
        return kind, length

    def _body(self, length: int) -> memoryview:
        body = memoryview(bytearray(length))
        recv_exactly(self._sock, body)
        return body

    def _frame(self, body_bytes_max: int) -> tuple[int, memoryview]:
        """The next frame (kind, body); an ERROR frame is raised as its typed error."""
        kind, length = self._frame_header()
        if length > max(body_bytes_max, limits.datapath_error_frame_bytes_max):
            raise datawire.FrameError(f"a frame of kind {kind} announces {length} bytes")
        body = self._body(length)
        if kind == datawire.Kind.ERROR:
            raise datawire.parse_error(body, self.endpoint.label)
        return kind, body

    def _unexpected(self, kind: int, wanted: str) -> Exception:
        self.broken = True
        return Unavailable(f"DLFS daemon's data path at {self.endpoint.label} sent frame kind "
                           f"{kind} where {wanted} was due; the connection was closed")

    def _failed(self, exc: BaseException) -> BaseException:
        """The error to raise for `exc`; marks the connection broken unless the daemon
        answered with a typed error at a frame boundary."""
        if isinstance(exc, DlfsError) and not isinstance(exc, (Unavailable, DeadlineExceeded)) \
                and not self.broken:
            return exc
        self.broken = True
        if isinstance(exc, socket.timeout):
            return DeadlineExceeded(f"DLFS daemon's data path at {self.endpoint.label} sent "
                                    f"nothing for {self.reply_timeout_s:g} s")
        if isinstance(exc, datawire.FrameError):
            return Unavailable(f"DLFS daemon's data path at {self.endpoint.label} broke the "
                               f"protocol ({exc}); the connection was closed")
        if isinstance(exc, OSError):
            return Unavailable(f"DLFS daemon's data path at {self.endpoint.label} dropped the "
                               f"connection ({exc.strerror or exc})")
        return exc


class DataPath:
    """A per-process pool of data connections to one daemon.  Thread-safe.

    `hint` (a `datatransport.DataPathHint`) is where the daemon said its
    data path listens, with its instance id; `endpoints` (from it, see
    `endpoints`) are tried in order; the first that
    answers is used from then on.  At most `limits.data_connections_max`
    connections are open at once; callers beyond that wait for one.
    """

    def __init__(self, endpoints: list[Endpoint], *, hint, token: str,
                 connect_timeout_s: float, reply_timeout_s: float, pool: BufferPool):
        self._endpoints = list(endpoints)
        self.hint = hint  # the DataPathHint these endpoints came from
        self._instance = hint.instance
        self._token = token
        self._connect_timeout_s = connect_timeout_s
        self._reply_timeout_s = reply_timeout_s
        self.pool = pool
        self._lock = threading.Condition()
        self._idle: list[DataConnection] = []
        self._open = 0
        self._pid = os.getpid()
        self._closed = False
        # Whether any connection ever got a WELCOME: until then, failing to
        # connect may mean the port is blocked rather than the daemon down.
        self.ever_connected = False
        # The last connect failed on every endpoint: the daemon is down, or
        # restarted with another data port or instance.
        self.unreachable = False
        _AFTER_FORK.add(self)

    @property
    def tcp_port(self) -> int:
        """The data path's TCP port (0 when only its Unix socket is in use)."""
        return next((e.address[1] for e in self._endpoints if e.family != socket.AF_UNIX), 0)

    @property
    def endpoint(self) -> Endpoint:
        """The endpoint in use (the first one until a connection was made)."""
        return self._endpoints[0]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def get_batch(self, dataset: str, ids: np.ndarray, *, generation: int = 0,
                  hints: np.ndarray | None = None, verify: bool = True, out=None,
                  request_id: str = "") -> Received:
        """Samples `ids` of `dataset` in request order (into `out` when given).

        One round trip.  Raises the daemon's typed errors, DataCorruption
        when a sample fails its CRC32C here, Unavailable (retry-able) when
        the connection breaks.
        """
        request = datawire.get_batch(dataset, ids, generation=generation, hints=hints,
                                     request_id=request_id or logs.current_request_id())
        with self._connection() as connection:
            return connection.get_batch(request, ids, dataset, verify=verify, out=out,
                                        pool=self.pool)

    def read_range(self, dataset: str, sample_id: int, offset: int, length: int, *,
                   generation: int = 0, verify: bool = True, request_id: str = "") -> Received:
        """`length` bytes (0: to the end) at `offset` of one sample; verified when whole."""
        request = datawire.read_range(dataset, sample_id, offset, length, generation=generation,
                                      request_id=request_id or logs.current_request_id())
        with self._connection() as connection:
            return connection.read_range(request, sample_id, dataset, verify=verify,
                                         pool=self.pool)

    def stat_dataset(self, dataset: str) -> tuple[int, int, int]:
        """(generation, samples, bytes) of `dataset`'s current version, over the data path."""
        with self._connection() as connection:
            return connection.stat_dataset(dataset)

    def open_dataset(self, dataset: str, generation: int = 0) -> OpenedDataset:
        """The dataset's index and extent descriptors (see DataConnection.open_dataset)."""
        with self._connection() as connection:
            return connection.open_dataset(dataset, generation)

    def _connection(self) -> "_Borrowed":
        return _Borrowed(self)

    def _take(self) -> DataConnection:
        with self._lock:
            if self._pid != os.getpid():
                self._forget_inherited()
            while True:
                if self._closed:
                    raise Unavailable("the client was closed")
                if self._idle:
                    return self._idle.pop()
                if self._open < limits.data_connections_max:
                    self._open += 1
                    break
                self._lock.wait()
        try:
            return self._connect()
        except BaseException:
            with self._lock:
                self._open -= 1
                self._lock.notify()
            raise

    def _connect(self) -> DataConnection:
        last: Exception | None = None
        for index, endpoint in enumerate(self._endpoints):
            try:
                connection = DataConnection(endpoint, self._token, self._instance,
                                            connect_timeout_s=self._connect_timeout_s,
                                            reply_timeout_s=self._reply_timeout_s)
            except (Unavailable, FailedPrecondition) as exc:
                last = exc
                continue
            if index:  # an earlier endpoint failed: prefer this one from now on
                self._endpoints = self._endpoints[index:] + self._endpoints[:index]
            self.ever_connected = True
            self.unreachable = False
            return connection
        self.unreachable = True
        assert last is not None
        raise last if isinstance(last, Unavailable) else Unavailable(str(last))

    def _give_back(self, connection: DataConnection) -> None:
        with self._lock:
            if connection.broken or self._closed or self._pid != os.getpid():
                self._open -= 1
                connection.close()
            else:
                self._idle.append(connection)
            self._lock.notify()

    def _forget_inherited(self) -> None:
        """In a forked child: the parent's connections are not ours to use or close."""
        self._pid = os.getpid()
        self._idle = []
        self._open = 0


class _Borrowed:
    """`with` block holding one connection of a DataPath."""

    __slots__ = ("_path", "_connection")

    def __init__(self, path: DataPath):
        self._path = path
        self._connection: DataConnection | None = None

    def __enter__(self) -> DataConnection:
        self._connection = self._path._take()
        return self._connection

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and not isinstance(exc, DlfsError):
            self._connection.broken = True  # interrupted mid-reply: state unknown
        self._path._give_back(self._connection)


_AFTER_FORK: "weakref.WeakSet[DataPath]" = weakref.WeakSet()


def _reset_after_fork() -> None:
    for path in list(_AFTER_FORK):
        path._forget_inherited()


os.register_at_fork(after_in_child=_reset_after_fork)


def _target(out, size: int, pool: BufferPool) -> np.ndarray:
    """The uint8 array a payload of `size` bytes is received into."""
    return pool.take(size) if out is None else out_array(out, size)


def checksum_mismatch(sample: str, label: str, expected: int, got: int) -> DataCorruption:
    """The error for a sample (named by `sample`) whose bytes fail their CRC32C here."""
    return DataCorruption(
        f"checksum mismatch for {sample} (received from {label}): stored CRC32C "
        f"{expected:08x}, received {got:08x}; the daemon's copy or the transfer is damaged "
        "(`dlfs scrub` checks the daemon's copy)")


def _verify(samples: list[memoryview], crcs: np.ndarray, ids: np.ndarray, dataset: str,
            label: str) -> None:
    for sample, expected, sample_id in zip(samples, crcs.tolist(), ids.tolist()):
        got = crc32c.crc32c(sample)
        if got != expected:
            error = checksum_mismatch(f"sample {sample_id} of dataset {dataset!r}", label,
                                      expected, got)
            error.sample_id, error.expected, error.got = sample_id, expected, got
            error.endpoint = label
            raise error
