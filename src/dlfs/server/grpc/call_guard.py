"""Admission and liveness of the gRPC calls that hold a server thread for long.

Streamed reads (GetBatch, ReadRange, GetIndex, Scrub), small batches and
ingests run on the daemon's RPC threads for as long as their client reads
or writes.  Unbounded, a few stalled clients take every thread and then
health checks, Status and metadata calls wait behind them.  So:

- such calls take one of `slots` tickets (fewer than the RPC threads: the
  rest stay free for everything else); none left: RESOURCE_EXHAUSTED at
  once, naming the limit;
- one client (peer host) holds at most `per_client` of them;
- a ticketed call that makes no progress (no message sent or received) for
  `stall_timeout_s` is cancelled by a watchdog thread: its thread and its
  read buffers come back.  An ingest that sends nothing, not even its first
  message, is such a call;
- and a read (`RATED_METHODS`) has a deadline as a whole, as a data path
  reply has: it is cancelled once it has run longer than `stall_timeout_s`
  plus the bytes it sent at `limits.stream_bytes_per_s_min`, so a client
  that reads one message a minute does not hold its ticket for ever.
  (Ingests and scrubs move at the pace of the client's source or of the
  daemon's disk, not the client's reading: they have the stall rule only.)
- a call refused for its credentials never takes a ticket (the interceptor
  admits only authorized calls): unauthenticated clients cannot use up the
  tickets authenticated ones need.

Thread-safe.  `clock` is injectable for tests.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from dlfs import limits
from dlfs.errors import Overloaded

log = logging.getLogger(__name__)

# Methods whose calls hold a thread for as long as their client takes.
LONG_METHODS = frozenset(f"/dlfs.v1.Dlfs/{name}" for name in (
    "GetBatch", "GetSmallBatch", "ReadRange", "GetIndex", "Scrub", "Ingest"))
# Of those, the reads whose pace is their client's: they must move their bytes at
# `limits.stream_bytes_per_s_min` on the whole.
RATED_METHODS = frozenset(f"/dlfs.v1.Dlfs/{name}" for name in (
    "GetBatch", "GetSmallBatch", "ReadRange", "GetIndex"))


class Ticket:
    """One admitted call: its client, its context (to cancel it), when it was admitted,
    when it last moved and the bytes it moved."""

    __slots__ = ("guard", "client", "context", "method", "admitted", "last", "moved", "rated",
                 "cancelled")

    def __init__(self, guard: "CallGuard", client: str, context, method: str, now: float):
        self.guard = guard
        self.client = client
        self.context = context
        self.method = method
        self.admitted = now
        self.last = now
        self.moved = 0
        self.rated = method in RATED_METHODS
        self.cancelled = False

    def progress(self, nbytes: int = 0) -> None:
        """A message (of `nbytes` bytes) went out or came in."""
        self.last = self.guard.clock()
        self.moved += nbytes

    def deadline(self) -> float | None:
        """When this call must be done by, as things stand (None: no deadline as a whole)."""
        if not self.rated:
            return None
        return self.admitted + self.guard.stall_timeout_s + \
            self.moved / limits.stream_bytes_per_s_min

    def release(self) -> None:
        self.guard._release(self)


class CallGuard:
    """Tickets for long calls; a watchdog cancels the ones that stopped moving."""

    def __init__(self, *, slots: int, per_client: int, stall_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic):
        assert 1 <= per_client <= slots
        self.slots = slots
        self.per_client = per_client
        self.stall_timeout_s = stall_timeout_s
        self.clock = clock
        self._lock = threading.Lock()
        self._active: set[Ticket] = set()
        self._by_client: dict[str, int] = {}
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="dlfs-call-watchdog",
                                          daemon=True)
        self._watchdog.start()

    def close(self) -> None:
        self._stop.set()

    def admit(self, method: str, peer: str, context) -> Ticket:
        """A ticket for a long call from `peer` (gRPC's peer string).  Raises Overloaded."""
        client = client_of(peer)
        with self._lock:
            if len(self._active) >= self.slots:
                raise Overloaded(
                    f"the daemon serves its limit of {self.slots} streamed reads and ingests at "
                    "once (--rpc-threads minus the threads kept for other calls); retry later")
            if self._by_client.get(client, 0) >= self.per_client:
                raise Overloaded(
                    f"client {client} already has {self.per_client} streamed reads or ingests "
                    "running (--streams-per-client-max); finish some first")
            ticket = Ticket(self, client, context, method, self.clock())
            self._active.add(ticket)
            self._by_client[client] = self._by_client.get(client, 0) + 1
        return ticket

    def active(self) -> int:
        with self._lock:
            return len(self._active)

    def check_stalls(self) -> list[Ticket]:
        """Cancel every call that made no progress for `stall_timeout_s`, and every read
        past its deadline as a whole (`Ticket.deadline`); return them."""
        now = self.clock()
        with self._lock:
            stalled = [t for t in self._active if not t.cancelled and (
                now - t.last > self.stall_timeout_s
                or (t.rated and now > t.deadline()))]
            for ticket in stalled:
                ticket.cancelled = True
        for ticket in stalled:
            if now - ticket.last > self.stall_timeout_s:
                log.warning("%s from %s made no progress for %.0f s (the client stopped "
                            "reading or writing); cancelled it", ticket.method, ticket.client,
                            now - ticket.last)
            else:
                log.warning("%s from %s moved %d bytes in %.0f s, slower than %d bytes/s "
                            "after the first %.0f s (the client reads a trickle); cancelled "
                            "it", ticket.method, ticket.client, ticket.moved,
                            now - ticket.admitted, limits.stream_bytes_per_s_min,
                            self.stall_timeout_s)
            ticket.context.cancel()
        return stalled

    def _release(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket in self._active:
                self._active.discard(ticket)
                left = self._by_client[ticket.client] - 1
                if left:
                    self._by_client[ticket.client] = left
                else:
                    del self._by_client[ticket.client]

    def _watch(self) -> None:
        while not self._stop.wait(limits.call_watchdog_interval_s):
            try:
                self.check_stalls()
            except Exception:  # noqa: BLE001 - the watchdog must outlive any one call
                log.exception("call watchdog failed")


def client_of(peer: str) -> str:
    """The client host of a gRPC peer string ("ipv4:10.0.0.5:4711" -> "10.0.0.5")."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rpartition(":")[0].strip("[]") or rest
    return peer
