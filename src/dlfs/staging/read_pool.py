"""A pool of source readers that hands their bytes out in order, in bounded memory.

An ingest stream must carry its files one after the other, but a source on
a parallel file system answers each open after a millisecond or so: read
one file at a time and the open latency, not the bandwidth, sets the pace.
`ReadPool` runs the units of a source (a file of a tree, a whole archive,
see `dlfs.staging.source_set`) on `threads` threads, many opens in flight, and
yields their chunks in unit order.

Memory is bounded by bytes, not by files: a unit reserves the bytes of a
chunk before it reads it, and units ahead of the one being consumed (the
head) may hold at most `budget_bytes` between them.  The head itself may
always hold `head_bytes` more (so it never waits behind units after it,
which would deadlock), and at most `window_units` units are taken ahead of
it (so a tree of empty files cannot queue without bound).  A unit's error
is raised when the consumer reaches that unit, so what was read before it
still goes out in order.
"""

from __future__ import annotations

import collections
import heapq
import threading
from typing import Iterable, Iterator

from dlfs.staging.source_files import ReadContext, SourceFile

READERS_DEFAULT = 16
BUDGET_BYTES_DEFAULT = 64 * 1024 * 1024
HEAD_BYTES_DEFAULT = 16 * 1024 * 1024
WINDOW_UNITS_DEFAULT = 4096

# One chunk: (file on its first chunk else None, data, last chunk of its file,
# source bytes it advanced).  A record with no file, no data and not last only
# carries progress (the end of an archive).
Record = tuple


class _Stopped(Exception):
    """Raised in a reader thread when the pool was closed."""


class _Slot:
    __slots__ = ("records", "done", "error", "held")

    def __init__(self):
        self.records: collections.deque = collections.deque()
        self.done = False
        self.error: BaseException | None = None
        self.held = 0  # bytes reserved or queued by this unit


class _Context(ReadContext):
    """A reader thread's view of the pool while it reads unit `index`."""

    __slots__ = ("_pool", "index", "slot", "reserved", "chunk_bytes", "_wake")

    def __init__(self, pool: "ReadPool", index: int, slot: _Slot, wake: threading.Condition):
        self._pool = pool
        self.index = index
        self.slot = slot
        self.reserved = 0
        self.chunk_bytes = pool.chunk_bytes
        self._wake = wake

    def reserve(self, n: int) -> None:
        pool = self._pool
        with pool._lock:
            while not pool._may_hold(self.index, self.slot, n):
                if pool._stopped:
                    raise _Stopped()
                heapq.heappush(pool._waiters, (self.index, n, id(self._wake), self._wake))
                self._wake.wait()
            if pool._stopped:
                raise _Stopped()
            pool._held += n
            self.slot.held += n
            self.reserved += n
            pool._wake_next()  # room may be left for the next reader in line

    def push(self, file: SourceFile | None, data: bytes, last: bool, source_bytes: int,
             reserved: int) -> None:
        pool, slot = self._pool, self.slot
        with pool._lock:
            if pool._stopped:
                raise _Stopped()
            unused = reserved - len(data)
            pool._held -= unused
            slot.held -= unused
            self.reserved -= reserved
            slot.records.append((file, data, last, source_bytes))
            if self.index == pool._head and pool._consumer_waiting:
                pool._ready.notify()


class ReadPool:
    """Read `units` on `threads` threads; iterate to get their records in unit order.

    Use as a context manager (closing stops the threads).  Iterating raises
    the first error of a unit when its turn comes.  Threads waiting for
    memory are woken one at a time, the one nearest the head first, and
    only when it may go on (many readers on few cores would otherwise spend
    their CPU waking up for nothing).
    """

    def __init__(self, units: Iterable, *, threads: int = READERS_DEFAULT,
                 budget_bytes: int = BUDGET_BYTES_DEFAULT, head_bytes: int = HEAD_BYTES_DEFAULT,
                 chunk_bytes: int = 1024 * 1024, window_units: int = WINDOW_UNITS_DEFAULT):
        assert threads >= 1 and chunk_bytes >= 1
        self.threads = threads
        self.budget_bytes = max(budget_bytes, chunk_bytes)
        self.head_bytes = max(head_bytes, chunk_bytes)
        self.chunk_bytes = chunk_bytes
        self.window_units = max(1, window_units)
        self._units = iter(units)
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)  # the consumer waits here
        self._window = threading.Condition(self._lock)  # readers waiting for a unit
        self._waiters: list = []  # heap of (unit index, bytes, id, condition): readers waiting
        self._consumer_waiting = False
        self._slots: dict[int, _Slot] = {}
        self._next = 0  # index of the next unit to hand to a reader
        self._head = 0  # index of the unit being consumed
        self._held = 0  # bytes reserved or queued by every unit
        self._stopped = False
        self._exhausted = False
        self.peak_bytes = 0
        self._threads = [threading.Thread(target=self._work, name=f"dlfs-read-{i}", daemon=True)
                         for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def __enter__(self) -> "ReadPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the readers (a unit being read stops at its next chunk) and wait for them."""
        with self._lock:
            self._stopped = True
            for *_, wake in self._waiters:
                wake.notify()
            self._waiters.clear()
            self._window.notify_all()
            self._ready.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()

    # --- under self._lock ---------------------------------------------------------------

    def _may_hold(self, index: int, slot: _Slot, n: int) -> bool:
        if self._stopped:
            return True  # let it reach the check that stops it
        if index == self._head:
            return slot.held == 0 or slot.held + n <= self.head_bytes
        return self._held == 0 or self._held + n <= self.budget_bytes

    def _wake_next(self) -> None:
        """Wake the waiting reader nearest the head if it may go on now."""
        if not self._waiters:
            return
        index, n, _, wake = self._waiters[0]
        slot = self._slots.get(index)
        if slot is None or self._may_hold(index, slot, n):
            heapq.heappop(self._waiters)
            wake.notify()

    # -------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Record]:
        while True:
            with self._lock:
                while True:
                    slot = self._slots.get(self._head)
                    if slot is not None:
                        if slot.records:
                            record = slot.records.popleft()
                            n = len(record[1])
                            if self._held > self.peak_bytes:
                                self.peak_bytes = self._held
                            slot.held -= n
                            self._held -= n
                            self._wake_next()
                            break
                        if slot.done:
                            if slot.error is not None:
                                raise slot.error
                            del self._slots[self._head]
                            self._head += 1
                            self._window.notify()
                            self._wake_next()
                            continue
                    elif self._exhausted and self._head >= self._next:
                        return
                    if self._stopped:
                        raise _Stopped("the read pool was closed")
                    self._consumer_waiting = True
                    self._ready.wait()
                    self._consumer_waiting = False
            yield record

    def _take(self):
        """(index, unit, slot) of the next unit to read, or None when there is none."""
        with self._lock:
            while (not self._stopped and not self._exhausted
                   and self._next >= self._head + self.window_units):
                self._window.wait()
            if self._stopped or self._exhausted:
                return None
            index = self._next
            slot = _Slot()
            try:
                unit = next(self._units)
            except StopIteration:
                self._exhausted = True
                self._window.notify_all()
                self._ready.notify_all()
                return None
            except BaseException as exc:  # noqa: BLE001 - raised to the consumer in order
                slot.error, slot.done = exc, True
                self._slots[index] = slot
                self._next += 1
                self._exhausted = True
                self._window.notify_all()
                self._ready.notify_all()
                return None
            self._slots[index] = slot
            self._next += 1
            return index, unit, slot

    def _work(self) -> None:
        wake = threading.Condition(self._lock)
        while True:
            taken = self._take()
            if taken is None:
                return
            index, unit, slot = taken
            context = _Context(self, index, slot, wake)
            error = None
            try:
                unit(context)
            except _Stopped:
                pass
            except BaseException as exc:  # noqa: BLE001 - raised to the consumer in order
                error = exc
            with self._lock:
                self._held -= context.reserved
                slot.held -= context.reserved
                slot.error = error
                slot.done = True
                if index == self._head and self._consumer_waiting:
                    self._ready.notify()
                if context.reserved:
                    self._wake_next()
