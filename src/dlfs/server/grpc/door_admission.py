"""Who may hold what at the gRPC door: the handshake budget, the bound, each host's share.

A connection is *pending* from its accept until its client's HTTP/2 preface
and SETTINGS arrived (over TLS: its first bytes), then *open* (relayed to
gRPC) until its first call, then *calling* until it closes.  gRPC carries a
token in each call's metadata, so a connection that made no call has shown
nothing: pending and open ones are the unauthenticated, and they give way.

- pending connections have a budget of their own: at most `handshakes_max`
  at once and `handshakes_per_peer_max` from one host; a new one over either
  evicts the oldest pending one (of its host, else of all);
- open and calling connections count against `connections_max` and, per
  host, against `per_peer_max`.  One handed over at either bound evicts the
  oldest *open* one (of its host when the host is at its share, else of all);
  when there is none (every one of them made a call) it is refused, with the
  reason (`connections`, `peer_share`).

A peer is a client host (its source address).  Thread-safe; each call is
O(1) but an eviction, O(connections of a host or in all).  Victims are
returned, never closed here: the door closes them.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

PENDING, OPEN, CALLING, GONE = "pending", "open", "calling", "gone"


class Door:
    """One connection at the door: its peer host, its state, when its handshake is
    due, and what the door keeps with it (`held`: sockets, buffers)."""

    __slots__ = ("peer", "state", "deadline", "held", "evicted")

    def __init__(self, peer: str, deadline: float, held: Any = None):
        self.peer = peer
        self.state = PENDING
        self.deadline = deadline  # of the handshake (time.monotonic())
        self.held = held
        self.evicted = False


class _Group:
    """Connections in one state, oldest first, in all and by peer."""

    def __init__(self):
        self.all: dict[Door, None] = {}
        self.by_peer: dict[str, dict[Door, None]] = collections.defaultdict(dict)

    def add(self, door: Door) -> None:
        self.all[door] = None
        self.by_peer[door.peer][door] = None

    def discard(self, door: Door) -> None:
        self.all.pop(door, None)
        mine = self.by_peer.get(door.peer)
        if mine is not None:
            mine.pop(door, None)
            if not mine:
                del self.by_peer[door.peer]

    def count(self, peer: str) -> int:
        return len(self.by_peer.get(peer, ()))

    def oldest(self, peer: str | None = None) -> Door | None:
        group = self.all if peer is None else self.by_peer.get(peer, {})
        return next(iter(group), None)


class DoorRefused(Exception):
    """A handshaken connection may not be relayed: `reason` (connections, peer_share)
    and the words its client is told."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


class DoorAdmission:
    """The door's budgets.  `arrive` at accept, `hand_off` once handshaken, `called`
    at the first call, `leave` when the connection ends (each at most once)."""

    def __init__(self, *, connections_max: int, per_peer_max: int, handshakes_max: int,
                 handshakes_per_peer_max: int):
        assert 1 <= per_peer_max <= connections_max
        assert 1 <= handshakes_per_peer_max <= handshakes_max
        self.connections_max = connections_max
        self.per_peer_max = per_peer_max
        self.handshakes_max = handshakes_max
        self.handshakes_per_peer_max = handshakes_per_peer_max
        self._lock = threading.Lock()
        self._pending = _Group()
        self._open = _Group()
        self._calling = _Group()
        self._held_by_peer: collections.Counter = collections.Counter()  # open + calling

    def counts(self) -> dict[str, int]:
        """Connections by state (pending, open, calling)."""
        with self._lock:
            return {PENDING: len(self._pending.all), OPEN: len(self._open.all),
                    CALLING: len(self._calling.all)}

    def everyone(self) -> list[Door]:
        """Every connection at the door (to close them at a stop)."""
        with self._lock:
            return [*self._pending.all, *self._open.all, *self._calling.all]

    def arrive(self, door: Door) -> Door | None:
        """Register a just-accepted connection as pending; returns the pending one it
        evicts to make room (evicted, gone from every count), if any."""
        with self._lock:
            victim = None
            if self._pending.count(door.peer) >= self.handshakes_per_peer_max:
                victim = self._pending.oldest(door.peer)
            elif len(self._pending.all) >= self.handshakes_max:
                victim = self._pending.oldest()
            if victim is not None:
                self._evict(victim, self._pending)
            self._pending.add(door)
            return victim

    def hand_off(self, door: Door, *, calling: bool = False) -> Door | None:
        """`door` finished its handshake: it is open (`calling`: counted as calling at
        once, where the door cannot see its calls, over TLS).  Returns the open one it
        evicts to make room, if any.  Raises DoorRefused (it is then gone) when no
        connection can make room."""
        with self._lock:
            assert door.state == PENDING
            self._pending.discard(door)
            victim = None
            if self._held_by_peer[door.peer] >= self.per_peer_max:
                victim = self._open.oldest(door.peer)
                if victim is None:
                    door.state = GONE
                    raise DoorRefused("peer_share", self._peer_share_message(door.peer))
            elif len(self._open.all) + len(self._calling.all) >= self.connections_max:
                victim = self._open.oldest()
                if victim is None:
                    door.state = GONE
                    raise DoorRefused("connections", self._connections_message())
            if victim is not None:
                self._evict(victim, self._open)
                self._held_by_peer[victim.peer] -= 1
            door.state = CALLING if calling else OPEN
            (self._calling if calling else self._open).add(door)
            self._held_by_peer[door.peer] += 1
            return victim

    def called(self, door: Door) -> None:
        """`door` made its first call: it no longer gives way to newcomers."""
        with self._lock:
            if door.state == OPEN:
                self._open.discard(door)
                door.state = CALLING
                self._calling.add(door)

    def leave(self, door: Door) -> None:
        """The connection of `door` ended (evicted ones left already)."""
        with self._lock:
            if door.state == PENDING:
                self._pending.discard(door)
            elif door.state in (OPEN, CALLING):
                (self._open if door.state == OPEN else self._calling).discard(door)
                self._held_by_peer[door.peer] -= 1
                if not self._held_by_peer[door.peer]:
                    del self._held_by_peer[door.peer]
            door.state = GONE

    def check_invariants(self) -> None:
        with self._lock:
            groups = ((PENDING, self._pending), (OPEN, self._open), (CALLING, self._calling))
            for state, group in groups:
                assert all(d.state == state for d in group.all), state
                assert sum(map(len, group.by_peer.values())) == len(group.all), state
            assert len(self._pending.all) <= self.handshakes_max
            assert all(len(m) <= self.handshakes_per_peer_max
                       for m in self._pending.by_peer.values())
            held = collections.Counter(d.peer for d in (*self._open.all, *self._calling.all))
            assert held == +self._held_by_peer, (held, self._held_by_peer)
            assert sum(held.values()) <= self.connections_max
            assert all(n <= self.per_peer_max for n in held.values())

    def _evict(self, victim: Door, group: _Group) -> None:
        group.discard(victim)
        victim.evicted = True
        victim.state = GONE

    def _connections_message(self) -> str:
        return (f"the daemon holds its limit of {self.connections_max} gRPC connections "
                "(--grpc-connections-max), each with calls; retry later")

    def _peer_share_message(self, peer: str) -> str:
        return (f"{peer} already holds {self.per_peer_max} of the daemon's gRPC connections, "
                "its share (--grpc-connections-per-peer-max), each with calls; close idle "
                "channels, or retry later")
