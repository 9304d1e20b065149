"""Prefetching batch iterator: several get_batch calls in flight while the caller computes.

    from dlfs import Client
    from dlfs.training.pipeline import iter_batches
    from dlfs.training.shard_order import ShuffleShard

    ds = Client("127.0.0.1:7010").dataset("demo")
    order = ShuffleShard(len(ds), seed=1).indices(epoch=0)
    with iter_batches(ds, order, batch_size=256, prefetch=4) as batches:
        for ids, samples in batches:
            train_step(samples)

`iter_rows` does the same for samples of one size, receiving each batch
straight into a ``[B, L]`` array (a tensor with ``torch.from_numpy``).

`iter_batches` cuts `order` into batches and keeps `prefetch` of them in
flight on a small thread pool (one thread per batch in flight; gRPC
releases the GIL while it waits), yielding them in order.  The pipeline
stops its threads when it is exhausted, closed, used as a context manager
that exits, garbage-collected, or when a batch fails (the error is raised
at that batch's turn, after the threads are stopped).  Closing waits for the
calls already running (bounded by the client's batch timeout) and cancels
the rest, so no thread outlives the pipeline.

Clairvoyant hints (opt-in, ``hint_ahead=K``): the order is known, so the
pipeline also sends ``ds.prefetch(ids)`` for the K batches beyond the ones in
flight; the daemon starts reading them into its page cache.  This tells the
storage the future access order, which some benchmark rules (MLPerf
Storage) forbid, hence off by default.  Hints go out in order from one
`HintSender` thread, one Prefetch RPC per batch (per `limits.pipeline_hint_ids_max` ids
at the start), so their round trips never delay the consumer; a hint the
daemon's full queue refuses is counted, not retried.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
from typing import Callable, NamedTuple, Sequence

import numpy as np

from dlfs import limits
from dlfs.training.checks import check_int
from dlfs.errors import DlfsError, InvalidArgument

log = logging.getLogger(__name__)


class Batch(NamedTuple):
    """One batch: its sample ids (int64 array) and samples (read-only memoryviews; from
    `iter_rows`, one ``[B, L]`` uint8 array)."""

    ids: np.ndarray
    samples: list


@dataclasses.dataclass
class PipelineStats:
    """Counters of one pipeline (read them after or during iteration)."""

    batches: int = 0  # batches handed to the caller
    samples: int = 0
    wait_s: float = 0.0  # time the caller spent waiting in next()
    hints_sent: int = 0  # Prefetch RPCs the daemon accepted
    hints_dropped: int = 0  # refused by the daemon's full queue, or skipped by a lagging sender


def iter_batches(ds, order: Sequence[int], batch_size: int, prefetch: int = 4, *,
                 hint_ahead: int = 0, drop_last: bool = False, verify: bool = True,
                 timeline=None, out: Callable[[int, bool], object] | None = None
                 ) -> "BatchPipeline":
    """Batches of `ds` (a `dlfs.Dataset`) in `order`, `prefetch` of them in flight.

    Returns a `BatchPipeline`: an iterator of `Batch` (``ids, samples``) and a
    context manager.  The last batch is shorter unless `drop_last`.
    `hint_ahead` batches beyond those in flight are hinted to the daemon
    (opt-in, see the module doc).  With a `dlfs.training.profile.Timeline`, each
    get_batch and hint is recorded as a span on its thread.  With `out`,
    batch number k is received into the buffer ``out(k, wait)`` returns
    (see `Dataset.get_batch`), called on the iterating thread before batch
    k is submitted: with ``wait`` false (other batches are in flight) it
    may return None, "no buffer now", and batch k is submitted at a later
    `next()`; with ``wait`` true (nothing in flight) it may block until a
    buffer is free.  Its exceptions propagate from `next()`.

    Cost: one get_batch round trip per batch; threads start at the first
    `next()`.  Raises InvalidArgument for bad arguments at once; a failed
    batch raises its typed error (NotFound, DataCorruption, Unavailable, ...)
    when its turn comes.
    """
    return BatchPipeline(ds, order, batch_size, prefetch=prefetch, hint_ahead=hint_ahead,
                         drop_last=drop_last, verify=verify, timeline=timeline, out=out)


def iter_rows(ds, order: Sequence[int], batch_size: int, prefetch: int = 4, *,
              sizes: np.ndarray | None = None, hint_ahead: int = 0, drop_last: bool = False,
              verify: bool = True, timeline=None) -> "BatchPipeline":
    """Batches of samples of one size, each a ``[B, L]`` uint8 array received straight into it.

    As `iter_batches`, but each `Batch`'s ``samples`` is one writable numpy
    array of shape ``[B, L]`` (``torch.from_numpy`` makes it a tensor without
    a copy): the batch is received into it, so the caller never stacks its
    samples (``torch.stack`` in the training thread costs the step; the
    figure is in docs/training.md).  The arrays come from a pool owned
    by the pipeline: one is reused once it and every view of it are
    dropped; keep a batch longer by holding it (nothing reachable is ever
    overwritten), or copy it.

    `sizes` holds every sample's size in bytes, indexed by sample id (as
    ``ds.listing()[1]``, which is fetched when it is not given: one Lookup
    per 65,536 samples).  Raises InvalidArgument at once for bad arguments
    or an id beyond `sizes`, and from `next()` at the first batch whose
    samples differ in size (before it is read; use `iter_batches` for
    those).
    """
    rows = RowBuffers(ds, sizes)
    return BatchPipeline(ds, order, batch_size, prefetch=prefetch, hint_ahead=hint_ahead,
                         drop_last=drop_last, verify=verify, timeline=timeline, rows=rows)


class RowBuffers:
    """The pooled ``[B, L]`` arrays an `iter_rows` pipeline receives its batches into."""

    def __init__(self, ds, sizes: np.ndarray | None):
        from dlfs.client import BufferPool

        if sizes is None:
            sizes = ds.listing()[1]
        sizes = np.asarray(sizes)
        if sizes.ndim != 1 or (sizes.size and sizes.dtype.kind not in "iu"):
            raise InvalidArgument("sizes must be a flat array of sample sizes in bytes, "
                                  "indexed by sample id (as ds.listing()[1])")
        self.sizes = sizes
        self.pool = BufferPool()

    def check(self, ids: np.ndarray) -> None:
        """InvalidArgument when an id has no size."""
        if ids.size and int(ids.max()) >= len(self.sizes):
            raise InvalidArgument(
                f"sample id {int(ids.max())} is beyond the {len(self.sizes)} sizes given; "
                "pass sizes for every sample of the dataset (ds.listing()[1])")

    def take(self, ids: np.ndarray) -> np.ndarray:
        """A ``[len(ids), L]`` array for the batch `ids`, all of whose samples have L bytes."""
        from dlfs.training.packing import one_size

        size = one_size(self.sizes[ids])
        return self.pool.take(len(ids) * size).reshape(len(ids), size)


class BatchPipeline:
    """Iterator over batches with a bounded number of get_batch calls in flight.

    Consume it from one thread.  `close()` (idempotent) stops the threads;
    iteration after it ends at once.
    """

    def __init__(self, ds, order: Sequence[int], batch_size: int, *, prefetch: int = 4,
                 hint_ahead: int = 0, drop_last: bool = False, verify: bool = True,
                 timeline=None, out: Callable[[int, bool], object] | None = None,
                 rows: RowBuffers | None = None):
        check_int("batch_size", batch_size, 1, limits.pipeline_batch_size_max)
        check_int("prefetch", prefetch, 1, limits.pipeline_prefetch_batches_max)
        check_int("hint_ahead", hint_ahead, 0, limits.pipeline_hint_ahead_batches_max)
        ids = _as_ids(order)
        count = batch_count(len(ids), batch_size, drop_last)
        self._batches = [ids[i * batch_size:(i + 1) * batch_size] for i in range(count)]
        self._ds = ds
        self._prefetch = prefetch
        self._hint_ahead = hint_ahead
        self._verify = verify
        self._timeline = timeline
        self._out = out
        self._rows = rows
        if rows is not None:
            rows.check(ids)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._inflight: collections.deque = collections.deque()
        self._next_submit = 0  # first batch not yet submitted
        self._hinted_until = 0  # batches below this were hinted or submitted
        self._closed = False
        self._hints: HintSender | None = None
        self.stats = PipelineStats()

    def __len__(self) -> int:
        """Batches in the whole order (not those left)."""
        return len(self._batches)

    def __iter__(self) -> "BatchPipeline":
        return self

    def __next__(self) -> Batch:
        if self._closed:
            raise StopIteration
        started = time.perf_counter()
        if self._pool is None:
            self._start()
        if not self._inflight and not self._submit_next(wait=True):
            self.close()
            raise StopIteration
        number, future, rows = self._inflight.popleft()
        try:
            # Keep the window full while we wait; the batch being waited for still holds
            # its buffer, so no waiting for another one here.
            self._submit_next(wait=False)
            samples = future.result()
        except BaseException:
            self.close()
            raise
        self.stats.batches += 1
        self.stats.samples += len(samples)
        self.stats.wait_s += time.perf_counter() - started
        return Batch(self._batches[number], samples if rows is None else rows)

    def close(self) -> None:
        """Cancel the batches not yet started, wait for the running ones, stop the threads."""
        if self._closed:
            return
        self._closed = True
        for _number, future, _rows in self._inflight:
            future.cancel()
        self._inflight.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._hints is not None:
            self._hints.close()

    def __enter__(self) -> "BatchPipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_pool", None) is not None:
            self.close()

    # --- inside -----------------------------------------------------------------

    def _start(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self._prefetch, thread_name_prefix="dlfs-pipeline")
        while len(self._inflight) < self._prefetch and \
                self._submit_next(wait=not self._inflight):
            pass

    def _submit_next(self, wait: bool) -> bool:
        """Submit the next batch (and hint the ones `hint_ahead` beyond it); False at the end,
        or when `out` has no buffer for it now (only without `wait`)."""
        number = self._next_submit
        if number >= len(self._batches):
            return False
        buffer = rows = None
        if self._rows is not None:
            try:
                buffer = rows = self._rows.take(self._batches[number])
            except InvalidArgument as exc:  # raised at the batch's turn, as a read error is
                self._next_submit += 1
                failed: concurrent.futures.Future = concurrent.futures.Future()
                failed.set_exception(exc)
                self._inflight.append((number, failed, None))
                return True
        elif self._out is not None:
            buffer = self._out(number, wait)
            if buffer is None:
                return False
        self._next_submit += 1
        # The task must not reference self: the last reference to a dropped pipeline
        # would then die on a pool thread, whose __del__ cannot join its own thread.
        future = self._pool.submit(_fetch, self._ds, self._batches[number], number, self._verify,
                                   self._timeline, buffer)
        self._inflight.append((number, future, rows))
        self._hinted_until = max(self._hinted_until, number + 1)
        if self._hint_ahead and len(self._inflight) >= self._prefetch:
            self._hint(self._hinted_until, number + 1 + self._hint_ahead)
        return True

    def _hint(self, first: int, end: int) -> None:
        """Queue hints for batches [first, end), at most limits.pipeline_hint_ids_max ids per RPC."""
        end = min(end, len(self._batches))
        if first >= end:
            return
        self._hinted_until = end
        if self._hints is None:
            # A thread of its own: it may wait for each answer, so that the counts are exact.
            self._hints = HintSender(lambda ids: self._ds.prefetch(ids, wait=True),
                                     name="dlfs-pipeline-hints",
                                     timeline=self._timeline, stats=self.stats)
        ids = np.concatenate(self._batches[first:end])
        for start in range(0, len(ids), limits.pipeline_hint_ids_max):
            self._hints.submit(ids[start:start + limits.pipeline_hint_ids_max])


class HintSender:
    """One thread that sends prefetch hints in order, so callers never wait for them.

    ``submit(ids)`` returns at once (False, counted as dropped, when
    `limits.pipeline_hint_queue_max` hints are already waiting).  `send(ids) -> bool` is the
    hint call (``Dataset.prefetch`` or ``DLFSDataset.hint``); False means
    the daemon refused it.  A hint that raises a DLFS error stops the
    sending: the error is logged once and kept in `error` (the next batch
    fetch reports the same trouble with its own exception).  `close()`
    discards queued hints and joins the thread.
    """

    def __init__(self, send: Callable[[Sequence[int]], bool], *, name: str = "dlfs-hints",
                 timeline=None, stats: PipelineStats | None = None):
        self._send = send
        self._timeline = timeline
        self.stats = stats if stats is not None else PipelineStats()
        self.error: DlfsError | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=limits.pipeline_hint_queue_max)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, ids) -> bool:
        if self._stopping.is_set() or self.error is not None:
            return False
        try:
            self._queue.put_nowait(ids)
        except queue.Full:
            self.stats.hints_dropped += 1
            return False
        return True

    def close(self) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (ids := self._queue.get()) is not None:
            if self._stopping.is_set() or self.error is not None:
                continue
            started = time.perf_counter_ns()
            try:
                accepted = self._send(ids)
            except DlfsError as exc:
                self.error = exc
                log.warning("prefetch hints stopped: %s", exc)
                continue
            if accepted:
                self.stats.hints_sent += 1
            else:
                self.stats.hints_dropped += 1
            if self._timeline is not None:
                self._timeline.record("hint", started, time.perf_counter_ns(), cat="hint",
                                      args={"samples": len(ids), "accepted": accepted})


def _fetch(ds, ids: np.ndarray, number: int, verify: bool, timeline, out=None) -> list:
    """One batch on a pool thread: one get_batch round trip (into `out` when given)."""
    start = time.perf_counter_ns()
    samples = ds.get_batch(ids, verify=verify) if out is None else \
        ds.get_batch(ids, verify=verify, out=out)
    if timeline is not None:
        timeline.record("get_batch", start, time.perf_counter_ns(), cat="io",
                        args={"batch": number, "samples": len(samples)})
    return samples


def batch_count(samples: int, batch_size: int, drop_last: bool) -> int:
    """Batches of `batch_size` in `samples` items: a short last one counts unless `drop_last`."""
    return samples // batch_size if drop_last else -(-samples // batch_size)


def _as_ids(order) -> np.ndarray:
    try:
        ids = np.asarray(order)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"order must be a sequence of sample ids: {exc}") from None
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise InvalidArgument(
            f"order must be a flat sequence of integer sample ids (got {ids.dtype}, "
            f"{ids.ndim} dimensions); map paths to ids with ds.index(path)")
    if ids.dtype.kind == "i" and ids.min() < 0:
        raise InvalidArgument(f"order holds a negative sample id ({int(ids.min())})")
    return ids.astype(np.int64, copy=False)
