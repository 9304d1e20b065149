"""The gRPC port's front door: the daemon accepts, admits, and relays to gRPC.

gRPC's C core offers no preface deadline, no per-host share and no eviction
(its bound closes *new* connections while idle ones hold the slots, so an
idle flood locked out health checks), and grpcio cannot adopt a connection
accepted elsewhere.  So `GrpcDoor` listens on the --listen port itself and
gRPC on a Unix socket in a private directory (`upstream`):

- one door thread accepts and holds each new connection, non-blocking,
  until its client's HTTP/2 preface and SETTINGS arrived whole
  (`door_frames.Handshake`; over TLS, its first byte of a TLS handshake),
  within `limits.grpc_handshake_timeout_s` of the accept, under the
  handshake budget of `DoorAdmission` (the oldest pending one is evicted,
  of its host first);
- a handshaken connection is handed off (`DoorAdmission.hand_off`: the bound
  and its host's share, where the oldest that made no call gives way) and
  relayed by two threads, one a direction, to a Unix connection to gRPC
  bound to an abstract name that carries the client's address, so that
  `client_peer` gives gRPC's servicers the real peer;
- the relay follows the client's frame headers until its first HEADERS
  frame (`door_frames.CallWatch`): from then on it is a calling connection
  and no newcomer evicts it.  Over TLS a connection counts as calling once
  relayed (the door cannot see its calls);
- a refused or evicted pending connection is told why in a GOAWAY's debug
  data (not over TLS: its client expects TLS records); an evicted open one is
  closed (its client connects again at its
  next call, as after gRPC's idle close).

A relay direction whose peer does not take its bytes for `send_timeout_s`
breaks the connection.  Either direction ending ends both (gRPC never
half-closes).  Nothing here imports grpc.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import selectors
import socket
import struct
import threading
import time
from typing import Callable

from dlfs import limits
from dlfs.server.grpc import door_frames
from dlfs.server.grpc.door_admission import Door, DoorAdmission, DoorRefused
from dlfs.sockio import RESOURCE_ERRNOS, TRANSIENT_ERRNOS

log = logging.getLogger(__name__)

LISTEN_BACKLOG = 1024
# The abstract name a relay's connection to gRPC is bound to starts with this; the
# client's gRPC peer string ("ipv4:HOST:PORT") follows the "/".
_RELAY_NAME = "dlfs-door-"
_ACCEPTS_PER_WAKE = 64  # then pending connections get their turn
_READ_BYTES = 4096


# What the log says of each reason the door turns a connection away.
_SAID = {
    "handshake_evicted": "closed a connection that had not sent its HTTP/2 preface and "
                         "SETTINGS, for a newer one (the handshake budget was full: an "
                         "idle flood?)",
    "handshake_deadline": "closed a connection whose HTTP/2 preface and SETTINGS did not "
                          f"arrive within {limits.grpc_handshake_timeout_s:g} s",
    "not_http2": "closed a connection that does not speak HTTP/2 (TLS, on a TLS port)",
    "idle_evicted": "closed a relayed connection that had made no call, for a newer one "
                    "(--grpc-connections-max or its host's share was full)",
    "descriptors": "out of file descriptors or kernel memory for gRPC connections",
    "threads": "could not start a relay thread for a gRPC connection",
}


def client_peer(peer: str) -> str:
    """The client behind a gRPC peer string: the relayed client's own ("ipv4:HOST:PORT")
    for a connection the door relays, else `peer` as it is."""
    kind, _, name = peer.partition(":")
    if kind == "unix-abstract" and name.startswith(_RELAY_NAME) and "/" in name:
        return name.partition("/")[2]
    return peer


class GrpcDoor:
    """Accepts on `host`:`port` (0 picks one) and relays admitted connections to gRPC
    listening on the Unix socket `upstream`.  `tls`: the port serves TLS (the door
    sees TLS records, not HTTP/2).  `refused(reason)` counts each connection the
    door turns away or breaks off (handshake_evicted, handshake_deadline,
    not_http2, idle_evicted, connections, peer_share, threads)."""

    def __init__(self, host: str, port: int, upstream: str, *, admission: DoorAdmission,
                 tls: bool, send_timeout_s: float, refused: Callable[[str], None],
                 handshake_timeout_s: float = limits.grpc_handshake_timeout_s,
                 clock: Callable[[], float] = time.monotonic):
        self.host, self.port = host, port
        self.upstream = upstream
        self.admission = admission
        self.tls = tls
        self.send_timeout_s = send_timeout_s
        self.handshake_timeout_s = handshake_timeout_s
        self._refused = refused
        self._clock = clock
        self._listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                                       socket.SOCK_STREAM)
        self._selector = selectors.DefaultSelector()
        self._pending: dict[Door, None] = {}  # the door thread's, oldest first
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._names = itertools.count()
        self._short_since: float | None = None  # out of descriptors since (accepting)
        self._said: dict[str, tuple[float | None, int]] = {}  # reason: (logged, since)

    # --- lifecycle -------------------------------------------------------------------

    def bind(self) -> int:
        """Bind and listen (connections wait in the kernel until `start`); the port
        bound.  Raises OSError."""
        listener = self._listener
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.host.strip("[]"), self.port))
            listener.listen(LISTEN_BACKLOG)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self.port = listener.getsockname()[1]
        return self.port

    def start(self) -> None:
        """Accept and relay (gRPC serves its Unix socket by now)."""
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, daemon=True, name="dlfs-grpc-door")
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting and break every connection (gRPC's own stop ends its calls)."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread is not None:
            self._thread.join()
        for door in self.admission.everyone():
            _break(door.held)
            self.admission.leave(door)
        for door in list(self._pending):
            _close(door.held)
        self._pending.clear()
        self._selector.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()

    # --- the door thread -------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._turn()
            except Exception:  # noqa: BLE001 - the door must outlive any one connection
                log.exception("the gRPC door failed a turn; going on")

    def _turn(self) -> None:
        now = self._clock()
        wait_s = limits.datapath_accept_backoff_s_max
        if self._pending:
            wait_s = min(wait_s, max(0.0, next(iter(self._pending)).deadline - now))
        for key, _events in self._selector.select(wait_s):
            if key.fileobj is self._listener:
                self._accept()
            elif key.fileobj is self._wake_r:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(64)
            else:
                self._read(key.data)
        self._expire(self._clock())
        if self._short_since is not None and \
                self._clock() - self._short_since >= limits.datapath_accept_backoff_s_max:
            self._short_since = None  # accept again
            self._selector.register(self._listener, selectors.EVENT_READ, None)

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_WAKE):
            try:
                sock, _address = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in RESOURCE_ERRNOS:
                    self._out_of_room(exc)
                elif exc.errno not in TRANSIENT_ERRNOS:
                    log.error("accepting on the gRPC port failed: %s; trying again", exc)
                return
            sock.setblocking(False)
            door = Door(_host_of(sock), self._clock() + self.handshake_timeout_s,
                        _Pending(sock, door_frames.Handshake()))
            victim = self.admission.arrive(door)
            if victim is not None:
                self._turn_away(victim, "handshake_evicted", (
                    f"this connection had not sent its HTTP/2 preface and SETTINGS when the "
                    f"daemon's {self.admission.handshakes_max} connections waiting for them "
                    f"(or the {self.admission.handshakes_per_peer_max} of one host) were all "
                    "taken, and it had waited longest; connect again and send them at once"))
            self._pending[door] = None
            self._selector.register(sock, selectors.EVENT_READ, door)

    def _out_of_room(self, exc: OSError) -> None:
        """Out of descriptors or kernel memory: stop accepting for a while (the kernel
        queues new connections meanwhile), counted and logged as refusals are."""
        self._short_since = self._clock()
        self._count("descriptors", "?", f"cannot accept gRPC connections: {exc.strerror} "
                    f"({errno.errorcode.get(exc.errno or 0, exc.errno)}); trying again in "
                    f"{limits.datapath_accept_backoff_s_max:g} s")
        self._selector.unregister(self._listener)

    def _read(self, door: Door) -> None:
        pending: _Pending = door.held
        try:
            chunk = pending.sock.recv(_READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._forget(door)
            self.admission.leave(door)
            _close(pending)
            return
        try:
            if self.tls:
                if not door_frames.looks_like_tls(chunk):
                    raise door_frames.NotHttp2("not a TLS client (this port serves TLS)")
                pending.handshake.data += chunk
                done = True
            else:
                done = pending.handshake.feed(chunk)
        except door_frames.NotHttp2 as exc:
            self._turn_away(door, "not_http2", f"{exc}; this is a DLFS daemon's gRPC port")
            return
        if done:
            self._hand_off(door)

    def _expire(self, now: float) -> None:
        while self._pending:
            door = next(iter(self._pending))
            if door.deadline > now:
                return
            self._turn_away(door, "handshake_deadline", (
                f"the HTTP/2 preface and SETTINGS did not arrive within "
                f"{self.handshake_timeout_s:g} s of the connect; send them at once"))

    def _turn_away(self, door: Door, reason: str, why: str) -> None:
        """Tell a pending connection why (best effort: it may not read) and close it."""
        self._forget(door)
        self.admission.leave(door)
        self._count(reason, door.peer)
        self._refuse(door.held.sock, why)
        _close(door.held)

    def _refuse(self, sock: socket.socket, why: str) -> None:
        """Send `why` in a GOAWAY, without waiting; not over TLS, where the client
        expects TLS records (there, it learns of the close alone)."""
        if not self.tls:
            with contextlib.suppress(OSError):
                sock.send(door_frames.refusal(why))

    def _forget(self, door: Door) -> None:
        """The door thread no longer waits on a pending connection."""
        if door in self._pending:
            del self._pending[door]
            self._selector.unregister(door.held.sock)

    def _hand_off(self, door: Door) -> None:
        pending: _Pending = door.held
        self._forget(door)
        try:
            victim = self.admission.hand_off(door, calling=self.tls)
        except DoorRefused as exc:
            self._count(exc.reason, door.peer, exc.message)
            self._refuse(pending.sock, exc.message)
            _close(pending)
            return
        if victim is not None:
            self._count("idle_evicted", victim.peer)
            _break(victim.held)
        relay = _Relay(self, door, pending.sock, bytes(pending.handshake.data))
        door.held = relay
        try:
            threading.Thread(target=relay.inward, daemon=True, name="dlfs-grpc-relay").start()
        except RuntimeError:  # no thread to be had (memory, a pids cgroup limit)
            self._count("threads", door.peer)
            self.admission.leave(door)
            relay.close()

    def _count(self, reason: str, peer: str, message: str = "") -> None:
        """Count a connection turned away or broken off; log it, the first of each
        reason at once and then one line per `limits.datapath_accept_episode_s` saying
        how many more (a flood writes a line, not a line a connection)."""
        self._refused(reason)
        now = self._clock()
        last, quiet = self._said.get(reason, (None, 0))
        if last is not None and now - last < limits.datapath_accept_episode_s:
            self._said[reason] = (last, quiet + 1)
            return
        self._said[reason] = (now, 0)
        log.warning("gRPC door: %s (%s; dlfs_grpc_refused_connections_total), the last from "
                    "%s%s", message or _SAID[reason], reason, peer,
                    f"; {quiet} more since the last such line" if quiet else "")

    # --- naming -----------------------------------------------------------------------

    def relay_name(self, sock: socket.socket) -> str:
        """The abstract name a relay to gRPC is bound to: unique, and ending in the
        client's gRPC peer string."""
        try:
            host, port = sock.getpeername()[:2]
        except OSError:
            host, port = "?", 0
        peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        return f"\0{_RELAY_NAME}{os.getpid()}-{next(self._names)}/{peer}"


class _Pending:
    """What the door thread keeps of a connection before its hand-off."""

    __slots__ = ("sock", "handshake")

    def __init__(self, sock: socket.socket, handshake: door_frames.Handshake):
        self.sock = sock
        self.handshake = handshake


class _Relay:
    """One handed-off connection: the client's socket and the connection to gRPC, a
    thread for each direction; the last to end closes both and leaves the door."""

    def __init__(self, door_server: GrpcDoor, door: Door, client: socket.socket, first: bytes):
        self.server = door_server
        self.door = door
        self.client = client
        self.upstream: socket.socket | None = None
        self.first = first
        self.watch = None if door_server.tls else door_frames.CallWatch()
        self._lock = threading.Lock()
        self._running = 1
        self._broken = False

    def inward(self) -> None:
        """Connect to gRPC, pass on the handshake, then the client's bytes."""
        try:
            self.client.setblocking(True)
            _send_timeout(self.client, self.server.send_timeout_s)
            if self.client.family != socket.AF_UNIX:
                self.client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with self._lock:
                self.upstream = upstream
                broken = self._broken
            if broken:
                return
            upstream.bind(self.server.relay_name(self.client))
            upstream.connect(self.server.upstream)
            _send_timeout(upstream, self.server.send_timeout_s)
            with self._lock:
                self._running += 1
            threading.Thread(target=self.outward, daemon=True, name="dlfs-grpc-relay").start()
            upstream.sendall(self.first)
            if self.watch is not None:
                self._follow(self.first[len(door_frames.PREFACE):])
            self._pump(self.client, upstream, self.watch)
        except (OSError, RuntimeError):
            pass  # either side went away, or no thread for the other direction
        finally:
            self._end()

    def outward(self) -> None:
        """gRPC's bytes to the client."""
        assert self.upstream is not None  # started by `inward` once connected
        try:
            self._pump(self.upstream, self.client, None)
        except OSError:
            pass
        finally:
            self._end()

    def _pump(self, source: socket.socket, sink: socket.socket, watch) -> None:
        buffer = bytearray(limits.grpc_relay_buffer_bytes)
        view = memoryview(buffer)
        while True:
            got = source.recv_into(buffer)
            if not got:
                return
            if watch is not None and not watch.called:
                self._follow(view[:got])
            sink.sendall(view[:got])

    def _follow(self, chunk) -> None:
        assert self.watch is not None
        if self.watch.feed(chunk):
            self.server.admission.called(self.door)

    def break_off(self) -> None:
        """End both directions now (an eviction, a stop): the threads see it and end."""
        with self._lock:
            self._broken = True
            socks = [self.client, self.upstream]
        for sock in socks:
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _end(self) -> None:
        self.break_off()
        with self._lock:
            self._running -= 1
            last = self._running == 0
        if last:
            self.server.admission.leave(self.door)
            self.close()

    def close(self) -> None:
        self.client.close()
        if self.upstream is not None:
            self.upstream.close()


def _break(held) -> None:
    if isinstance(held, _Relay):
        held.break_off()
    elif isinstance(held, _Pending):
        _close(held)


def _close(held) -> None:
    if isinstance(held, _Pending):
        held.sock.close()
    elif isinstance(held, _Relay):
        held.close()


def _send_timeout(sock: socket.socket, seconds: float) -> None:
    """A blocking send waits at most `seconds` for room (then fails: EAGAIN)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                    struct.pack("ll", int(seconds), int(seconds % 1 * 1e6)))


def _host_of(sock: socket.socket) -> str:
    """The client host a connection counts against ("?" when the kernel cannot tell)."""
    try:
        host = sock.getpeername()[0]
    except OSError:
        return "?"
    return host.removeprefix("::ffff:") if host.startswith("::ffff:") and "." in host \
        else host
