"""The daemon side of the data path (`dlfs/proto/datapath.md`): sample bytes to sockets.

`DataPathServer` listens on a TCP port and a Unix socket and serves each
connection on a thread of its own (`conn_handler.ServedConnection`), one request
at a time: HELLO (token checked in constant time), then GET_BATCH /
READ_RANGE / STAT_DATASET / OPEN_DATASET (`replies`).  A batch is
planned in request order (`planning.RequestOrder`), read window by window
by the read engine into a window buffer taken from a fixed pool
(`WindowBuffers`: no allocation per request), and each window is sent with
one `sendmsg` of its frame header and buffer: no copy in Python.  The
daemon does not checksum what it sends; the reply header carries the
stored CRC32Cs and the client verifies.

Bounds (issue 37, "hostile peers"): every deadline covers a whole operation
on the monotonic clock, not one system call: a handshake
(`limits.datapath_hello_timeout_s` from the accept), a request frame
(`limits.datapath_request_timeout_s` from its first byte), a reply (the stall
timeout plus its payload at `limits.datapath_reply_bytes_per_s_min`), and a
reply that makes no progress for `datapath_stall_timeout_s` is abandoned too.
Connections not yet past HELLO have a budget of their own, apart from the
`datapath_connections_max` served ones, and each peer holds at most its
share of the served connections and of the window buffers (`admission`,
`WindowBuffers`); a reply holds a buffer only while it reads and sends a
window, none for windows sent by sendfile.  The accept loops survive running
out of descriptors or kernel memory: they count it, say so once per
episode, tell the waiting clients why, back off and accept again.  Idle
connections are closed after `datapath_idle_timeout_s`.  A malformed frame is
answered with an ERROR that says why and the connection is closed; it never
reaches the storage core.  Nothing here imports grpc.

The same server runs in each data path worker process (workers.py): there
it is given the listening sockets the main process bound (`listeners`),
which every worker shares and none shuts down, its share of the daemon's
budgets, and an `ingest` hook that hands INGEST_START connections to the
main process; the main process serves those with `adopt`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import struct
import threading
from typing import NamedTuple

from dlfs import limits
from dlfs.errors import DlfsError, Overloaded, Unavailable
from dlfs.formats import datapath_frames as frames
from dlfs.server.config import peer_share
from dlfs.server.datapath import file_writes, uploads
from dlfs.server.datapath.accept_episodes import AcceptEpisodes
from dlfs.server.datapath.admission import Admission, AcceptedConnection
from dlfs.server.datapath.conn_handler import ServedConnection
from dlfs.server.datapath.listen_sockets import LISTEN_BACKLOG, bind_listeners, close_listeners
from dlfs.server.datapath.refusals import close_connection, refuse
from dlfs.server.datapath.window_buffers import WindowBuffers
from dlfs.sockio import RESOURCE_ERRNOS, TRANSIENT_ERRNOS

log = logging.getLogger(__name__)

LISTEN_BACKLOG = 128
_NO_TIMEOUT = struct.pack("ll", 0, 0)  # a struct timeval of zero: SO_RCVTIMEO off


class DataPathInfo(NamedTuple):
    """Where the data path listens (the GetDataPath reply, before conversion)."""

    enabled: bool
    reason: str
    version: int
    port: int
    unix_socket: str
    instance: bytes


class DataPathServer:
    """Serves the data path of one Store.  `start()` binds, `stop()` closes everything.

    `tcp_host`/`tcp_port`: where to listen for TCP (port 0 picks one; None:
    no TCP); `unix_socket`: a path, or "@name" for the abstract namespace
    ("" for none).  Or `listeners`: sockets already listening, shared with
    other processes (a data path worker's), which `stop()` leaves open for
    them.  `authorizer`: a `dlfs.server.auth.Authorizer`, or None when the
    daemon has no tokens file.  `connections_per_peer_max` 0: a share of
    `connections_max` (`config.peer_share`); `handshakes_max` and
    `handshakes_per_peer_max`: the budget of connections not past HELLO
    (a worker's share of the daemon's).  `processes`: how many workers share
    the daemon's limits, whose figures (`daemon_connections_max`,
    `daemon_per_peer_max`) refusals name.  `ingest(connection, request)`
    serves an INGEST_START (uploads.ingest) and `write_file(connection, request)`
    a FILE_OPEN (file_writes.serve_file); a worker hands both over instead.
    """

    def __init__(self, store, *, tcp_host: str | None, tcp_port: int, unix_socket: str,
                 authorizer=None, instance: bytes, connections_max: int,
                 idle_timeout_s: float, stall_timeout_s: float, buffer_bytes_max: int,
                 connections_per_peer_max: int = 0,
                 handshakes_max: int = limits.datapath_handshakes_max,
                 handshakes_per_peer_max: int = limits.datapath_handshakes_per_peer_max,
                 listeners: list[socket.socket] | None = None, processes: int = 1,
                 daemon_connections_max: int = 0, daemon_per_peer_max: int = 0):
        self.store = store
        self.instance = instance
        self.authorizer = authorizer
        self.connections_max = connections_max
        self.idle_timeout_s = idle_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.buffers = WindowBuffers(store.config.chunk_bytes, buffer_bytes_max)
        self.admission = Admission(
            connections_max=connections_max,
            per_peer_max=min(connections_max,
                             peer_share(connections_max, connections_per_peer_max)),
            handshakes_max=handshakes_max,
            handshakes_per_peer_max=min(handshakes_per_peer_max, handshakes_max),
            hello_timeout_s=limits.datapath_hello_timeout_s, processes=processes,
            daemon_connections_max=daemon_connections_max,
            daemon_per_peer_max=daemon_per_peer_max)
        batch_limits = store.batch_limits
        # What WELCOME tells a client that asks: it checks its requests against them.
        self.limits = frames.DaemonLimits(batch_limits.ids_max, batch_limits.bytes_max,
                                          frames.request_bytes_max(batch_limits.ids_max))
        self._tcp_host, self._tcp_port = tcp_host, tcp_port
        self.unix_socket = unix_socket
        self.port = 0
        self.ingest = uploads.ingest
        self.write_file = file_writes.serve_file
        self._given = list(listeners or [])
        self._requests = 0
        self._listeners: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        # A descriptor kept in reserve: out of descriptors, it is closed for a moment
        # to accept a waiting connection and tell it why it is not served.
        self._spare: int | None = None
        self._spare_lock = threading.Lock()
        self._starving = AcceptEpisodes()
        # Accepts running without the spare's lock (descriptors were not short when
        # they began): the spare is given up only once none is left, or one of them
        # could take its descriptor and leave the waiting clients unanswered.
        self._free_accepts = 0
        self._draining = False  # a loop is refusing the waiting connections (the spare out)
        self._accepts_done = threading.Condition()

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Bind and listen (or accept on the given listeners); raises RuntimeError naming
        an address that cannot be bound."""
        try:
            self._spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            if self._given:
                for listener in self._given:
                    self._listen(listener, "Unix socket" if listener.family == socket.AF_UNIX
                                 else "TCP port")
                return
            listeners, self.port = bind_listeners(self._tcp_host, self._tcp_port,
                                                  self.unix_socket)
            for listener in listeners:
                self._listen(listener, "Unix socket" if listener.family == socket.AF_UNIX
                             else "TCP port")
        except (OSError, RuntimeError) as exc:
            self.stop()
            if isinstance(exc, RuntimeError):
                raise
            raise RuntimeError(f"cannot listen for the data path: {exc.strerror or exc}") from None

    def _listen(self, listener: socket.socket, label: str) -> None:
        # A bounded wait in accept, to see `stop` and (out of descriptors) to let the
        # other loop have the spare.  On listeners shared with other workers not by
        # `settimeout`: it would make the shared socket non-blocking for every process,
        # and their accepts would wait in poll(), which wakes them all for each
        # connection and hands it to whichever runs first (most often the same one).
        # SO_RCVTIMEO bounds a blocking accept(), which wakes one waiter per connection,
        # in turn, and so spreads the connections over the workers.
        if self._given:
            seconds = limits.datapath_accept_backoff_s_max
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack(
                "ll", int(seconds), int(seconds % 1 * 1e6)))
        else:
            listener.settimeout(limits.datapath_accept_backoff_s_max)
        self._listeners.append(listener)
        thread = threading.Thread(target=self._accept, args=(listener, label), daemon=True,
                                  name=f"dlfs-data-accept-{len(self._listeners)}")
        self._threads.append(thread)
        thread.start()

    def stop(self) -> None:
        """Stop accepting, break every connection, free the Unix socket path (listeners
        given at construction stay open: other processes accept on them)."""
        self._stopping.set()
        if not self._given:
            close_listeners(self._listeners, self.unix_socket)
        for sock in self.admission.sockets():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(limits.datapath_hello_timeout_s)
        with self._spare_lock:
            if self._spare is not None:
                os.close(self._spare)
                self._spare = None

    @property
    def connections(self) -> int:
        """Connections served (past HELLO)."""
        return self.admission.served

    def count_connections(self) -> None:
        """Bring the connection gauges up to date."""
        metrics = self.store.metrics
        metrics.data_connections.set(self.admission.served)
        metrics.data_handshakes.set(self.admission.pending)

    @property
    def requests(self) -> int:
        """Requests read since the start (answered, failed or handed over)."""
        return self._requests

    def count_request(self) -> None:
        self._requests += 1  # under the GIL; a counter for status lines, not an invariant

    def adopt(self, sock: socket.socket, role: str | None, kind: int, body: bytes) -> None:
        """Serve a connection another process accepted and handed over (a worker's
        INGEST_START): its HELLO was answered there (`role` is its token's role), and
        `kind`/`body` is the request frame it read last, answered first here."""
        if self._stopping.is_set():
            refuse(sock, Unavailable("the daemon is shutting down"))
            return
        entry = self.admission.arrive(sock)
        try:
            self.admission.admit(entry)
        except Overloaded as exc:
            self.admission.leave(entry)
            refuse(sock, exc)
            return
        self.count_connections()
        threading.Thread(target=self._serve, args=(entry, (role, kind, body)), daemon=True,
                         name="dlfs-data-conn").start()

    # --- accepting ---------------------------------------------------------------------

    def _accept(self, listener: socket.socket, label: str) -> None:
        """Accept until `stop()`.  Out of descriptors or kernel memory: count it, say so
        once per episode (`AcceptEpisodes`), refuse the waiting connections with an ERROR
        that says why, back off (doubling) and accept again once there is room."""
        backoff_s = 0.0
        while not self._stopping.is_set():
            try:
                sock = self._accept_one(listener)
            except socket.timeout:
                continue
            except OSError as exc:
                if self._stopping.is_set():
                    return
                if exc.errno in RESOURCE_ERRNOS:
                    self.store.metrics.data_accept_errors.labels(
                        errno.errorcode.get(exc.errno, str(exc.errno))).inc()
                    self._starving.failed(label, exc)
                    sock = self._refuse_waiting(listener, exc)
                    if sock is None:
                        backoff_s = min(max(2 * backoff_s, limits.datapath_accept_backoff_s_min),
                                        limits.datapath_accept_backoff_s_max)
                        self._stopping.wait(backoff_s)
                        continue
                elif exc.errno in TRANSIENT_ERRNOS:
                    continue  # that connection is gone; the next one is not
                else:
                    log.error("accepting on the data path's %s failed: %s; trying again",
                              label, exc)
                    self._stopping.wait(limits.datapath_accept_backoff_s_max)
                    continue
            backoff_s = 0.0
            self._starving.accepted(label)
            self._start(sock)

    def _accept_one(self, listener: socket.socket) -> socket.socket:
        """One accept (bounded by the listener's timeout).  While descriptors are short,
        one at a time under the spare's lock: the other loop must not take the
        descriptor the spare gives up for a moment."""
        with self._accepts_done:
            short = self._starving.short or self._draining
            if not short:
                self._free_accepts += 1
        if short:
            with self._spare_lock:
                return listener.accept()[0]
        try:
            return listener.accept()[0]
        finally:
            with self._accepts_done:
                self._free_accepts -= 1
                self._accepts_done.notify_all()

    def _start(self, sock: socket.socket) -> None:
        if self._stopping.is_set():
            refuse(sock, Unavailable("the daemon is shutting down"))
            return
        entry = self.admission.arrive(sock)
        self.count_connections()
        try:
            threading.Thread(target=self._serve, args=(entry,), daemon=True,
                             name="dlfs-data-conn").start()
        except RuntimeError as exc:  # no thread to be had (memory, a pids cgroup limit)
            self.admission.leave(entry)
            self.count_connections()
            self.store.metrics.data_refused.labels("threads").inc()
            refuse(sock, Overloaded(f"the daemon cannot start a thread for this data "
                                     f"connection ({exc}); reading through gRPC, or retry "
                                     "later"))

    def _refuse_waiting(self, listener: socket.socket, exc: OSError) -> socket.socket | None:
        """Out of descriptors: accept each waiting connection through the spare one and
        refuse it with an ERROR that says why.  Returns a connection to serve instead
        when descriptors turn out to be free again."""
        short_of = "file descriptors" if exc.errno in (errno.EMFILE, errno.ENFILE) \
            else "kernel memory"
        error = Overloaded(
            f"the DLFS daemon is out of {short_of} for data connections ({exc.strerror}); "
            "read through gRPC, or retry later")
        poller = select.poll()
        poller.register(listener, select.POLLIN)
        with self._spare_lock:
            # Accepts that begin from now on take the lock; those already running end
            # within their timeout: wait for them before the spare goes.
            with self._accepts_done:
                self._draining = True
                drained = self._accepts_done.wait_for(
                    lambda: self._free_accepts == 0 or self._stopping.is_set(),
                    timeout=2 * limits.datapath_accept_backoff_s_max)
            try:
                return self._refuse_through_spare(listener, poller, error) if drained \
                    else None
            finally:
                with self._accepts_done:
                    self._draining = False

    def _refuse_through_spare(self, listener: socket.socket, poller, error: DlfsError
                              ) -> socket.socket | None:
        """`_refuse_waiting`'s loop, under the spare's lock with no other accept running."""
        for _ in range(LISTEN_BACKLOG):
            if self._spare is None:
                try:
                    self._spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    return None  # nothing in reserve: the back-off alone
            if not poller.poll(0):
                return None
            os.close(self._spare)
            self._spare = None
            try:
                sock, _peer = listener.accept()
            except OSError:
                return None  # another acceptor took it, or none is free after all
            try:
                self._spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self.store.metrics.data_refused.labels("descriptors").inc()
                refuse(sock, error)
                continue
            return sock  # a descriptor was free after all: serve it
        return None

    # --- one connection ------------------------------------------------------------------

    def _serve(self, entry: AcceptedConnection, adopted: tuple | None = None) -> None:
        sock = entry.sock
        connection = None
        try:
            if self._given and adopted is None:
                # An accepted socket inherits its listener's SO_RCVTIMEO (see `_listen`);
                # the connection's own deadlines are the only ones it may have.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _NO_TIMEOUT)
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            else:
                # Room for a whole window (TCP grows its buffer by itself; a Unix
                # socket keeps the default 208 KiB, and a window sent by sendfile then
                # waits for the client some twenty times; log-datapath.md has the
                # figures).  The kernel caps it at net.core.wmem_max.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.buffers.window_bytes)
            connection = ServedConnection(self, entry)
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
            self.admission.leave(entry)
            self.count_connections()
            if connection is not None and connection.detached:
                sock.close()  # handed over: the connection lives on in another process
            else:
                # Only a served connection's client is owed the time to read a last
                # ERROR frame while what it still sends is drained.
                close_connection(sock, drain=entry.served)
