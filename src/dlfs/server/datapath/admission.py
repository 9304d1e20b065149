"""Who may hold what on the data path: the handshake budget and each peer's share.

A connection is *pending* from its accept until its HELLO was checked, then
*served* until it closes.  The two are counted apart:

- pending connections (unauthenticated, whatever they claim) have a budget
  of their own: at most `handshakes_max` at once and `handshakes_per_peer_max`
  from one peer, each with a deadline for the whole handshake
  (`hello_timeout_s` after the accept, however its bytes trickle in).  A new
  connection over either bound evicts the oldest pending one (of its peer,
  else of all), whose thread answers it with an ERROR and closes: a flood of
  unauthenticated connections costs each other their time, and never takes
  a slot or a buffer an authenticated client needs;
- served connections count against `connections_max` and, per peer, against
  `per_peer_max`: a HELLO over either is refused with Overloaded naming the
  limit, so a few stalled or greedy peers leave the rest to everyone else.

A peer is a client host over TCP, a client process on the Unix socket
(SO_PEERCRED's pid: one user's processes on the daemon's host are told
apart, as DataLoader workers are).  Thread-safe; each call is O(1) but an
eviction, O(pending connections of a peer or in all).
"""

from __future__ import annotations

import collections
import contextlib
import socket
import struct
import threading
import time
from typing import Callable

from dlfs.errors import Overloaded


class AcceptedConnection:
    """One accepted connection: its socket, its peer, when it was accepted, and what
    became of it (`served`; `evicted` while pending)."""

    __slots__ = ("sock", "peer", "accepted", "deadline", "served", "evicted", "gone")

    def __init__(self, sock: socket.socket, peer: str, accepted: float, deadline: float):
        self.sock = sock
        self.peer = peer
        self.accepted = accepted
        self.deadline = deadline  # of the handshake (time.monotonic())
        self.served = False
        self.evicted = False
        self.gone = False


class Admission:
    """The data path's budgets.  `arrive` at accept, `admit` after a good HELLO,
    `leave` when the connection ends (each entry exactly once)."""

    def __init__(self, *, connections_max: int, per_peer_max: int, handshakes_max: int,
                 handshakes_per_peer_max: int, hello_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic, processes: int = 1,
                 daemon_connections_max: int = 0, daemon_per_peer_max: int = 0):
        assert 1 <= per_peer_max <= connections_max
        assert 1 <= handshakes_per_peer_max <= handshakes_max
        self.connections_max = connections_max
        self.per_peer_max = per_peer_max
        # This budget is one of `processes` data path workers' shares of the daemon's
        # (datapath/workers.py): refusals name the daemon's figures, which the options set.
        self.processes = processes
        self.daemon_connections_max = daemon_connections_max or connections_max
        self.daemon_per_peer_max = daemon_per_peer_max or per_peer_max
        self.handshakes_max = handshakes_max
        self.handshakes_per_peer_max = handshakes_per_peer_max
        self.hello_timeout_s = hello_timeout_s
        self.clock = clock
        self._lock = threading.Lock()
        # Pending entries, oldest first (dicts keep insertion order), in all and by peer.
        self._pending: dict[AcceptedConnection, None] = {}
        self._pending_by_peer: dict[str, dict[AcceptedConnection, None]] = collections.defaultdict(dict)
        self._served: set[AcceptedConnection] = set()
        self._served_by_peer: collections.Counter = collections.Counter()

    # --- counts ----------------------------------------------------------------------

    @property
    def served(self) -> int:
        with self._lock:
            return len(self._served)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def sockets(self) -> list[socket.socket]:
        """Every connection's socket, pending or served (to break them at a stop)."""
        with self._lock:
            return [e.sock for e in (*self._pending, *self._served)]

    # --- transitions -------------------------------------------------------------------

    def arrive(self, sock: socket.socket) -> AcceptedConnection:
        """Register a just-accepted connection as pending; returns its entry.  One it
        evicts to make room is shut for reading: its thread wakes, sees `evicted`
        and answers it."""
        now = self.clock()
        entry = AcceptedConnection(sock, peer_of(sock), now, now + self.hello_timeout_s)
        with self._lock:
            victim = None
            mine = self._pending_by_peer.get(entry.peer)
            if mine and len(mine) >= self.handshakes_per_peer_max:
                victim = next(iter(mine))
            elif len(self._pending) >= self.handshakes_max:
                victim = next(iter(self._pending))
            if victim is not None:
                victim.evicted = True
                self._forget_pending(victim)
            self._pending[entry] = None
            self._pending_by_peer[entry.peer][entry] = None
        if victim is not None:
            with contextlib.suppress(OSError):
                victim.sock.shutdown(socket.SHUT_RD)  # wakes its thread's recv
        return entry

    def admit(self, entry: AcceptedConnection) -> None:
        """The HELLO of `entry` was good: serve it.  Raises Overloaded (it stays
        pending; `leave` it) when it was evicted meanwhile, when the daemon serves
        its limit, or when its peer holds its share; the error's `refusal` says
        which (handshake_evicted, connections, peer_share)."""
        with self._lock:
            if entry.evicted:
                raise self.eviction_error()
            if len(self._served) >= self.connections_max:
                raise self._connections_refusal()
            if self._served_by_peer[entry.peer] >= self.per_peer_max:
                raise self._peer_share_refusal(entry.peer)
            self._forget_pending(entry)
            entry.served = True
            self._served.add(entry)
            self._served_by_peer[entry.peer] += 1

    def leave(self, entry: AcceptedConnection) -> None:
        """The connection of `entry` ended (its socket is being closed)."""
        with self._lock:
            if entry.gone:
                return
            entry.gone = True
            if entry.served:
                self._served.discard(entry)
                self._served_by_peer[entry.peer] -= 1
                if not self._served_by_peer[entry.peer]:
                    del self._served_by_peer[entry.peer]
            elif not entry.evicted:
                self._forget_pending(entry)

    def _connections_refusal(self) -> Overloaded:
        if self.processes == 1:
            message = (f"the daemon serves its limit of {self.daemon_connections_max} data "
                       "connections (--datapath-connections-max); read through gRPC, or retry "
                       "later")
        else:
            message = (f"this serving process serves its share ({self.connections_max}) of "
                       f"the daemon's {self.daemon_connections_max} data connections "
                       f"(--datapath-connections-max, split among {self.processes} serving "
                       f"processes{_TRIED}); read through gRPC, or retry later")
        return _refusal("connections", Overloaded(message), self.processes)

    def _peer_share_refusal(self, peer: str) -> Overloaded:
        if self.processes == 1:
            message = (f"{peer} already holds {self.daemon_per_peer_max} of the daemon's data "
                       "connections, its share (--datapath-connections-per-peer-max); close "
                       "idle clients, or retry later")
        else:
            message = (f"{peer} holds this serving process's share ({self.per_peer_max}) of "
                       f"the {self.daemon_per_peer_max} data connections it may hold "
                       f"(--datapath-connections-per-peer-max, split among {self.processes} "
                       f"serving processes{_TRIED}); close idle clients, or retry later")
        return _refusal("peer_share", Overloaded(message), self.processes)

    def eviction_error(self) -> Overloaded:
        return _refusal("handshake_evicted", Overloaded(
            f"this connection had not finished its HELLO when the daemon's "
            f"{self.handshakes_max} connections waiting for one (or the "
            f"{self.handshakes_per_peer_max} of one client) were all taken, and it had "
            "waited longest; connect again and send HELLO at once"), self.processes)

    def _forget_pending(self, entry: AcceptedConnection) -> None:
        self._pending.pop(entry, None)
        mine = self._pending_by_peer.get(entry.peer)
        if mine is not None:
            mine.pop(entry, None)
            if not mine:
                del self._pending_by_peer[entry.peer]


# How a refusal of a split limit ends its account of the limit: the client's side of it.
_TRIED = ", which a DLFS client tries in turn before it gives up"


def _refusal(reason: str, error: Overloaded, split: int = 0) -> Overloaded:
    """`error`, labelled with why (the dlfs_data_refused_connections reason) and, for a
    limit split among several serving processes, how many (`Overloaded.split`: the
    client then tries the daemon's other processes before it gives up)."""
    error.refusal = reason
    if split > 1:
        error.split = split
    return error


def peer_of(sock: socket.socket) -> str:
    """The peer a connection counts against: "HOST" over TCP, "pid PID" (of the client
    process, SO_PEERCRED) on a Unix socket; "?" when the kernel cannot tell."""
    try:
        if sock.family == socket.AF_UNIX:
            pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            return f"pid {pid}"
        return sock.getpeername()[0]
    except OSError:
        return "?"
