"""Reads of sealed datasets: planning, reading, hints, descriptors, scrub, counters.

`DatasetReads` is the read side of the Store (`Store.reads`): what both
front doors call to turn a request on a dataset they hold (`Store.reading`)
into bytes.  It owns the read engine and the prefetcher it is given (and
closes them), checks requests against the daemon's `BatchLimits`, applies
the daemon's --verify setting, and counts what it serves.  It takes no lock
of its own and keeps no dataset alive: the caller's read lease does.
Nothing here imports grpc or the daemon's config.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from typing import Iterator, Sequence

import numpy as np

from dlfs import limits, native
from dlfs.errors import DataCorruption, Overloaded
from dlfs.formats import disk_layout as layout
from dlfs.server.core.directory import DatasetIndex
from dlfs.server.core.extents import ExtentFiles
from dlfs.server.read import batch_planning, mapped_sends, range_planning, residency, sendfiles
from dlfs.server.read.mapped_sends import ExtentMaps
from dlfs.batch_limits import BatchLimits
from dlfs.server.read.batch_planning import BatchPlan
from dlfs.server.read.preadv_reads import ShortRead
from dlfs.server.read.prefetch import Prefetcher
from dlfs.server.read.range_planning import RangeRead
from dlfs.server.read.read_engine import ReadEngine
from dlfs.server.read.scrub import scrub as scrub_dataset

log = logging.getLogger(__name__)

VERIFY_MODES = ("request", "always", "never")


class DatasetReads:
    """Reads of sealed datasets.  Thread-safe; `close()` stops the engine and prefetcher.

    `files` are the daemon's open extent files (shared with the Store,
    which closes them); `engine` and `prefetcher` read from them and are
    closed by `close()`.  `metrics` (a `dlfs.server.metrics.Metrics`)
    counts reads, hints and sendfile bytes.  `batch_limits` bounds every
    request.  `verify`: "request" (each call says), "always" or "never".
    `coalesce_gap_bytes`: samples at most this far apart are read as one
    range.  `sendfile`: send cached data path windows of large pieces straight
    from the page cache where the kernel allows (`sendfile_state` says why
    not); `mapped_sends`: windows of small pieces from read-only mappings of
    extents when the page cache holds their pages (`mapped_sends_state`).
    """

    def __init__(self, files: ExtentFiles, engine: ReadEngine, prefetcher: Prefetcher,
                 metrics, batch_limits: BatchLimits, *, verify: str = "request",
                 coalesce_gap_bytes: int = limits.coalesce_gap_bytes_default,
                 sendfile: bool = True, mapped_sends: bool = True):
        assert verify in VERIFY_MODES
        self.files = files
        self.engine = engine
        self.prefetcher = prefetcher
        self.metrics = metrics
        self.batch_limits = batch_limits
        self.verify = verify
        self.coalesce_gap_bytes = coalesce_gap_bytes
        # Whether data path windows may go out by sendfile (the setting and the kernel).
        self.sendfile_state = sendfiles.state(sendfile)
        self.sendfile = self.sendfile_state.startswith("on")
        if sendfile and not self.sendfile:
            log.warning("sendfile from the page cache is %s: data path replies are read into "
                        "buffers and sent, which costs the daemon more CPU per byte",
                        self.sendfile_state)
        self.mapped_sends_state = mapped_sends_state(mapped_sends)
        self.maps = ExtentMaps(files) if self.mapped_sends_state.startswith("on") else None

    def close(self) -> None:
        """Stop the prefetch thread and the reader threads (waits for running reads),
        unmap the extents."""
        self.prefetcher.close()
        self.engine.close()
        if self.maps is not None:
            self.maps.close()

    def forget_dataset(self, dataset_id: int) -> None:
        """Close a retired dataset's descriptors and unmap its extents (those a read
        holds go when it ends): its space is freed once its files are removed."""
        self.files.forget_dataset(dataset_id)
        if self.maps is not None:
            self.maps.forget_dataset(dataset_id)

    # --- planning ------------------------------------------------------------------

    def plan(self, dataset: DatasetIndex, ids: Sequence[int] | None = None,
             paths: Sequence[str] | None = None) -> tuple[np.ndarray, BatchPlan]:
        """Validate a batch and plan its read: (ids, plan).  See batch_planning.plan_request."""
        return batch_planning.plan_request(dataset, ids, paths, self.batch_limits,
                                           coalesce_gap_bytes=self.coalesce_gap_bytes)

    def plan_range(self, dataset: DatasetIndex, sample_id: int, offset: int, length: int, *,
                   blocks: bool = True) -> RangeRead:
        """Plan a byte range of one sample, in whole blocks when it can be verified so
        (`blocks`).  See range_planning.plan_range."""
        return range_planning.plan_range(dataset, sample_id, offset, length, self.batch_limits,
                                         blocks=blocks)

    # --- reading -------------------------------------------------------------------

    def read(self, dataset: DatasetIndex, plan: BatchPlan, *, verify: bool = True,
             deadline: float | None = None, describe=None,
             window_bytes: int | None = None) -> Iterator[tuple[int, memoryview]]:
        """Stream the plan's payload windows (see ReadEngine.stream); `describe(item)`
        names an item in errors (default: items are sample ids).  `verify` is
        overridden by the daemon's --verify always / never."""
        if self.verify == "always":
            verify = True
        elif self.verify == "never":
            verify = False
        return self.engine.stream(dataset.dataset_id, plan, verify=verify,
                                  describe=describe or dataset.describe, deadline=deadline,
                                  window_bytes=window_bytes)

    def read_range(self, dataset: DatasetIndex, read: RangeRead, *, verify: bool = True,
                   deadline: float | None = None) -> Iterator[tuple[int, memoryview]]:
        """Stream the asked bytes of a planned range: (offset from its start, bytes).

        Each window is verified (the whole sample, or each block) before it
        is yielded, when `read.checkable` and `verify`.  Raises DataCorruption
        naming the sample (and block), DeadlineExceeded.
        """
        windows = self.read(dataset, read.plan, verify=verify and read.checkable,
                            deadline=deadline, describe=range_planning.describe(dataset, read),
                            window_bytes=range_planning.window_bytes(
                                read, self.engine.chunk_bytes, dataset.blocks.block_bytes))
        return range_planning.trim(windows, read.skip, read.length)

    def read_sample(self, dataset: DatasetIndex, sample_id: int) -> Iterator[memoryview]:
        """The bytes of one locally stored sample, in windows, CRC32C-checked (whole, or
        by blocks when it is read in parts of at most the batch byte limit).

        Raises FailedPrecondition if another member stores it, DataCorruption.
        """
        size = int(dataset.length[sample_id])
        step = self.batch_limits.bytes_max
        for offset in range(0, size, step):
            read = self.plan_range(dataset, sample_id, offset, step)
            for _, window in self.read_range(dataset, read):
                yield window

    def read_into(self, dataset: DatasetIndex, pieces: list, buffer) -> int:
        """Fill `buffer` with file pieces of `dataset`; returns the pieces the page cache
        lacked (see ReadEngine.read_into)."""
        return self.engine.read_into(
            dataset.dataset_id, pieces, buffer,
            describe_extent=lambda extent: dataset.describe_extent(extent))

    def send_cached(self, dataset: DatasetIndex, pieces, sock, head: bytes, *,
                    before=None, deadline: float | None = None) -> bool:
        """Send `head` and then file pieces of `dataset` (tiling one window, sent in
        buffer-offset order) straight from the page cache to `sock` by `sendfile`,
        if it holds every page of them; False, with nothing sent, otherwise (see
        sendfiles.send).  `before()` runs once the pages are known cached, before
        anything is sent.  Raises DataCorruption naming the extent when one ends
        early (the window is padded first, so the framing stays whole), OSError
        (socket.timeout: the peer stopped reading, or `deadline` passed)."""
        maps = self.maps
        known = None if maps is None else functools.partial(maps.resident, dataset.dataset_id)
        return self._sent_cached(dataset, pieces, self.metrics.sendfile_bytes, lambda: (
            sendfiles.send(sock, self.files, dataset.dataset_id, pieces, head,
                           before=before, deadline=deadline, known=known)))

    def send_mapped(self, dataset: DatasetIndex, pieces, sock, head: bytes, *,
                    later_heads=(), before=None, deadline: float | None = None,
                    map_missing: bool = True) -> bool:
        """As `send_cached`, for windows of many pieces: sent from read-only mappings of
        their extents when the page cache holds their pages (mapped_sends.py);
        False, with nothing sent, otherwise (an extent not mapped yet is mapped in
        the background if `map_missing`, else only by `map_soon`).  `later_heads`
        (buffer offset, bytes): frame headers sent before the pieces at those
        offsets, for several windows in one send (ExtentMaps.send)."""
        maps = self.maps
        if maps is None:
            return False
        return self._sent_cached(dataset, pieces, self.metrics.mapped_send_bytes, lambda: (
            maps.send(sock, dataset.dataset_id, pieces, head, later_heads=later_heads,
                      before=before, deadline=deadline, map_missing=map_missing)))

    def send_batch(self, dataset: DatasetIndex, ids: np.ndarray, sock, flags: int, *,
                   window_bytes: int, large_ok: bool, stall_s: float, before) -> bool:
        """A whole GET_BATCH reply of samples `ids` (int64, request order) from mappings of
        the extents in one call (ExtentMaps.send_batch): True when sent; False, with
        nothing sent, when the reply does not qualify, and the caller's Python path
        then serves the request (and raises what a bad one deserves).  `flags` go
        in the BATCH frame; `before(payload bytes)` runs before anything is sent.
        Raises DataCorruption naming the extent when one ends early (the frame is
        completed first), OSError (socket.timeout: the peer stopped reading, or the
        reply's deadline passed)."""
        maps = self.maps
        if maps is None:
            return False
        try:
            payload = maps.send_batch(
                sock, dataset.dataset_id, ids,
                (dataset.extent, dataset.offset, dataset.length, dataset.crc),
                dataset.generation, flags, window_bytes=window_bytes, large_ok=large_ok,
                payload_max=self.batch_limits.bytes_max, stall_s=stall_s, before=before)
        except ShortRead as short:
            raise _corruption(dataset, short) from None
        if payload < 0:
            return False
        # Cached ranges, as the read engine counts the ones it copies: one per sample.
        self.metrics.ranges_read.inc(ids.size)
        self.metrics.cache_hits.inc(ids.size)
        self.metrics.mapped_send_bytes.inc(payload)
        return True

    def map_soon(self, dataset: DatasetIndex, extents, *, populate: bool = True) -> None:
        """Map these extents of `dataset` in the background (see ExtentMaps.map_soon)."""
        if self.maps is not None:
            self.maps.map_soon(dataset.dataset_id, extents, populate=populate)

    def _sent_cached(self, dataset: DatasetIndex, pieces, counter, send) -> bool:
        """`send()` (True: sent), counted as cached ranges and in `counter`; ShortRead as
        DataCorruption naming the extent."""
        try:
            if not send():
                return False
        except ShortRead as short:
            raise _corruption(dataset, short) from None
        # Cached ranges, as the read engine counts the ones it copies.
        self.metrics.ranges_read.inc(len(pieces))
        self.metrics.cache_hits.inc(len(pieces))
        counter.inc(int(pieces.size.sum()))
        return True

    def advise(self, dataset: DatasetIndex, pieces: list) -> None:
        """Start the device reads of file pieces of `dataset` without waiting for them."""
        self.engine.advise(dataset.dataset_id, pieces)

    @contextlib.contextmanager
    def extent_descriptors(self, dataset: DatasetIndex) -> Iterator[list[tuple[int, int]]]:
        """(extent no, read-only fd) of every extent of `dataset` stored here, held open
        for the block (to pass them to a co-located client).  Headers are checked."""
        local = np.unique(dataset.extent[dataset.extent != layout.NO_EXTENT]).tolist()
        with self.files.acquire_all(dataset.dataset_id, local) as fds:
            yield list(zip(local, fds))

    def scrub(self, dataset: DatasetIndex) -> Iterator[tuple[int, int, list[tuple[int, str]]]]:
        """Verify every locally stored sample of `dataset` (see scrub.scrub)."""
        return scrub_dataset(self.engine, dataset)

    # --- prefetch hints --------------------------------------------------------------

    def hint(self, dataset: DatasetIndex, plan: BatchPlan, *, probed: bool = False) -> None:
        """Queue WILLNEED advice for a plan's ranges (a prefetch hint); returns at once.

        Raises Overloaded when the prefetch queue is full: the hint is
        dropped (and counted), which only costs speed.
        """
        try:
            self.prefetcher.submit(dataset.dataset_id, plan, probed=probed)
        except Overloaded:
            self.metrics.prefetch_hints.labels("dropped").inc()
            raise
        self.metrics.prefetch_hints.labels("queued").inc()

    def hint_ids(self, dataset: DatasetIndex, ids, *, alone: bool = False) -> bool:
        """A prefetch hint for sample ids riding on a read, as GetBatch's prefetch_ids:
        a bad id fails the read (InvalidArgument), a full prefetch queue drops the
        hint (returns False), and ids other members store are left to them.

        `alone`: the request is only this hint (its sender need not wait for
        the answer).  Its first samples are then probed on this thread and a
        hint for cached data ends here (`Prefetcher.cached`); a hint riding a
        read is handed on at once, so that the read is not delayed.
        """
        ids = dataset.check_ids(np.asarray(ids, dtype=np.int64))
        if dataset.cluster is not None:
            ids = ids[dataset.extent[ids] != layout.NO_EXTENT]
        if alone:
            head = ids[:limits.nowait_probe_pieces]
            offset = dataset.offset[head].astype(np.int64)
            # Pieces of whole samples, as a plan would cut them (buffer offsets unused).
            pieces = batch_planning.PieceColumns(dataset.extent[head].astype(np.int64), offset,
                                                 np.zeros_like(offset),
                                                 dataset.length[head].astype(np.int64))
            if self.prefetcher.cached(dataset.dataset_id, pieces):
                self.metrics.prefetch_hints.labels("cached").inc()
                return True
        plan = batch_planning.plan_batch(ids, dataset.extent, dataset.offset, dataset.length,
                                         dataset.crc)
        try:
            self.hint(dataset, plan, probed=alone)
        except Overloaded:
            return False
        return True

    # --- counters ------------------------------------------------------------------

    def count_read(self, method: str, plan: BatchPlan, seconds: float) -> None:
        """Count one read call served (see Metrics.count_read)."""
        self.metrics.count_read(method, plan, seconds)

    def count_served(self, method: str, samples: int, payload_bytes: int,
                     started: float) -> None:
        """Count one data path request served since `started` (time.perf_counter)."""
        self.metrics.count_served(method, samples, payload_bytes,
                                  time.perf_counter() - started)


def _corruption(dataset: DatasetIndex, short: ShortRead) -> DataCorruption:
    """What a send from the page cache that found an extent cut short raises."""
    return DataCorruption(
        f"{dataset.describe_extent(short.extent_no)} could not be read whole: "
        f"{short.wanted} bytes at offset {short.file_offset}, got {short.got} (the "
        "file is truncated, or its device failed); re-ingest the dataset")


def mapped_sends_state(enabled: bool) -> str:
    """What `dlfs status` says of sends from mappings: "on" (and how residency is
    asked where cachestat is missing) and which code sends whole replies, or "off"
    and why.  The data path's workers run this process's interpreter in its
    environment, so they load what it loads."""
    if not enabled:
        return "off (--mapped-sends off)"
    sender = native.describe(mapped_sends.native, "send")
    return f"{residency.noted('on')}; whole replies sent by {sender}"
