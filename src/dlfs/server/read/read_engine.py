"""Read engine: long-lived reader threads that fill window buffers from extent files.

A read is a list of pieces (extent, file offset, buffer offset, bytes),
planned by `dlfs.server.read.batch_planning`.  Each window's pieces are first read by
the calling thread with RWF_NOWAIT, which copies what the page cache holds
and refuses to wait for the device; the misses are all submitted at once
with WILLNEED advice and read by the reader threads in contiguous shares
(`os.preadv` releases the GIL, so the device sees many reads at once).
Windows of many small pieces (`limits.uring_pieces_min`) take one io_uring
submission instead of a call per piece (`uring_reads.py`): the probe, and on
the data path the read of the misses as well.

`ReadEngine.stream` serves a gRPC batch: it cuts a `BatchPlan`'s payload
into windows of `chunk_bytes`, keeps `read_ahead_windows` windows in flight
while the caller sends the previous one, and verifies each sample's CRC32C
when asked; memory per stream is bounded by
`(read_ahead_windows + 1) * chunk_bytes`.  `ReadEngine.read_into` fills one
caller-owned buffer (the data path's reused windows).  The system calls
that read the pieces are in preadv_reads.py and uring_reads.py.

Nothing here imports grpc.
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterator

import numpy as np

from dlfs import limits
from dlfs.crc import crc32c
from dlfs.errors import DataCorruption, DeadlineExceeded, Overloaded
from dlfs.server.core.extents import ExtentFiles
from dlfs.server.read import uring, uring_reads
from dlfs.server.read.batch_planning import BatchPlan, Piece, window_pieces
from dlfs.server.read.preadv_reads import ShortRead, advise_willneed, read_cached, read_pieces


class _Window:
    """A window being read: its buffer and the reads still running for it."""

    __slots__ = ("start", "buffer", "futures", "pieces", "missed")

    def __init__(self, start: int, buffer: memoryview, futures: list[Future], pieces: list[Piece],
                 missed: int):
        self.start = start
        self.buffer = buffer
        self.futures = futures  # shares handed to the reader threads
        self.pieces = pieces  # left for the waiting thread to read itself
        self.missed = missed  # pieces the page cache did not hold


class ByteBudget:
    """Bytes of window buffers the daemon may hold at once, across all streams.

    The back-pressure of the read path: a stream whose client reads slowly
    keeps its windows, and new reads wait for budget (up to their deadline,
    at most `limits.budget_wait_s_max`) instead of allocating without bound.
    Thread-safe.
    """

    def __init__(self, total: int):
        self.total = total
        self.free = total
        self._cond = threading.Condition()

    def try_acquire(self, size: int) -> bool:
        with self._cond:
            if size <= self.free:
                self.free -= size
                return True
            return False

    def acquire(self, size: int, deadline: float | None) -> None:
        """Take `size` bytes, waiting for them.  Raises Overloaded when they do not
        come before `deadline` (a time.monotonic() value) or budget_wait_s_max."""
        size = min(size, self.total)
        give_up = time.monotonic() + limits.budget_wait_s_max
        if deadline is not None:
            give_up = min(give_up, deadline)
        with self._cond:
            while size > self.free:
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    raise Overloaded(
                        f"the daemon holds its limit of {self.total} bytes of reads in flight "
                        "(--inflight-bytes-max); clients are reading slower than they ask; "
                        "retry later or with smaller batches")
                self._cond.wait(remaining)
            self.free -= size

    def release(self, size: int) -> None:
        if size:
            with self._cond:
                self.free = min(self.total, self.free + size)
                self._cond.notify_all()


class ReadEngine:
    """Long-lived reader threads that serve every batch of the daemon.

    A window is first read by the calling thread with RWF_NOWAIT, which
    copies what the page cache holds and refuses to wait for the device.
    The pieces that missed are all submitted to the device at once with
    WILLNEED advice, then read by the reader threads in contiguous shares.
    Warm batches thus cost no thread hand-offs; cold ones put the whole
    window in the device queue.

    Thread-safe: any number of RPC threads may stream batches at once; their
    shares queue on the same `threads` readers, which bounds the reads in
    flight against the device.
    """

    def __init__(self, files: ExtentFiles, *, threads: int = limits.reader_threads_default_min,
                 chunk_bytes: int = limits.chunk_bytes_default,
                 read_ahead_windows: int = limits.read_ahead_windows,
                 inflight_bytes_max: int = limits.inflight_bytes_max_default, metrics=None,
                 io_uring: bool = True):
        assert 1 <= threads <= limits.reader_threads_max
        assert 1 <= chunk_bytes <= inflight_bytes_max
        self.files = files
        self.budget = ByteBudget(inflight_bytes_max)
        self.metrics = metrics  # dlfs.server.metrics.Metrics, or None
        self.threads = threads
        self.chunk_bytes = chunk_bytes
        self.read_ahead_windows = read_ahead_windows
        self.io_uring = io_uring  # probe windows with one submission (dlfs/server/read/uring.py)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dlfs-reader")

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def stream(self, dataset_id: int, plan: BatchPlan, *, verify: bool,
               describe: Callable[[int], str], deadline: float | None = None,
               bad: list | None = None, window_bytes: int | None = None
               ) -> Iterator[tuple[int, memoryview]]:
        """Yield (payload offset, bytes) windows of the plan's payload, in order.

        Raises DataCorruption naming the sample (via `describe(sample_id)`)
        on a checksum mismatch or a truncated extent, and DeadlineExceeded
        when `deadline` (a `time.monotonic()` value) passes between windows.
        With a `bad` list, checksum mismatches are appended to it as
        (sample id, message) instead (scrubbing).  A window's buffer stays
        valid after the generator moves on.  Windows are `window_bytes` long
        (default: the engine's chunk_bytes).
        """
        step = window_bytes or self.chunk_bytes
        bounds = [(a, min(a + step, plan.payload_bytes))
                  for a in range(0, plan.payload_bytes, step)]
        verifier = _Verifier(plan, describe, bad) if verify else None
        inflight: collections.deque[_Window] = collections.deque()
        handed_out = 0  # bytes of the window the caller holds; released when it comes back
        try:
            for start, stop in bounds:
                size = stop - start
                # Start the next window while read-ahead and the byte budget allow;
                # otherwise send the oldest one first.  Only a stream with nothing
                # in flight waits for budget, so streams never wait on each other
                # while holding memory.
                while inflight and (len(inflight) > self.read_ahead_windows
                                    or not self.budget.try_acquire(size)):
                    window = inflight.popleft()
                    handed_out = len(window.buffer)
                    yield self._finish(dataset_id, window, plan, verifier, describe, deadline)
                    self.budget.release(handed_out)
                    handed_out = 0
                if not inflight:
                    self.budget.acquire(size, deadline)
                inflight.append(self._start(dataset_id, plan, start, stop))
            while inflight:
                window = inflight.popleft()
                handed_out = len(window.buffer)
                yield self._finish(dataset_id, window, plan, verifier, describe, deadline)
                self.budget.release(handed_out)
                handed_out = 0
        finally:
            self.budget.release(handed_out + sum(len(w.buffer) for w in inflight))
            for window in inflight:
                for future in window.futures:
                    future.cancel()

    def read_into(self, dataset_id: int, pieces: list[Piece], buffer, *,
                  describe_extent: Callable[[int], str], deadline: float | None = None) -> int:
        """Fill `buffer` (writable, e.g. a reused window) as `pieces` say; returns how many
        pieces the page cache did not hold (0: the window was warm).

        Page-cache hits are copied by the calling thread; misses are advised
        at once and read by the reader threads, or, in a window of many small
        pieces, read by this thread in one io_uring submission.  Raises DataCorruption
        naming the extent (via `describe_extent(extent_no)`) when an extent
        ends early, DeadlineExceeded past `deadline`.
        """
        window = self._start_pieces(dataset_id, pieces, 0, memoryview(buffer).cast("B"),
                                    read_here=True)
        try:
            self._wait(dataset_id, window, deadline)
        except ShortRead as short:
            raise DataCorruption(
                f"{describe_extent(short.extent_no)} is truncated: reading {short.wanted} bytes "
                f"at offset {short.file_offset} got {short.got}; re-ingest the dataset") from None
        return window.missed

    def advise(self, dataset_id: int, pieces: list[Piece]) -> None:
        """Ask the device for `pieces` now (WILLNEED advice), without reading them."""
        advise_willneed(self.files, dataset_id, pieces)

    def _start(self, dataset_id: int, plan: BatchPlan, start: int, stop: int) -> _Window:
        buffer = memoryview(np.empty(stop - start, dtype=np.uint8)).cast("B")
        return self._start_pieces(dataset_id, window_pieces(plan, start, stop), start, buffer)

    def _start_pieces(self, dataset_id: int, pieces: list[Piece], start: int,
                      buffer: memoryview, read_here: bool = False) -> _Window:
        """Probe the page cache for `pieces` and start reading what it lacks.  With
        `read_here` and a ring, the misses are read before this returns, in one
        submission (the caller would only wait for them)."""
        if self.metrics is not None:
            self.metrics.ranges_read.inc(len(pieces))
        probed = len(pieces)
        # Windows of many small pieces go through this thread's io_uring: one system
        # call and one release of the GIL for all of them (docs/DESIGN.md).
        ring = (uring.for_this_thread()
                if self.io_uring and probed >= limits.uring_pieces_min else None)
        pieces = read_cached(self.files, dataset_id, pieces, buffer, ring)
        if self.metrics is not None:
            self.metrics.cache_hits.inc(probed - len(pieces))
            self.metrics.cache_misses.inc(len(pieces))
        if len(pieces) <= limits.inline_ranges_max:
            return _Window(start, buffer, [], pieces, len(pieces))
        if read_here and ring is not None:
            # Pieces the kernel cut short are left to `_wait`, which tells a
            # truncated extent.
            left = uring_reads.read(ring, self.files, dataset_id, pieces, buffer, nowait=False)
            if left is not None:
                return _Window(start, buffer, [], left, len(pieces))
        advise_willneed(self.files, dataset_id, pieces)
        payload = sum(piece[3] for piece in pieces)
        shares = max(1, min(self.threads, len(pieces), payload // limits.reader_share_bytes_min))
        cuts = [len(pieces) * i // shares for i in range(shares + 1)]
        futures = [self._pool.submit(read_pieces, self.files, dataset_id, pieces[lo:hi], buffer)
                   for lo, hi in zip(cuts, cuts[1:])]
        return _Window(start, buffer, futures, [], len(pieces))

    def _finish(self, dataset_id: int, window: _Window, plan: BatchPlan,
                verifier: "_Verifier | None", describe, deadline: float | None
                ) -> tuple[int, memoryview]:
        try:
            self._wait(dataset_id, window, deadline)
        except ShortRead as short:
            raise _short_read_error(plan, short, describe) from None
        if verifier is not None:
            verifier.check(window.start, window.buffer)
        return window.start, window.buffer


    def _wait(self, dataset_id: int, window: _Window, deadline: float | None) -> None:
        """Read the window's inline pieces and wait for its shares.  Raises ShortRead."""
        if deadline is not None and time.monotonic() > deadline:
            for future in window.futures:
                future.cancel()
            raise DeadlineExceeded("the read passed its deadline")
        if window.pieces:
            read_pieces(self.files, dataset_id, window.pieces, window.buffer)
        for future in window.futures:
            future.result()


class _Verifier:
    """Checks each sample's CRC32C as the windows of its payload arrive in order."""

    def __init__(self, plan: BatchPlan, describe, bad: list | None = None):
        self.plan = plan
        self.describe = describe
        self.bad = bad  # collect (sample id, message) here instead of raising
        self.ends = plan.sample_payload_offset + plan.sample_length
        self.running = 0  # CRC so far of a sample cut by the previous window's end
        bad = (plan.sample_length == 0) & (plan.sample_crc != 0)
        if bad.any():
            self._fail(int(np.argmax(bad)), 0)

    def check(self, start: int, buffer: memoryview) -> None:
        """Verify every sample that ends inside [start, start + len(buffer)).  O(samples)."""
        plan = self.plan
        stop = start + len(buffer)
        first = int(np.searchsorted(self.ends, start, side="right"))
        last = int(np.searchsorted(plan.sample_payload_offset, stop, side="left"))
        offsets = (plan.sample_payload_offset[first:last].astype(np.int64) - start).tolist()
        ends = (self.ends[first:last].astype(np.int64) - start).tolist()
        expected = plan.sample_crc[first:last].tolist()
        window_bytes = len(buffer)
        for i, (lo, hi, crc) in enumerate(zip(offsets, ends, expected)):
            if lo >= 0 and hi <= window_bytes:  # the common case: the whole sample is here
                if crc32c(buffer[lo:hi]) != crc:
                    self._fail(first + i, crc32c(buffer[lo:hi]))
                continue
            value = crc32c(buffer[max(lo, 0):min(hi, window_bytes)],
                           self.running if lo < 0 else 0)
            if hi <= window_bytes:
                if value != crc:
                    self._fail(first + i, value)
            else:
                self.running = value

    def _fail(self, index: int, got: int) -> None:
        plan = self.plan
        sample_id = int(plan.sample_ids[index])
        message = (f"checksum mismatch for {self.describe(sample_id)}: stored CRC32C "
                   f"{int(plan.sample_crc[index]):08x}, read {got:08x}; the extent is damaged, "
                   "re-ingest the dataset or restore it from its source")
        if self.bad is None:
            raise DataCorruption(message)
        self.bad.append((sample_id, message))


def _short_read_error(plan: BatchPlan, short: ShortRead, describe) -> DataCorruption:
    in_extent = plan.range_extent == short.extent_no
    payload_pos = None
    for r in np.flatnonzero(in_extent):
        lo = int(plan.range_file_offset[r])
        if lo <= short.file_offset < lo + int(plan.range_length[r]):
            payload_pos = int(plan.range_payload_offset[r]) + short.file_offset + short.got - lo
            break
    sample = "a sample"
    if payload_pos is not None:
        i = int(np.searchsorted(plan.sample_payload_offset, payload_pos, side="right")) - 1
        sample = describe(int(plan.sample_ids[max(i, 0)]))
    return DataCorruption(
        f"extent {short.extent_no} is truncated: reading {sample} got {short.got} of "
        f"{short.wanted} bytes at offset {short.file_offset}; re-ingest the dataset"
    )
