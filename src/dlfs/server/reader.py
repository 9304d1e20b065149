"""Read engine: plan a batch (dedupe, sort, coalesce), then read it in parallel.

A batch of sample locations becomes a `BatchPlan`:

1. duplicate ids are read once;
2. the unique samples are sorted by (extent, offset);
3. runs of samples that sit back to back in one extent (at most
   `coalesce_gap_bytes` apart) merge into ranges of at most about
   `range_bytes_max` bytes: one `pread` each.

The payload is the ranges concatenated in that order (including any
coalesced gap bytes).  Each requested sample maps to an (offset, length)
inside the payload, so duplicates and request order cost no copies.

`ReadEngine.stream` cuts the payload into windows of `chunk_bytes`, hands
each window's pieces to long-lived reader threads in contiguous shares
(`os.preadv` releases the GIL, so the device sees up to `threads` reads at
once), keeps `read_ahead_windows` windows in flight while the caller sends
the previous one, and verifies each sample's CRC32C when asked.  Memory per
stream is bounded by `(read_ahead_windows + 1) * chunk_bytes`.

Nothing here imports grpc.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterator

import crc32c
import numpy as np

from dlfs import limits
from dlfs.errors import DataCorruption, DeadlineExceeded, Overloaded
from dlfs.server.extents import ExtentFiles


@dataclasses.dataclass
class BatchPlan:
    """How to read one batch.  Arrays of ranges and unique samples are in payload order."""

    payload_bytes: int
    request_offsets: np.ndarray  # uint64, per requested sample
    request_lengths: np.ndarray  # uint64
    range_extent: np.ndarray  # uint32
    range_file_offset: np.ndarray  # uint64
    range_payload_offset: np.ndarray  # uint64
    range_length: np.ndarray  # uint64
    sample_ids: np.ndarray  # int64, unique samples
    sample_payload_offset: np.ndarray  # uint64
    sample_length: np.ndarray  # uint64
    sample_crc: np.ndarray  # uint32

    @property
    def ranges(self) -> int:
        return int(self.range_extent.size)


def plan_batch(ids: np.ndarray, extent: np.ndarray, offset: np.ndarray, length: np.ndarray,
               crc: np.ndarray, *, coalesce_gap_bytes: int = limits.coalesce_gap_bytes_default,
               range_bytes_max: int = limits.range_bytes_max) -> BatchPlan:
    """Plan the read of samples `ids` (validated, duplicates allowed).

    `extent`, `offset`, `length`, `crc` are the dataset's per-id arrays.
    Vectorized: O(k log k) for k requested ids, no Python loop per sample.
    """
    unique_ids, inverse = np.unique(ids, return_inverse=True)
    n = unique_ids.size
    if n == 0:
        empty_u64 = np.empty(0, np.uint64)
        return BatchPlan(0, empty_u64, empty_u64, np.empty(0, np.uint32), empty_u64, empty_u64,
                         empty_u64, np.empty(0, np.int64), empty_u64, empty_u64,
                         np.empty(0, np.uint32))
    # Signed arithmetic from here on: offsets are far below 2**63 and
    # differences must be allowed to go negative.
    ext = extent[unique_ids].astype(np.int64)
    off = offset[unique_ids].astype(np.int64)
    size = length[unique_ids].astype(np.int64)
    order = np.lexsort((off, ext))
    unique_ids, ext, off, size = unique_ids[order], ext[order], off[order], size[order]
    rank = np.empty_like(order)  # rank[j]: payload position of np.unique's j-th id
    rank[order] = np.arange(n)
    end = off + size
    starts = np.ones(n, dtype=bool)
    starts[1:] = (ext[1:] != ext[:-1]) | (off[1:] - end[:-1] > coalesce_gap_bytes)
    # Split long runs so one range stays near range_bytes_max: a new range
    # begins where a run's running byte count crosses a multiple of it.
    run_start_off = off[starts][np.cumsum(starts) - 1]
    bucket = (np.maximum(end - 1, off) - run_start_off) // max(range_bytes_max, 1)
    starts[1:] |= bucket[1:] != bucket[:-1]
    range_index = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    range_file_offset = off[first]
    range_length = np.maximum.reduceat(end, first) - range_file_offset
    range_payload_offset = np.zeros(first.size, dtype=np.int64)
    np.cumsum(range_length[:-1], out=range_payload_offset[1:])
    sample_payload_offset = range_payload_offset[range_index] + (off - range_file_offset[range_index])
    request_rank = rank[inverse]
    request_offsets = sample_payload_offset[request_rank]
    request_lengths = size[request_rank]
    return BatchPlan(
        payload_bytes=int(range_length.sum()),
        request_offsets=request_offsets.astype(np.uint64, copy=False),
        request_lengths=request_lengths.astype(np.uint64, copy=False),
        range_extent=ext[first].astype(np.uint32, copy=False),
        range_file_offset=range_file_offset.astype(np.uint64, copy=False),
        range_payload_offset=range_payload_offset.astype(np.uint64, copy=False),
        range_length=range_length.astype(np.uint64, copy=False),
        sample_ids=unique_ids.astype(np.int64, copy=False),
        sample_payload_offset=sample_payload_offset.astype(np.uint64, copy=False),
        sample_length=size.astype(np.uint64, copy=False),
        sample_crc=crc[unique_ids].astype(np.uint32, copy=False),
    )


# One contiguous piece of a window: (extent no, file offset, window offset, bytes).
Piece = tuple[int, int, int, int]


def window_pieces(plan: BatchPlan, start: int, stop: int) -> list[Piece]:
    """The parts of the plan's ranges that fall into payload bytes [start, stop).

    Vectorized: two bisects and a few array operations, one list at the end.
    """
    range_start = plan.range_payload_offset.astype(np.int64)
    range_end = range_start + plan.range_length.astype(np.int64)
    first = int(np.searchsorted(range_end, start, side="right"))
    last = int(np.searchsorted(range_start, stop, side="left"))
    part_start, part_end = range_start[first:last], range_end[first:last]
    lo = np.maximum(part_start, start)
    hi = np.minimum(part_end, stop)
    keep = hi > lo
    file_offset = plan.range_file_offset[first:last].astype(np.int64) + (lo - part_start)
    return list(zip(plan.range_extent[first:last][keep].tolist(), file_offset[keep].tolist(),
                    (lo[keep] - start).tolist(), (hi - lo)[keep].tolist()))


class ShortRead(Exception):
    """An extent ended before a planned range did (the extent is truncated)."""

    def __init__(self, extent_no: int, file_offset: int, wanted: int, got: int):
        super().__init__(extent_no, file_offset, wanted, got)
        self.extent_no, self.file_offset, self.wanted, self.got = extent_no, file_offset, wanted, got


class _Window:
    """A window being read: its buffer and the reads still running for it."""

    __slots__ = ("start", "buffer", "futures", "pieces")

    def __init__(self, start: int, buffer: memoryview, futures: list[Future], pieces: list[Piece]):
        self.start = start
        self.buffer = buffer
        self.futures = futures  # shares handed to the reader threads
        self.pieces = pieces  # left for the waiting thread to read itself


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

    def __init__(self, files: ExtentFiles, *, threads: int = limits.reader_threads_default,
                 chunk_bytes: int = limits.chunk_bytes_default,
                 read_ahead_windows: int = limits.read_ahead_windows,
                 inflight_bytes_max: int = limits.inflight_bytes_max_default, metrics=None):
        assert 1 <= threads <= limits.reader_threads_max
        assert 1 <= chunk_bytes <= inflight_bytes_max
        self.files = files
        self.budget = ByteBudget(inflight_bytes_max)
        self.metrics = metrics  # dlfs.server.metrics.Metrics, or None
        self.threads = threads
        self.chunk_bytes = chunk_bytes
        self.read_ahead_windows = read_ahead_windows
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dlfs-reader")

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def stream(self, dataset_id: int, plan: BatchPlan, *, verify: bool,
               describe: Callable[[int], str], deadline: float | None = None,
               bad: list | None = None) -> Iterator[tuple[int, memoryview]]:
        """Yield (payload offset, bytes) windows of the plan's payload, in order.

        Raises DataCorruption naming the sample (via `describe(sample_id)`)
        on a checksum mismatch or a truncated extent, and DeadlineExceeded
        when `deadline` (a `time.monotonic()` value) passes between windows.
        With a `bad` list, checksum mismatches are appended to it as
        (sample id, message) instead (scrubbing).  A window's buffer stays
        valid after the generator moves on.
        """
        bounds = [(a, min(a + self.chunk_bytes, plan.payload_bytes))
                  for a in range(0, plan.payload_bytes, self.chunk_bytes)]
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

    def _start(self, dataset_id: int, plan: BatchPlan, start: int, stop: int,
               buffer: memoryview | None = None) -> _Window:
        if buffer is None:
            buffer = memoryview(np.empty(stop - start, dtype=np.uint8)).cast("B")
        pieces = window_pieces(plan, start, stop)
        if self.metrics is not None:
            self.metrics.ranges_read.inc(len(pieces))
        if len(pieces) > limits.inline_ranges_max:
            probed = len(pieces)
            pieces = _read_cached(self.files, dataset_id, pieces, buffer)
            advise_willneed(self.files, dataset_id, pieces)
            if self.metrics is not None:
                self.metrics.cache_hits.inc(probed - len(pieces))
                self.metrics.cache_misses.inc(len(pieces))
        if len(pieces) <= limits.inline_ranges_max:
            return _Window(start, buffer, [], pieces)
        shares = min(self.threads, len(pieces))
        cuts = [len(pieces) * i // shares for i in range(shares + 1)]
        futures = [self._pool.submit(_read_pieces, self.files, dataset_id, pieces[lo:hi], buffer)
                   for lo, hi in zip(cuts, cuts[1:])]
        return _Window(start, buffer, futures, [])

    def _finish(self, dataset_id: int, window: _Window, plan: BatchPlan,
                verifier: "_Verifier | None", describe, deadline: float | None
                ) -> tuple[int, memoryview]:
        if deadline is not None and time.monotonic() > deadline:
            raise DeadlineExceeded("the read passed its deadline")
        try:
            if window.pieces:
                _read_pieces(self.files, dataset_id, window.pieces, window.buffer)
            for future in window.futures:
                future.result()
        except ShortRead as short:
            raise _short_read_error(plan, short, describe) from None
        if verifier is not None:
            verifier.check(window.start, window.buffer)
        return window.start, window.buffer


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
                if crc32c.crc32c(buffer[lo:hi]) != crc:
                    self._fail(first + i, crc32c.crc32c(buffer[lo:hi]))
                continue
            value = crc32c.crc32c(buffer[max(lo, 0):min(hi, window_bytes)],
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


_nowait_supported = hasattr(os, "RWF_NOWAIT")


@contextlib.contextmanager
def _with_fds(files: ExtentFiles, dataset_id: int, pieces: list[Piece]):
    """Iterate (fd, piece) over `pieces`, holding the current extent's descriptor.

    Pieces come sorted by extent, so each extent is acquired once; the last
    one is released when the `with` block ends, also on an early exit.
    """
    with contextlib.ExitStack() as stack:
        def walk():
            current_extent, fd = -1, -1
            for piece in pieces:
                if piece[0] != current_extent:
                    stack.close()
                    fd = stack.enter_context(files.acquire(dataset_id, piece[0]))
                    current_extent = piece[0]
                yield fd, piece

        yield walk()


def _read_cached(files: ExtentFiles, dataset_id: int, pieces: list[Piece],
                 buffer: memoryview) -> list[Piece]:
    """Copy what the page cache holds of `pieces` into `buffer` without blocking.

    Returns the pieces (or their remainders) that still need a blocking read.
    One `preadv(RWF_NOWAIT)` per piece; stops early, returning everything,
    when the first `limits.nowait_probe_pieces` pieces all miss, and where the file
    system does not support RWF_NOWAIT.
    """
    global _nowait_supported
    if not _nowait_supported:
        return pieces
    missed: list[Piece] = []
    with _with_fds(files, dataset_id, pieces) as walk:
        for index, (fd, piece) in enumerate(walk):
            if index == limits.nowait_probe_pieces and len(missed) == index:
                # Nothing cached so far: a cold window; leave the rest to the
                # reader threads rather than paying a syscall per piece here.
                return pieces
            extent_no, file_offset, buffer_offset, size = piece
            try:
                got = os.preadv(fd, [buffer[buffer_offset:buffer_offset + size]], file_offset,
                                os.RWF_NOWAIT)
            except BlockingIOError:
                got = 0
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                _nowait_supported = False
                return pieces
            if got < size:
                missed.append((extent_no, file_offset + got, buffer_offset + got, size - got))
    return missed


def advise_willneed(files: ExtentFiles, dataset_id: int, pieces: list[Piece]) -> None:
    """Submit the device reads of every piece at once, without waiting for them.

    `posix_fadvise(WILLNEED)` starts the read and returns, so one thread puts
    a whole window's misses into the device queue within microseconds; the
    reader threads' `preadv`s then only wait for data already on its way.
    Measured on 2 cores (cold 4 KiB batches): 71-79 k samples/s with 2-8
    threads, against 36-50 k without the advice (the device does 85 k IOPS
    at queue depth 64), and better than issuing the advice from each share.
    """
    with _with_fds(files, dataset_id, pieces) as walk:
        for fd, (_extent_no, file_offset, _buffer_offset, size) in walk:
            # The kernel reads at most its read-ahead size per call.
            for start in range(file_offset, file_offset + size, limits.willneed_chunk_bytes):
                length = min(limits.willneed_chunk_bytes, file_offset + size - start)
                os.posix_fadvise(fd, start, length, os.POSIX_FADV_WILLNEED)


def _read_pieces(files: ExtentFiles, dataset_id: int, pieces: list[Piece], buffer: memoryview) -> None:
    """Read `pieces` into `buffer`, one blocking `preadv` per piece.  Runs on a reader thread."""
    with _with_fds(files, dataset_id, pieces) as walk:
        for fd, (extent_no, file_offset, buffer_offset, size) in walk:
            target = buffer[buffer_offset:buffer_offset + size]
            got = os.preadv(fd, [target], file_offset)
            while got < size:
                more = os.preadv(fd, [target[got:]], file_offset + got)
                if more == 0:
                    raise ShortRead(extent_no, file_offset, size, got)
                got += more
