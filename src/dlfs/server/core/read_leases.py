"""Read leases: a dataset's extents stay on disk while reads of it run.

A read takes a lease from resolving the dataset's name to its last reply
chunk.  A delete or replace unpublishes the old dataset at once and then
retires it: its extents are freed now if no read holds it, else when the
last such read ends.  Without leases a batch that resolved the old dataset
just before a replace failed with "extent file ... is missing".
Nothing here imports grpc.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

from dlfs.server.core.directory import DatasetIndex


class ReadLeases:
    """Reads in flight per dataset id, and retired datasets waiting for them.

    `free(dataset_id)` removes a retired dataset's extents; it runs outside
    the lock, on the thread that ended the last read (or retired the
    dataset).  Thread-safe; every method is O(1).
    """

    def __init__(self, free: Callable[[int], None]):
        self._free = free
        self._lock = threading.Lock()
        self._reads: dict[int, int] = {}
        self._retired: set[int] = set()

    @contextlib.contextmanager
    def hold(self, resolve: Callable[[], DatasetIndex]) -> Iterator[DatasetIndex]:
        """The dataset `resolve()` returns, leased until the block ends.

        `resolve` runs under the lease lock, so a dataset unpublished before
        `retire` is called is either not found or leased: it cannot be
        freed between the lookup and the lease.  Raises what `resolve` raises.
        """
        with self._lock:
            dataset = resolve()
            self._reads[dataset.dataset_id] = self._reads.get(dataset.dataset_id, 0) + 1
        try:
            yield dataset
        finally:
            self._release(dataset.dataset_id)

    def retire(self, dataset_id: int) -> None:
        """Free an unpublished dataset's extents now, or when its last read ends."""
        with self._lock:
            if self._reads.get(dataset_id):
                self._retired.add(dataset_id)
                return
        self._free(dataset_id)

    def _release(self, dataset_id: int) -> None:
        with self._lock:
            left = self._reads.pop(dataset_id) - 1
            if left:
                self._reads[dataset_id] = left
                return
            if dataset_id not in self._retired:
                return
            self._retired.discard(dataset_id)
        self._free(dataset_id)
