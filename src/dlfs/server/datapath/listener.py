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
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import resource
import select
import socket
import threading
import time
from typing import Iterator, NamedTuple

import numpy as np

from dlfs import limits
from dlfs.errors import DlfsError, Overloaded, Unavailable
from dlfs.formats import datapath_frames as frames
from dlfs.server.config import peer_share
from dlfs.server.datapath.admission import Admission, Entry
from dlfs.server.datapath.conn_handler import DataConnection
from dlfs.sockio import send_all, unix_address, wait_at_most

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

    At most `bytes_max // window_bytes` exist (at least one), and one peer holds
    at most `per_peer_max` of them at once (default: `limits.datapath_peer_share`
    of them).  A reply takes one per window it reads and gives it back as soon
    as the window went out or its client stopped taking bytes (`replies`), so a
    client that stopped reading holds none.  A take that finds none it may have
    waits, up to `limits.budget_wait_s_max` or its deadline, and is refused with
    Overloaded.
    """

    def __init__(self, window_bytes: int, bytes_max: int, per_peer_max: int = 0):
        self.window_bytes = window_bytes
        self.count_max = max(1, bytes_max // window_bytes)
        self.per_peer_max = peer_share(self.count_max, per_peer_max)
        self._free: list[np.ndarray] = []
        self._created = 0
        self._held: collections.Counter = collections.Counter()  # peer -> buffers held
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def take(self, peer: str = "", deadline: float | None = None) -> Iterator[np.ndarray]:
        """A buffer for `peer` for the block.  Raises Overloaded."""
        buffer = self._take(peer, deadline)
        try:
            yield buffer
        finally:
            with self._cond:
                self._free.append(buffer)
                self._held[peer] -= 1
                if not self._held[peer]:
                    del self._held[peer]
                self._cond.notify_all()  # waiters differ in whose share they wait for

    def held(self, peer: str) -> int:
        with self._cond:
            return self._held[peer]

    def _take(self, peer: str, deadline: float | None) -> np.ndarray:
        give_up = time.monotonic() + limits.budget_wait_s_max
        if deadline is not None:
            give_up = min(give_up, deadline)
        with self._cond:
            while (self._held[peer] >= self.per_peer_max
                   or (not self._free and self._created >= self.count_max)):
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    raise self._refusal(peer)
                self._cond.wait(remaining)
            self._held[peer] += 1
            if self._free:
                return self._free.pop()
            self._created += 1
        return np.empty(self.window_bytes, dtype=np.uint8)

    def _refusal(self, peer: str) -> Overloaded:
        if self._held[peer] >= self.per_peer_max:
            return Overloaded(
                f"{peer} holds {self._held[peer]} of the data path's {self.count_max} window "
                "buffers, its share, in replies it does not read; read them, or retry later")
        return Overloaded(
            f"every data path window buffer is in use ({self.count_max} of "
            f"{self.window_bytes} bytes, --datapath-buffer-bytes-max); retry later")


class DataPathServer:
    """Serves the data path of one Store.  `start()` binds, `stop()` closes everything.

    `tcp_host`/`tcp_port`: where to listen for TCP (port 0 picks one; None:
    no TCP); `unix_socket`: a path, or "@name" for the abstract namespace
    ("" for none).  `authorizer`: a `dlfs.server.auth.Authorizer`, or None
    when the daemon has no tokens file.  `connections_per_peer_max` 0: a
    share of `connections_max` (`config.peer_share`).
    """

    def __init__(self, store, *, tcp_host: str | None, tcp_port: int, unix_socket: str,
                 authorizer=None, instance: bytes, connections_max: int,
                 idle_timeout_s: float, stall_timeout_s: float, buffer_bytes_max: int,
                 connections_per_peer_max: int = 0):
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
            handshakes_max=limits.datapath_handshakes_max,
            handshakes_per_peer_max=limits.datapath_handshakes_per_peer_max,
            hello_timeout_s=limits.datapath_hello_timeout_s)
        batch_limits = store.batch_limits
        # What WELCOME tells a client that asks: it checks its requests against them.
        self.limits = frames.DaemonLimits(batch_limits.ids_max, batch_limits.bytes_max,
                                          frames.request_bytes_max(batch_limits.ids_max))
        self._tcp_host, self._tcp_port = tcp_host, tcp_port
        self.unix_socket = unix_socket
        self.port = 0
        self._listeners: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        # A descriptor kept in reserve: out of descriptors, it is closed for a moment
        # to accept a waiting connection and tell it why it is not served.
        self._spare: int | None = None
        self._spare_lock = threading.Lock()
        self._starving = _Starving()

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Bind and listen; raises RuntimeError naming an address that cannot be bound."""
        try:
            self._spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            if self._tcp_host is not None:
                family = socket.AF_INET6 if ":" in self._tcp_host else socket.AF_INET
                listener = socket.socket(family, socket.SOCK_STREAM)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind((self._tcp_host.strip("[]"), self._tcp_port))
                self.port = listener.getsockname()[1]
                self._listen(listener, "TCP port")
            if self.unix_socket:
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listener.bind(unix_address(self.unix_socket))
                if not self.unix_socket.startswith("@"):
                    os.chmod(self.unix_socket, 0o666)  # tokens, not file modes, guard it
                self._listen(listener, "Unix socket")
        except OSError as exc:
            self.stop()
            raise RuntimeError(f"cannot listen for the data path: {exc.strerror or exc}") from None

    def _listen(self, listener: socket.socket, label: str) -> None:
        listener.listen(_LISTEN_BACKLOG)
        # A bounded wait in accept: a loop that lost a waiting connection to another
        # acceptor of the same socket (worker processes) wakes to look again.
        listener.settimeout(limits.datapath_accept_backoff_s_max)
        self._listeners.append(listener)
        thread = threading.Thread(target=self._accept, args=(listener, label), daemon=True,
                                  name=f"dlfs-data-accept-{len(self._listeners)}")
        self._threads.append(thread)
        thread.start()

    def stop(self) -> None:
        """Stop accepting, break every connection, free the Unix socket path."""
        self._stopping.set()
        for listener in self._listeners:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() of its thread
            listener.close()
        for sock in self.admission.sockets():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(limits.datapath_hello_timeout_s)
        with self._spare_lock:
            if self._spare is not None:
                os.close(self._spare)
                self._spare = None
        if self.unix_socket and not self.unix_socket.startswith("@"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.unix_socket)

    @property
    def connections(self) -> int:
        """Connections served (past HELLO)."""
        return self.admission.served

    def count_connections(self) -> None:
        """Bring the connection gauges up to date."""
        metrics = self.store.metrics
        metrics.data_connections.set(self.admission.served)
        metrics.data_handshakes.set(self.admission.pending)

    # --- accepting ---------------------------------------------------------------------

    def _accept(self, listener: socket.socket, label: str) -> None:
        """Accept until `stop()`.  Out of descriptors or kernel memory: count it, say so
        once per episode (`_Starving`), refuse the waiting connections with an ERROR
        that says why, back off (doubling) and accept again once there is room."""
        backoff_s = 0.0
        while not self._stopping.is_set():
            try:
                if self._starving.short:
                    # One accept at a time while descriptors are short: the other loop
                    # must not take the descriptor the spare gives up for a moment.
                    with self._spare_lock:
                        sock, _peer = listener.accept()
                else:
                    sock, _peer = listener.accept()
            except socket.timeout:
                continue
            except OSError as exc:
                if self._stopping.is_set():
                    return
                if exc.errno in _RESOURCE_ERRNOS:
                    self.store.metrics.data_accept_errors.labels(
                        errno.errorcode.get(exc.errno, str(exc.errno))).inc()
                    self._starving.failed(label, exc)
                    sock = self._refuse_waiting(listener, exc)
                    if sock is None:
                        backoff_s = min(max(2 * backoff_s, limits.datapath_accept_backoff_s_min),
                                        limits.datapath_accept_backoff_s_max)
                        self._stopping.wait(backoff_s)
                        continue
                elif exc.errno in _TRANSIENT_ERRNOS:
                    continue  # that connection is gone; the next one is not
                else:
                    log.error("accepting on the data path's %s failed: %s; trying again",
                              label, exc)
                    self._stopping.wait(limits.datapath_accept_backoff_s_max)
                    continue
            backoff_s = 0.0
            self._starving.accepted(label)
            self._start(sock)

    def _start(self, sock: socket.socket) -> None:
        if self._stopping.is_set():
            _refuse(sock, Unavailable("the daemon is shutting down"))
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
            _refuse(sock, Overloaded(f"the daemon cannot start a thread for this data "
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
            for _ in range(_LISTEN_BACKLOG):
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
                    _refuse(sock, error)
                    continue
                return sock  # a descriptor was free after all: serve it
        return None

    # --- one connection ------------------------------------------------------------------

    def _serve(self, entry: Entry) -> None:
        sock = entry.sock
        try:
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            else:
                # Room for a whole window (TCP grows its buffer by itself; a Unix
                # socket keeps the default 208 KiB, and a window sent by sendfile then
                # waits for the client some twenty times: 110 KB and 140 MB samples
                # 5-30% faster with it).  The kernel caps it at net.core.wmem_max.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.buffers.window_bytes)
            connection = DataConnection(self, entry)
            if connection.handshake():
                connection.serve()
        except OSError:
            pass  # the client went away or stalled: nothing to answer
        except Exception:  # noqa: BLE001 - a bug must not take the daemon down
            log.exception("data path connection failed")
        finally:
            self.admission.leave(entry)
            self.count_connections()
            # Only a served connection's client is owed the time to read a last ERROR
            # frame while what it still sends is drained.
            _close(sock, drain=entry.served)


class _Starving:
    """Episodes of failed accepts (out of descriptors or memory), for the log: one line
    when an episode starts and one when accepts succeed again, however often a
    daemon at its limit flaps between the two.  Failures less than
    `limits.datapath_accept_episode_s` apart are one episode.  Thread-safe (the
    accept loops of both listeners share one)."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._last_failure: float | None = None
        self._since = 0.0
        self._failures = 0
        self._recovered = True
        # The last accept failed for want of room (read without the lock: a hint).
        self.short = False

    def failed(self, label: str, exc: OSError) -> None:
        now = self._clock()
        with self._lock:
            new = self._last_failure is None or \
                now - self._last_failure > limits.datapath_accept_episode_s
            self._last_failure = now
            if new:
                self._since, self._failures, self._recovered = now, 0, False
            self._failures += 1
            self.short = True
        if new:
            log.warning("cannot accept data path connections on the %s: %s (%s); telling "
                        "waiting clients to read through gRPC, and trying again (RLIMIT_NOFILE "
                        "%d: raise it, e.g. LimitNOFILE= in the systemd unit, if this recurs)",
                        label, exc.strerror, errno.errorcode.get(exc.errno, exc.errno),
                        resource.getrlimit(resource.RLIMIT_NOFILE)[0])

    def accepted(self, label: str) -> None:
        self.short = False
        if self._recovered:  # the common case (no episode, or its end said), without the lock
            return
        with self._lock:
            if self._recovered:
                return
            self._recovered = True
            failures, since = self._failures, self._since
        log.warning("accepting data path connections again (on the %s) after %d failed "
                    "accepts in %.1f s", label, failures, self._clock() - since)


# Accept errors that mean "no room now" (descriptors, kernel memory), not "no listener".
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# Accept errors of one connection that went away (or a firewall's verdict on it).
_TRANSIENT_ERRNOS = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN,
                               errno.EPERM, errno.ENETDOWN, errno.ENOPROTOOPT, errno.EHOSTDOWN,
                               errno.ENONET, errno.EHOSTUNREACH, errno.EOPNOTSUPP,
                               errno.ENETUNREACH})


def _refuse(sock: socket.socket, error: DlfsError) -> None:
    """Answer a connection that cannot be served with one ERROR frame, then close it."""
    try:
        send_all(sock, [frames.error(error)],
                 deadline=time.monotonic() + limits.datapath_error_send_s)
    except OSError:
        pass
    _close(sock, drain=False)


def _close(sock: socket.socket, *, drain: bool = True) -> None:
    """Close so that a last ERROR frame arrives: closing with unread input would reset
    the connection, and with `drain` the client's unread bytes are read first (at
    most `limits.datapath_drain_bytes_max`, for at most `limits.datapath_drain_s`).
    The frame survives a reset on Linux, but a client's send then fails instead of
    finishing; a connection that never authenticated is not owed that."""
    try:
        sock.shutdown(socket.SHUT_WR)
        if drain:
            give_up = time.monotonic() + limits.datapath_drain_s
            drained = 0
            chunk = bytearray(65536)
            while drained < limits.datapath_drain_bytes_max:
                wait_at_most(sock, give_up)
                n = sock.recv_into(chunk)
                if not n:
                    break
                drained += n
    except OSError:
        pass
    finally:
        sock.close()
