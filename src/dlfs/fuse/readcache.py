"""Sample bytes on their way from the daemon to the kernel's page cache.

The kernel reads a file in pieces (128 KiB to 1 MiB, several at once).  One
RPC per piece would make a 110 KB image cost a round trip per piece and a
100 MB file hundreds.  Instead:

- a file of at most `whole_sample_bytes_max` is fetched whole on its first
  read: one round trip, CRC32C verified by the daemon;
- a larger file is cut into *units* of `read_unit_bytes`.  A random read
  fetches just the units it touches (h5py chunks, mmap page faults); once a
  reader moves sequentially, each RPC streams a *run* of up to
  `read_run_bytes_max`, and runs are kept in flight up to `read_ahead_bytes`
  ahead of it.  Units become readable as their pieces arrive: over gRPC a
  run streams in pieces; over the data path a run is one reply, handed
  over once all of it arrived and was verified, so a READ waits for its
  run (handing a reply over frame by frame did not measurably speed up a
  sequential reader: docs/DESIGN.md).

Fetched bytes are shared by every reader of the file (concurrent first reads
wait for one fetch).  Bytes of a fetch that no read is waiting for (the rest
of a whole sample after its first piece, read-ahead) are pushed into the
kernel's page cache as they arrive (FUSE notify_store), so the kernel never
has to ask for them: one write per received piece instead of one request per
128 KiB (not for a checkpoint space's file, whose inode this mount may move
to another version meanwhile: those wait for the kernel's READs).  Units
are keyed by the node's identity (inode and version), so bytes of one
version never answer a read of another.  A unit is dropped once the kernel has been handed all of its bytes
in replies; from then on the page cache serves them (files are opened with
keep_cache).  Pushed units are kept for kernel reads that raced with the
push, the most recent `pushed_keep_bytes` of them, and are the first to go
when room is needed; beyond `read_cache_bytes_max` the rest are evicted
least recently used.  So this is a staging area, not a second page cache: a
read after the page cache was dropped reaches the daemon again.  Dropping
units promptly matters for speed as much as for memory: a run's reply
buffer goes back to the client's pool once no unit of it is held, and a
recycled buffer costs nothing where a fresh one is faulted in page by page
(a fifth of the mount's CPU time in a long sequential read).

Runs on the trio loop; fetches run as tasks of the given nursery and do
their blocking work in threads.
"""

from __future__ import annotations

import collections
import logging
from typing import Awaitable, Callable

import trio

from dlfs import errors
from dlfs import limits as fuse_limits
from dlfs.fuse.errno_map import Stale
from dlfs.fuse.inodes import Node

log = logging.getLogger(__name__)

# fetch_whole(node) -> all bytes of node's sample, CRC32C verified.
FetchWhole = Callable[[Node], Awaitable[memoryview]]
# fetch_range(node, offset, length, deliver) streams bytes of node's sample,
# calling deliver(position from offset, piece) on the trio loop per piece, in
# order; returns how many bytes came.
Deliver = Callable[[int, memoryview], None]
FetchRange = Callable[[Node, int, int, Deliver], Awaitable[int]]
# store(node, offset, data): put bytes into the kernel's page cache for node.
Store = Callable[[Node, int, memoryview], Awaitable[None]]

_PAGE_BYTES = 4096


class _Run:
    """One fetch: consecutive units of one file, filled as bytes arrive."""

    __slots__ = ("start", "length", "demand_end", "units", "received", "next_unit")

    def __init__(self, start: int, demand_end: int):
        self.start = start
        self.length = 0
        self.demand_end = demand_end  # the read that started it needs bytes up to here
        self.units: list[_Unit] = []
        self.received = 0  # bytes delivered so far, from start
        self.next_unit = 0  # first unit not yet complete


class _Unit:
    __slots__ = ("key", "start", "length", "data", "partial", "ready", "error", "served",
                 "pushed")

    def __init__(self, key: tuple[int, int], start: int, length: int):
        self.key = key
        self.start = start
        self.length = length
        self.data: memoryview | None = None  # set once complete
        self.partial: bytearray | None = None  # while it straddles received pieces
        self.ready = trio.Event()
        self.error: errors.DlfsError | None = None
        self.served = 0  # bytes handed to the kernel in replies
        self.pushed = False  # bytes of it go to the page cache by notify_store


class ReadCache:
    """Units of files being read, keyed by (node identity, unit index).

    `read` costs one fetch per run of units it touches that nobody fetched
    yet, and O(units touched) otherwise.  Bytes held (fetched or in flight)
    stay below `bytes_max`, except that demand fetches are never refused:
    with everything in flight the overshoot is bounded by those fetches.
    """

    def __init__(self, fetch_whole: FetchWhole, fetch_range: FetchRange,
                 nursery: trio.Nursery, store: Store | None = None, *,
                 bytes_max: int = fuse_limits.mount_read_cache_bytes_max,
                 unit_bytes: int = fuse_limits.mount_read_unit_bytes,
                 run_bytes_max: int = fuse_limits.mount_read_run_bytes_max,
                 ahead_bytes: int = fuse_limits.mount_read_ahead_bytes,
                 whole_bytes_max: int = fuse_limits.mount_whole_sample_bytes_max,
                 sequential_slack_bytes: int = fuse_limits.mount_sequential_slack_bytes,
                 streams_max: int = fuse_limits.mount_read_streams_max,
                 pushed_keep_bytes: int = fuse_limits.mount_pushed_keep_bytes):
        assert 0 < unit_bytes <= run_bytes_max <= bytes_max and run_bytes_max % unit_bytes == 0
        self._fetch_whole = fetch_whole
        self._fetch_range = fetch_range
        self._store = store
        self._nursery = nursery
        self.bytes_max = bytes_max
        self.unit_bytes = unit_bytes
        self.run_units = run_bytes_max // unit_bytes
        self.ahead_units = ahead_bytes // unit_bytes
        self.whole_bytes_max = whole_bytes_max
        self.sequential_slack_bytes = sequential_slack_bytes
        self.streams_max = streams_max
        self.pushed_keep_bytes = pushed_keep_bytes
        self._units: collections.OrderedDict[tuple[int, int], _Unit] = \
            collections.OrderedDict()  # least recently used first
        self.bytes_held = 0
        self.pushed_bytes_held = 0  # of bytes_held, in units marked pushed
        # identity -> (where its last read ended, reads in a row that continued
        # the previous one); large files only, LRU-bounded.
        self._stream_end: collections.OrderedDict[tuple[int, int], tuple[int, int]] = \
            collections.OrderedDict()
        self.fetches = 0  # RPCs issued, for tests and benchmarks
        self.stored_bytes = 0  # bytes pushed into the page cache

    def __len__(self) -> int:
        return len(self._units)

    async def read(self, node: Node, offset: int, size: int) -> memoryview | bytes:
        """Up to `size` bytes of `node` at `offset` (fewer at the end of the file).

        Raises the fetch's DlfsError, or Stale if the daemon returned a
        different length than expected (the dataset was replaced).
        """
        end = min(offset + size, node.size)
        if offset >= end:
            return b""
        whole = node.size <= self.whole_bytes_max
        step = node.size if whole else self.unit_bytes
        first, last = offset // step, (end - 1) // step
        sequential = not whole and self._sequential(node.identity, offset, end)
        units = []
        for index in range(first, last + 1):
            unit = self._units.get((node.identity, index))
            if unit is None:
                count = self.run_units if sequential else last - index + 1
                unit = self._start_run(node, index, count, step, whole, demand_end=end).units[0]
            else:
                self._units.move_to_end(unit.key)
            units.append(unit)
        if sequential:
            self._read_ahead(node, last + 1)
        parts = []
        for unit in units:
            await unit.ready.wait()
            if unit.error is not None:
                raise unit.error
            lo = max(offset, unit.start) - unit.start
            hi = min(end, unit.start + unit.length) - unit.start
            parts.append(unit.data[lo:hi])
            unit.served += hi - lo
            if unit.served >= unit.length:
                self._discard(unit)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    # --- runs ------------------------------------------------------------------------

    def _start_run(self, node: Node, index: int, count: int, step: int, whole: bool, *,
                   demand_end: int, evict: bool = True) -> _Run | None:
        """Register up to `count` missing units from `index` on as one fetch and
        start it.  Stops at the end of the file, at the first unit already
        held and where room runs out; a demand run (`evict`) gets at least one
        unit.  The starting read needs bytes up to `demand_end` (0: none, a
        read-ahead, which may evict only pushed units).  Returns the run, or
        None if nothing fit."""
        run = _Run(index * step, demand_end)
        last_index = (node.size - 1) // step
        for i in range(index, min(index + count - 1, last_index) + 1):
            if (node.identity, i) in self._units:
                break
            length = min(step, node.size - i * step)
            if not self._make_room(length, pushed_only=not evict) and (run.units or not evict):
                break
            unit = _Unit((node.identity, i), i * step, length)
            self._units[unit.key] = unit
            self.bytes_held += length
            run.units.append(unit)
            run.length += length
        if not run.units:
            return None
        self.fetches += 1
        self._nursery.start_soon(self._fill, node, run, whole)
        return run

    async def _fill(self, node: Node, run: _Run, whole: bool) -> None:
        def deliver(position: int, piece: memoryview) -> None:
            self._deliver(node, run, position, piece)

        try:
            if whole:
                deliver(0, await self._fetch_whole(node))
            else:
                await self._fetch_range(node, run.start, run.length, deliver)
            if run.received != run.length:
                raise Stale(
                    f"{node.dataset}/{node.path}: the daemon returned {run.received} bytes at "
                    f"offset {run.start} where this mount expected {run.length}; the dataset "
                    "was replaced after it was mounted (reopen it after the cache timeout)")
            node.fetched_bytes += run.length
        except errors.DlfsError as exc:
            self._fail(run, exc)
        except BaseException as exc:  # cancelled at shutdown: waiters must not hang
            self._fail(run, errors.Cancelled(
                f"read of {node.dataset}/{node.path} was interrupted ({type(exc).__name__})"))
            raise

    def _deliver(self, node: Node, run: _Run, position: int, piece: memoryview) -> None:
        """Take the next piece of a run: complete units, push what nobody waits for."""
        if position != run.received or run.received + len(piece) > run.length:
            raise Stale(f"{node.dataset}/{node.path}: the daemon sent bytes "
                        f"{position}..{position + len(piece)} of a {run.length}-byte read at "
                        f"offset {run.start}; the dataset was replaced after it was mounted")
        piece_start = run.start + position
        piece_end = piece_start + len(piece)
        while run.next_unit < len(run.units):
            unit = run.units[run.next_unit]
            if unit.start >= piece_end:
                break
            unit_end = unit.start + unit.length
            if unit.partial is None and unit.start >= piece_start and unit_end <= piece_end:
                unit.data = piece[unit.start - piece_start:unit_end - piece_start]
            else:  # the unit straddles pieces: gather it (only if pieces and units misalign)
                if unit.partial is None:
                    unit.partial = bytearray(unit.length)
                lo = max(unit.start, piece_start)
                hi = min(unit_end, piece_end)
                unit.partial[lo - unit.start:hi - unit.start] = piece[lo - piece_start:
                                                                      hi - piece_start]
                if hi < unit_end:
                    break
                unit.data = memoryview(unit.partial).toreadonly()
                unit.partial = None
            unit.ready.set()
            run.next_unit += 1
        run.received += len(piece)
        push_from = max(piece_start, -(-run.demand_end // _PAGE_BYTES) * _PAGE_BYTES)
        # Never into a space's file: this mount may close it into another version
        # (same inode) while the push is on its way, and pages of the old one
        # would then sit in the cache new readers read.
        if self._store is not None and push_from < piece_end and not node.space:
            for unit in run.units:
                if unit.start < piece_end and unit.start + unit.length > push_from and \
                        not unit.pushed and self._units.get(unit.key) is unit:
                    unit.pushed = True
                    self.pushed_bytes_held += unit.length
            self._nursery.start_soon(self._push, node, push_from,
                                     piece[push_from - piece_start:])

    async def _push(self, node: Node, offset: int, data: memoryview) -> None:
        try:
            await self._store(node, offset, data)
            self.stored_bytes += len(data)
            self._drop_pushed_beyond(self.pushed_keep_bytes)
        except OSError as exc:  # the kernel will ask for the bytes: fetched again then
            log.debug("could not push %s/%s bytes %d..%d into the page cache: %s",
                      node.dataset, node.path, offset, offset + len(data), exc)

    def _fail(self, run: _Run, exc: errors.DlfsError) -> None:
        # Waiters of units not complete raise it; those are dropped, so the
        # next read fetches again.  Complete units stay valid.
        for unit in run.units[run.next_unit:]:
            unit.error = exc
            unit.partial = None
            self._discard(unit)
            unit.ready.set()
        run.next_unit = len(run.units)

    def _discard(self, unit: _Unit) -> None:
        if self._units.get(unit.key) is unit:
            del self._units[unit.key]
            self.bytes_held -= unit.length
            if unit.pushed:
                self.pushed_bytes_held -= unit.length

    def _drop_pushed_beyond(self, keep_bytes: int) -> None:
        """Drop complete pushed units, least recently used first, until at most
        `keep_bytes` of them are held.  O(units looked at)."""
        self._evict(self.pushed_bytes_held - keep_bytes, pushed_only=True)

    def _make_room(self, length: int, *, pushed_only: bool = False) -> bool:
        """Evict complete units until `length` fits: pushed ones first, then
        (unless `pushed_only`) the others, least recently used first.  True if
        it fits.  O(units looked at), usually a few: the oldest go first."""
        for evict_pushed_only in ((True,) if pushed_only else (True, False)):
            self._evict(self.bytes_held + length - self.bytes_max, pushed_only=evict_pushed_only)
        return self.bytes_held + length <= self.bytes_max

    def _evict(self, excess: int, *, pushed_only: bool) -> None:
        """Discard complete units (only pushed ones if `pushed_only`), least
        recently used first, until `excess` bytes went (or none is left)."""
        if excess <= 0:
            return
        victims = []
        for unit in self._units.values():  # oldest first; no changes while iterating
            if unit.data is not None and (unit.pushed or not pushed_only):
                victims.append(unit)
                excess -= unit.length
                if excess <= 0:
                    break
        for unit in victims:
            self._discard(unit)

    # --- sequential readers ----------------------------------------------------------------

    def _sequential(self, identity: tuple[int, int], offset: int, end: int) -> bool:
        """Record this read; True once `sequential_reads_min` reads in a row
        each started near where the previous one ended."""
        previous_end, streak = self._stream_end.pop(identity, (None, 0))
        near = previous_end is not None and \
            abs(offset - previous_end) <= self.sequential_slack_bytes
        streak = streak + 1 if near else 0
        self._stream_end[identity] = (end, streak)
        if len(self._stream_end) > self.streams_max:
            self._stream_end.popitem(last=False)
        return streak >= fuse_limits.mount_sequential_reads_min

    def _read_ahead(self, node: Node, index: int) -> None:
        """Start fetches for the missing units in the `ahead_units` from `index`
        on, in full runs (a shorter one only at the end of the file), evicting
        only pushed units."""
        units = (node.size - 1) // self.unit_bytes + 1
        stop = min(index + self.ahead_units, units)
        while index < stop:
            if (node.identity, index) in self._units:
                index += 1
                continue
            count = min(self.run_units, stop - index)
            if count < self.run_units and stop < units:
                return  # wait until a whole run fits in the window: few, large RPCs
            run = self._start_run(node, index, count, self.unit_bytes, False,
                                  demand_end=0, evict=False)
            if run is None:
                return  # no room: read-ahead waits for the kernel to take bytes
            index += len(run.units)

    def check_invariants(self) -> None:
        """Assert the bookkeeping is consistent.  O(units); for tests."""
        assert self.bytes_held == sum(u.length for u in self._units.values())
        assert self.bytes_held >= 0
        assert self.pushed_bytes_held == sum(u.length for u in self._units.values() if u.pushed)
        for key, unit in self._units.items():
            assert unit.key == key and 0 <= unit.served < unit.length
            assert unit.error is None
            assert (unit.data is not None) == unit.ready.is_set()
            assert unit.data is None or len(unit.data) == unit.length
