"""The client side of the data path: a pool of connections to one daemon.

`DataPath` keeps up to `limits.data_connections_max` connections
(`datapath_conn.DataPathConnection`) to one daemon's data path
(`dlfs/proto/datapath.md`), one request in flight on each, and receives
every reply's payload into a buffer: the caller's `out`, or a recycled
buffer from a `BufferPool` that lives as long as any of the batch's samples
does.  No sample byte is copied in Python.  Each sample is checked against
the CRC32C the reply header carries (default on), so damage anywhere
between the daemon's disk and this process is caught here.

Connections are per process: after `os.fork` the child opens its own (a
DataLoader worker needs no gRPC to read; `process_state.data_paths`).  A
connection that breaks is dropped, and an idle one is looked at before it is
lent (`DataPathConnection.looks_alive`), so one whose daemon process went away is
never handed out; what follows a failure is the caller's call policy
(`dlfs.client.transport.call_policy`).
"""

from __future__ import annotations

import os
import socket
import threading

import numpy as np

from dlfs import limits, logs
from dlfs.client import process_state
from dlfs.formats import datapath_frames as frames
from dlfs.client.reply_buffers import BufferPool
from dlfs.client.transport.call_policy import Call
from dlfs.client.transport.datapath_conn import DataPathConnection, Endpoint, OpenedDataset, Received
from dlfs.errors import DlfsError, FailedPrecondition, Unavailable, VersionMismatch
from dlfs.sockio import unix_address


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


class DataPath:
    """A per-process pool of data connections to one daemon.  Thread-safe.

    `hint` (a `datapath_transport.DataPathHint`) is where the daemon said its
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
        self._idle: list[DataPathConnection] = []
        self._open = 0
        # Hints sent without waiting that the daemon's full queue dropped, counted from
        # connections given back (a connection's own count resets then).
        self.hints_dropped = 0
        self._pid = os.getpid()
        self._closed = False
        # Whether any connection ever got a WELCOME: until then, failing to
        # connect may mean the port is blocked rather than the daemon down.
        self.ever_connected = False
        # The last connect failed on every endpoint: the daemon is down, or
        # restarted with another data port or instance.
        self.unreachable = False
        # The daemon's batch limits, as the last WELCOME told them (None: not yet).
        self.batch_limits = None
        process_state.data_paths.add(self)

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

        One round trip.  Raises the daemon's typed errors (InvalidArgument over
        its batch limits before a byte is sent, once a WELCOME told them),
        DataCorruption when a sample fails its CRC32C here, Unavailable
        (retry-able) when the connection breaks.
        """
        request = frames.get_batch(dataset, ids, generation=generation, hints=hints,
                                     request_id=request_id or logs.current_request_id())
        with self._connection() as connection:
            connection.check_batch(len(ids), sum(map(len, request)) - frames.FRAME.size)
            return connection.get_batch(request, ids, dataset, verify=verify, out=out,
                                        pool=self.pool, generation=generation)

    def send_hints(self, dataset: str, hints: np.ndarray, *, request_id: str = "") -> None:
        """Ask the daemon to read samples `hints` of `dataset` into its page cache, without
        waiting for its answer (see `DataPathConnection.send_hint`); hints its full queue
        dropped are counted in `hints_dropped` once their replies were read."""
        request = frames.get_batch(dataset, np.empty(0, np.int64), hints=hints,
                                     request_id=request_id or logs.current_request_id())
        with self._connection() as connection:
            connection.send_hint(request)

    def read_range(self, dataset: str, sample_id: int, offset: int, length: int, *,
                   generation: int = 0, verify: bool = True, request_id: str = "") -> Received:
        """`length` bytes (0: to the end) at `offset` of one sample.

        With `verify`, the whole sample is checked against its CRC32C and a
        part of it against the CRC32Cs of the blocks around it (the daemon
        sends those whole blocks; at most one block more on each side).
        Parts of samples ingested before block CRCs cannot be checked.
        """
        request = frames.read_range(dataset, sample_id, offset, length, generation=generation,
                                      request_id=request_id or logs.current_request_id(),
                                      flags=frames.RANGE_BLOCKS if verify else 0)
        with self._connection() as connection:
            return connection.read_range(request, sample_id, offset, dataset, verify=verify,
                                         pool=self.pool, generation=generation, length=length)

    def stat_dataset(self, dataset: str) -> tuple[int, int, int]:
        """(generation, samples, bytes) of `dataset`'s current version, over the data path."""
        with self._connection() as connection:
            return connection.stat_dataset(dataset)

    def block_crcs(self, dataset: str, sample_id: int, generation: int = 0
                   ) -> tuple[int, int, np.ndarray | None]:
        """One sample's block CRCs (see DataPathConnection.block_crcs)."""
        with self._connection() as connection:
            return connection.block_crcs(dataset, sample_id, generation)

    def open_dataset(self, dataset: str, generation: int = 0) -> OpenedDataset:
        """The dataset's index and extent descriptors (see DataPathConnection.open_dataset)."""
        with self._connection() as connection:
            return connection.open_dataset(dataset, generation)

    def dedicated(self) -> DataPathConnection:
        """A new connection outside the pool, for a long conversation (an ingest); the
        caller closes it.  Connected as the call policy says (a refusal by one
        serving process's share of a split limit tried on the next one; an
        unreachable daemon not waited for)."""
        return Call("", timeout_s=self._reply_timeout_s, reconnect_timeout_s=0.0).run(
            self._connect)

    def _connection(self) -> "_Borrowed":
        return _Borrowed(self)

    def _take(self) -> DataPathConnection:
        with self._lock:
            if self._pid != os.getpid():
                self.forget_inherited()
            while True:
                if self._closed:
                    raise Unavailable("the client was closed")
                while self._idle:
                    connection = self._idle.pop()
                    if connection.looks_alive():
                        return connection
                    self._open -= 1  # its daemon process went away meanwhile
                    connection.close()
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

    def _connect(self) -> DataPathConnection:
        """A new connection, to the first endpoint that answers.  An Overloaded refusal
        at HELLO (`refused_at_connect`) is raised, not tried on the next endpoint:
        the daemon's limits are the same on each of its sockets (the call policy
        decides what follows it); so is a connection lost after its connect went
        through (another endpoint reaches the same daemon processes) and
        VersionMismatch."""
        last: Exception | None = None
        for index, endpoint in enumerate(self._endpoints):
            try:
                connection = DataPathConnection(endpoint, self._token, self._instance,
                                                connect_timeout_s=self._connect_timeout_s,
                                                reply_timeout_s=self._reply_timeout_s)
            except VersionMismatch:
                raise
            except Unavailable as exc:
                if exc.connection_lost:
                    raise
                last = exc
                continue
            except FailedPrecondition as exc:
                last = exc
                continue
            if index:  # an earlier endpoint failed: prefer this one from now on
                self._endpoints = self._endpoints[index:] + self._endpoints[:index]
            self.ever_connected = True
            self.unreachable = False
            self.batch_limits = connection.batch_limits
            return connection
        self.unreachable = True
        assert last is not None
        raise last if isinstance(last, Unavailable) else Unavailable(str(last))

    def _give_back(self, connection: DataPathConnection) -> None:
        with self._lock:
            self.hints_dropped += connection.hints_dropped
            connection.hints_dropped = 0
            if connection.broken or self._closed or self._pid != os.getpid():
                self._open -= 1
                connection.close()
            else:
                self._idle.append(connection)
            self._lock.notify()

    def forget_inherited(self) -> None:
        """In a forked child: the parent's connections are not ours to use or close."""
        self._pid = os.getpid()
        self._idle = []
        self._open = 0


class _Borrowed:
    """`with` block holding one connection of a DataPath."""

    __slots__ = ("_path", "_connection")

    def __init__(self, path: DataPath):
        self._path = path
        self._connection: DataPathConnection | None = None

    def __enter__(self) -> DataPathConnection:
        self._connection = self._path._take()
        return self._connection

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and not isinstance(exc, DlfsError):
            self._connection.broken = True  # interrupted mid-reply: state unknown
        self._path._give_back(self._connection)

