"""Dataset warm-up: read a dataset's extents in order into the page cache, in the background.

A packed dataset can be read sequentially at the device's bandwidth, which
a random first epoch over it cannot: warming it first turns the epoch's
random reads into page-cache hits.  A warm-up reads each extent of the
dataset stored here, in extent and offset order, in `warm_read_bytes`
pieces (`sendfile` to /dev/null: the kernel reads each piece into the page
cache and copies it nowhere, at under half the CPU of a `preadv` into a
buffer), on one background thread, never more than the *budget*:
`--warm-memory-share` of the daemon's memory (the machine's, or its cgroup
limit if lower).  The kernel's own sequential read-ahead keeps the device
busy and fills the page cache in large folios, at about a tenth of the CPU
of advising each piece WILLNEED (which fills it in 4 KiB pages) and no
slower (docs/DESIGN.md, "Dataset warm-up"); only the last
`warm_advised_tail_bytes` before the budget ends are read with read-ahead
off and each next piece advised, so that nothing past the budget is read.

The budget is shared: datasets warmed earlier are counted until a newer
warm-up needs their room (oldest first; the kernel decides what actually
stays cached).  A dataset larger than the budget is warmed up to it, and
the warm-up says so (its status, and a log line).

Started by `dlfs warm NAME` (the Warm RPC) and, unless turned off
(`--warm-on-first-read off`), by the first read of each dataset version.
Counted in the daemon's metrics (dlfs_warm_bytes, dlfs_warmups by final
state, dlfs_warmups_active, dlfs_warm_budget_bytes).  Nothing here imports
grpc.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import queue
import threading

import numpy as np

from dlfs import limits
from dlfs.formats import disk_layout as layout
from dlfs.errors import Overloaded
from dlfs.server.read import residency

log = logging.getLogger(__name__)

_STOP = object()

# States of a warm-up.
QUEUED, WARMING, WARM, PARTIAL, STOPPED, FAILED = (
    "queued", "warming", "warm", "partial", "stopped", "failed")
ACTIVE = (QUEUED, WARMING)


@dataclasses.dataclass
class WarmStatus:
    """One dataset version's warm-up.  `fits`: its local bytes fit the budget."""

    dataset: str
    generation: int
    state: str
    bytes_total: int  # bytes of the dataset's extents stored here
    bytes_warmed: int
    budget_bytes: int
    fits: bool
    message: str = ""
    bytes_resident: int = 0  # of bytes_total in the page cache when the status was asked


def memory_bytes() -> int:
    """The memory this daemon may use: physical memory, or its cgroup's limit if lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


class Warmer:
    """Warm-ups of datasets, one at a time on a background thread.  Thread-safe.

    `data_dir` holds the extents (dlfs.formats.disk_layout); `budget_bytes` bounds what
    all warm-ups count together; `is_current(name, generation)` says whether
    a version is still the published one (a replaced or deleted one stops);
    `metrics` (the daemon's dlfs.server.metrics.Metrics) counts them.
    """

    def __init__(self, data_dir: str, budget_bytes: int, is_current, *, metrics,
                 read_bytes: int = limits.warm_read_bytes,
                 tail_bytes: int = limits.warm_advised_tail_bytes,
                 queue_max: int = limits.warm_queue_max):
        assert budget_bytes >= 0 and read_bytes > 0
        self.data_dir = data_dir
        self.budget_bytes = budget_bytes
        self._is_current = is_current
        self._metrics = metrics
        metrics.warm_budget_bytes.set(budget_bytes)
        self._read_bytes = read_bytes
        self._tail_bytes = tail_bytes
        self._lock = threading.Lock()
        self._status: dict[str, WarmStatus] = {}  # by dataset name: its latest warm-up
        self._counted: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._seen: set[tuple[str, int]] = set()  # versions whose first read was seen
        self._queue: queue.Queue = queue.Queue(maxsize=queue_max)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="dlfs-warmup", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        try:
            self._queue.put_nowait(_STOP)
        except queue.Full:
            pass  # the thread sees _closed between pieces
        self._thread.join(limits.readahead_stop_timeout_s)

    def warm(self, dataset) -> WarmStatus:
        """Queue a warm-up of `dataset` (a DatasetIndex) unless one of this version is
        queued or running; returns its status at once.  Raises Overloaded when
        `limits.warm_queue_max` warm-ups wait already."""
        with self._lock:
            status = self._status.get(dataset.name)
            if status is not None and status.generation == dataset.generation and \
                    status.state in ACTIVE:
                return dataclasses.replace(status)
            total = _local_bytes(self.data_dir, dataset)
            status = WarmStatus(dataset.name, dataset.generation, QUEUED, total, 0,
                                self.budget_bytes, total <= self.budget_bytes)
            if not status.fits:
                status.message = self._too_large(status)
            try:
                self._queue.put_nowait((dataset, status))
            except queue.Full:
                raise Overloaded(f"{self._queue.maxsize} warm-ups are waiting already "
                                 "(limits.warm_queue_max); ask again later") from None
            self._status[dataset.name] = status
            self._seen.add((dataset.name, dataset.generation))
            self._metrics.warmups_active.inc()
            return dataclasses.replace(status)

    def first_read(self, dataset) -> None:
        """A read of `dataset` arrived: warm it if this is its version's first.  O(1);
        never raises (a full queue skips the warm-up)."""
        key = (dataset.name, dataset.generation)
        if key in self._seen or self.budget_bytes == 0:
            return
        try:
            self.warm(dataset)
        except Overloaded:
            self._seen.add(key)
            log.info("warm-up of dataset %r skipped: the warm-up queue is full", dataset.name)

    def status(self, dataset) -> WarmStatus | None:
        """The latest warm-up of `dataset` (a DatasetIndex: its current version), with
        what of it is in the page cache now; None if it never had one.  Costs one
        cachestat (or mincore) per extent stored here."""
        with self._lock:
            status = self._status.get(dataset.name)
            status = dataclasses.replace(status) if status is not None else None
        if status is not None and status.generation == dataset.generation:
            status.bytes_resident = resident_bytes(self.data_dir, dataset)
        return status

    # --- the warm-up thread --------------------------------------------------------------

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            dataset, status = item
            try:
                self._warm(dataset, status)
            except Exception as exc:  # noqa: BLE001 - a warm-up only costs speed
                log.exception("warm-up of dataset %r failed", dataset.name)
                self._set(status, FAILED, message=f"the warm-up failed: {exc}")

    def _warm(self, dataset, status: WarmStatus) -> None:
        goal = min(status.bytes_total, self.budget_bytes)
        with self._lock:
            self._counted.pop(dataset.name, None)
            while self._counted and sum(self._counted.values()) + goal > self.budget_bytes:
                self._counted.popitem(last=False)  # oldest first: the kernel may drop them
            self._counted[dataset.name] = goal
            status.state = WARMING
        with open(os.devnull, "wb", buffering=0) as null:
            self._warm_extents(dataset, status, goal, null.fileno())

    def _warm_extents(self, dataset, status: WarmStatus, goal: int, null: int) -> None:
        """Read the dataset's extents in order until `goal` bytes, sending them to the
        descriptor `null` (/dev/null); set the final state."""
        warmed = 0
        # Only a budget that cuts the dataset short needs the advised tail: otherwise
        # read-ahead ends at the last extent's end anyway.
        tail = self._tail_bytes if goal < status.bytes_total else 0
        for extent_no in _local_extents(dataset):
            path = layout.extent_path(self.data_dir, dataset.dataset_id, extent_no)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return self._set(status, STOPPED, message="the dataset was deleted or replaced")
            try:
                size = os.fstat(fd).st_size
                position = 0
                advised = False  # in the budget's tail: read-ahead off, pieces advised
                while position < size and warmed < goal:
                    if self._closed or not self._is_current(dataset.name, dataset.generation):
                        return self._set(status, STOPPED,
                                         message="the dataset was replaced, deleted, or the "
                                                 "daemon is stopping")
                    step = min(self._read_bytes, size - position, goal - warmed)
                    if not advised and goal - warmed <= tail:
                        # The kernel's read-ahead runs up to a window past what is read;
                        # from here on only what is advised is read, so the warm-up stops
                        # at its budget.
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                        os.posix_fadvise(fd, position, step, os.POSIX_FADV_WILLNEED)
                        advised = True
                    if advised:  # queue the next piece while this one is read
                        ahead = min(self._read_bytes, size - position - step,
                                    goal - warmed - step)
                        if ahead > 0:
                            os.posix_fadvise(fd, position + step, ahead,
                                             os.POSIX_FADV_WILLNEED)
                    got = os.sendfile(null, fd, position, step)
                    if got <= 0:
                        break
                    position += got
                    warmed += got
                    status.bytes_warmed = warmed  # read without the lock: progress only
                    self._metrics.warm_bytes.inc(got)
            finally:
                os.close(fd)
            if warmed >= goal:
                break
        if status.fits:
            self._set(status, WARM)
            log.info("dataset %r is warm: %d bytes read into the page cache", dataset.name,
                     warmed)
        else:
            self._set(status, PARTIAL)
            log.warning("%s", status.message)

    def _set(self, status: WarmStatus, state: str, *, message: str = "") -> None:
        with self._lock:
            if state not in ACTIVE and status.state in ACTIVE:
                # counted before the state shows: whoever sees it done sees it counted
                self._metrics.warmups_active.dec()
                self._metrics.warmups.labels(state).inc()
            status.state = state
            if message:
                status.message = message

    def _too_large(self, status: WarmStatus) -> str:
        return (f"dataset {status.dataset!r} does not fit the warm-up budget: "
                f"{status.bytes_total} bytes stored here, {self.budget_bytes} bytes of budget "
                "(--warm-memory-share of the daemon's memory); only its first "
                f"{self.budget_bytes} bytes are warmed, the rest is read on demand")


def _local_extents(dataset) -> list[int]:
    """The extent numbers of `dataset` stored here, in order."""
    return np.unique(dataset.extent[dataset.extent != layout.NO_EXTENT]).tolist()


def resident_bytes(data_dir: str, dataset) -> int:
    """Bytes of the extent files of `dataset` stored here that the page cache holds now
    (0 where the kernel cannot say)."""
    total = 0
    for extent_no in _local_extents(dataset):
        try:
            fd = os.open(layout.extent_path(data_dir, dataset.dataset_id, extent_no),
                         os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            size = os.fstat(fd).st_size
            total += min(size, (residency.cached_pages(fd, 0, size) or 0) * residency.PAGE_BYTES)
        finally:
            os.close(fd)
    return total


def _local_bytes(data_dir: str, dataset) -> int:
    """Bytes of the extent files of `dataset` stored here (headers included)."""
    total = 0
    for extent_no in _local_extents(dataset):
        try:
            total += os.stat(layout.extent_path(data_dir, dataset.dataset_id, extent_no)).st_size
        except FileNotFoundError:
            pass
    return total
