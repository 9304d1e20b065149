"""Prefetch: read hinted samples into the page cache ahead of their batch.

A client that knows its upcoming batches (the epoch order follows from the
sampler's seed) sends them as hints; the daemon plans each hint like a batch
(same sort and coalescing) and one background thread issues
`posix_fadvise(WILLNEED)` per range, which makes the kernel start the reads
without anyone waiting for them.  When the batch arrives, `ReadEngine`'s
RWF_NOWAIT pass finds the data cached.  Hints never delay demand reads by
more than the device queue they share, and a full queue drops new hints
(Overloaded) instead of growing.  Nothing here imports grpc.
"""

from __future__ import annotations

import logging
import queue
import threading

from dlfs import limits
from dlfs.server.read import uring
from dlfs.errors import DataCorruption, Overloaded
from dlfs.server.read import uring_reads
from dlfs.server.core.extents import ExtentFiles
from dlfs.server.read.batch_planning import BatchPlan, window_pieces
from dlfs.server.read.preadv_reads import advise_willneed

log = logging.getLogger(__name__)

_STOP = object()


class Prefetcher:
    """One background thread turning queued plans into WILLNEED advice.  Thread-safe."""

    def __init__(self, files: ExtentFiles, queue_max: int = limits.prefetch_queue_max,
                 io_uring: bool = True):
        self._files = files
        self._io_uring = io_uring  # advise a hint in one submission (uring_reads.advise)
        self._queue: queue.Queue = queue.Queue(maxsize=queue_max)
        self.ranges_advised = 0
        self.hints_cached = 0  # hints skipped: their first ranges were in the page cache
        self._thread = threading.Thread(target=self._run, name="dlfs-prefetch", daemon=True)
        self._thread.start()

    def submit(self, dataset_id: int, plan: BatchPlan, *, probed: bool = False) -> None:
        """Queue a plan's ranges for read-ahead.  Raises Overloaded when the queue is full.

        `probed`: the caller found them uncached already (`cached`), so the
        prefetch thread advises them without probing again.
        """
        try:
            self._queue.put_nowait((dataset_id, plan, probed))
        except queue.Full:
            raise Overloaded(
                f"the prefetch queue is full ({self._queue.maxsize} hints); this hint was "
                "dropped, which only costs speed") from None

    def cached(self, dataset_id: int, pieces) -> bool:
        """Whether the page cache holds file `pieces` of a hint (pass its first
        `limits.nowait_probe_pieces`); a cached hint is counted in `hints_cached` and
        needs nothing more.

        Probed on the calling thread's ring, in one submission.  The prefetch
        thread probes a hint so before advising it; a thread serving a hint
        alone probes its first samples before even planning it and settles a
        warm one there, without the hand-off to the prefetch thread (on two
        cores that made the serving thread wait for the GIL behind the
        planning and probing).  False
        when io_uring is not in use (the prefetch thread then advises all).
        """
        ring = uring.for_this_thread() if self._io_uring else None
        if ring is None or not len(pieces):
            return False
        if not uring_reads.all_cached(ring, self._files, dataset_id, pieces):
            return False
        self.hints_cached += 1
        return True

    def close(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._queue.put(_STOP)
        self._thread.join()

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            dataset_id, plan, probed = item
            try:
                self._advise(dataset_id, plan, probed)
            except DataCorruption as exc:  # e.g. the dataset was deleted since the hint
                log.debug("prefetch of dataset id %x skipped: %s", dataset_id, exc)
            except Exception:  # noqa: BLE001 - a failed hint must not stop later ones
                log.warning("prefetch of dataset id %x failed", dataset_id, exc_info=True)

    def _advise(self, dataset_id: int, plan: BatchPlan, probed: bool = False) -> None:
        pieces = window_pieces(plan, 0, plan.payload_bytes)
        ring = uring.for_this_thread() if self._io_uring else None
        if ring is not None:
            # A hint for data already cached (a warm epoch) costs the threads serving
            # reads nothing but one probe; otherwise one system call advises it all,
            # and this thread takes the GIL once per hint, not once per range.
            if not probed and self.cached(dataset_id, pieces[:limits.nowait_probe_pieces]):
                return
            uring_reads.advise(ring, self._files, dataset_id, pieces, limits.willneed_chunk_bytes)
        else:
            advise_willneed(self._files, dataset_id, pieces)
        self.ranges_advised += len(pieces)
