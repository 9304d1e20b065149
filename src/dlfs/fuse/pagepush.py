"""Push a mounted dataset's small files into the kernel's page cache, in large batches.

Once the daemon has warmed a dataset, a random first epoch through the
mount still costs one FUSE request and one daemon round trip per file:
on two cores that DLIO's decoding workers already fill, that alone kept
the mount's first epoch well below ext4 (docs/DESIGN.md, "The FUSE mount").
After the first
read of a `--dataset` mount, this fetches the files the kernel knows (a
reader listed them) in sample-id order, `batch_samples_max` per get_batch,
and copies each into the kernel's page cache (`notify_store`): a file the
reader opens later is a page-cache hit, as on a warm ext4.

Larger files (over `whole_bytes_max`: DLIO's NPZ volumes, say) follow the
small ones, each fetched in ranged reads of `piece_bytes` (block CRCs
verified) and stored piece by piece (on the daemon's host spliced from the
extent's pages instead: `from_extent`, fuse/splicereads.py): a first epoch
over them otherwise runs every byte through the mount's own read path,
several times slower than a batched fetch (log-fuse.md).

Bounded: at most half the daemon's warm-up budget (its page cache holds
the extents too; a daemon with warm-ups off gets no push), one batch or
piece in flight.  The kernel decides what stays.  A file the reader asks for before
its push is read as usual (and then skipped by the push).  A
failure (the daemon away, the dataset replaced) ends the push with one log
line; reads go on as before.  Runs as a task on the mount's trio loop; its
blocking calls run in threads, where waiting for a page the kernel is
reading is harmless.

Files that readers had fetched whole before the push reaches them are
skipped (`Node.fetched_bytes`): in a random first epoch the readers and the
push meet about half way, and each such file would otherwise cost a second
fetch from the daemon and a second copy into the page cache.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Awaitable, Callable

import trio

from dlfs import errors
from dlfs import limits as fuse_limits
from dlfs.fuse.inodes import Node

log = logging.getLogger(__name__)

# fetch(nodes) -> their bytes, CRC32C verified, one round trip; blocks.
FetchBatch = Callable[[list[Node]], list[memoryview]]
# fetch_range(node, offset, length) -> those bytes of one file, verified; blocks.
FetchRange = Callable[[Node, int, int], memoryview]
# store(node, offset, data): copy into the kernel's page cache of node; blocks.
StorePages = Callable[[Node, int, memoryview], None]
# from_extent(node, offset, length) -> done: the same bytes straight from the daemon's
# extent pages (a co-located mount: splicereads.py), verified; False: fetch them.
StoreFromExtent = Callable[[Node, int, int], bool]


class PagePush:
    """One push per mount, started once the first read was answered (`notice_read`,
    any thread)."""

    def __init__(self, files: Callable[[], list[Node]], budget_bytes: Callable[[], int],
                 fetch: FetchBatch, fetch_range: FetchRange, store: StorePages,
                 run_thread: Callable[..., Awaitable], *,
                 whole_bytes_max: int = fuse_limits.mount_whole_sample_bytes_max,
                 batch_samples_max: int = fuse_limits.mount_push_batch_samples_max,
                 batch_bytes_max: int = fuse_limits.mount_push_batch_bytes_max,
                 piece_bytes: int = fuse_limits.mount_push_piece_bytes,
                 from_extent: StoreFromExtent | None = None):
        assert 0 < whole_bytes_max <= batch_bytes_max and batch_samples_max > 0
        assert piece_bytes > 0
        self._files = files  # on the trio thread: the kernel-known files to push
        self._budget_bytes = budget_bytes  # blocking: the daemon's warm-up budget
        self._fetch = fetch
        self._fetch_range = fetch_range
        self._store = store
        self._from_extent = from_extent
        self._run_thread = run_thread
        self.whole_bytes_max = whole_bytes_max
        self.batch_samples_max = batch_samples_max
        self.batch_bytes_max = batch_bytes_max
        self.piece_bytes = piece_bytes
        self._first_read = threading.Event()
        self.pushed_files = 0
        self.pushed_bytes = 0

    def notice_read(self) -> None:
        """A read was answered (cheap after the first call)."""
        if not self._first_read.is_set():
            self._first_read.set()

    async def run(self) -> None:
        """Wait for the first read, then push once.  Runs until done or cancelled."""
        await trio.to_thread.run_sync(self._first_read.wait, abandon_on_cancel=True)
        started = time.monotonic()
        try:
            budget = await self._run_thread(self._budget_bytes) // 2
            nodes = self._files()
            batches = self._batches(nodes, budget)
            for batch in batches:
                batch = [n for n in batch if not self._fetched(n)]
                if batch:
                    datas = await self._run_thread(self._fetch, batch)
                    await self._run_thread(self._store_all, batch, datas)
            left = budget - sum(n.size for batch in batches for n in batch)
            for node in self._large(nodes, left):
                if not self._fetched(node):
                    await self._run_thread(self._push_large, node)
        except errors.DlfsError as exc:
            log.warning("pushing files into the page cache stopped after %d files: %s",
                        self.pushed_files, exc)
            return
        log.info("pushed %d files (%.0f MiB) into the page cache in %.1f s", self.pushed_files,
                 self.pushed_bytes / 2**20, time.monotonic() - started)

    @staticmethod
    def _fetched(node: Node) -> bool:
        """A reader had the whole file fetched already (its pages are in the kernel's
        cache, or were): pushing it again would only repeat the copies."""
        return node.fetched_bytes >= node.size

    def _batches(self, nodes: list[Node], budget: int) -> list[list[Node]]:
        """Small files in sample-id order, cut into batches, within `budget` bytes."""
        small = sorted((n for n in nodes if n.sample_id >= 0 and 0 < n.size <= self.whole_bytes_max),
                       key=lambda n: n.sample_id)
        batches: list[list[Node]] = []
        batch: list[Node] = []
        batch_bytes = total = 0
        for node in small:
            if total + node.size > budget:
                break
            if batch and (len(batch) == self.batch_samples_max or
                          batch_bytes + node.size > self.batch_bytes_max):
                batches.append(batch)
                batch, batch_bytes = [], 0
            batch.append(node)
            batch_bytes += node.size
            total += node.size
        if batch:
            batches.append(batch)
        return batches

    def _large(self, nodes: list[Node], budget: int) -> list[Node]:
        """Files over `whole_bytes_max` in sample-id order, within `budget` bytes."""
        large = sorted((n for n in nodes if n.sample_id >= 0 and n.size > self.whole_bytes_max),
                       key=lambda n: n.sample_id)
        chosen, total = [], 0
        for node in large:
            if total + node.size > budget:
                break
            chosen.append(node)
            total += node.size
        return chosen

    def _push_large(self, node: Node) -> None:
        """One large file, piece by piece (a reader may read it meanwhile: harmless)."""
        for offset in range(0, node.size, self.piece_bytes):
            length = min(self.piece_bytes, node.size - offset)
            try:
                if self._from_extent is not None and self._from_extent(node, offset, length):
                    self.pushed_bytes += length
                    continue
            except OSError:  # the kernel forgot the inode: nothing to fill
                return
            data = self._fetch_range(node, offset, length)
            if len(data) != length:
                raise errors.FailedPrecondition(
                    f"{node.dataset}/{node.path} has a different size at the daemon than in "
                    "this mount: the dataset was replaced")
            try:
                self._store(node, offset, data)
            except OSError:  # the kernel forgot the inode: nothing to fill
                return
            self.pushed_bytes += length
        self.pushed_files += 1

    def _store_all(self, nodes: list[Node], datas: list[memoryview]) -> None:
        for node, data in zip(nodes, datas):
            if len(data) != node.size:
                raise errors.FailedPrecondition(
                    f"{node.dataset}/{node.path} has {len(data)} bytes at the daemon, "
                    f"{node.size} in this mount: the dataset was replaced")
            try:
                self._store(node, 0, data)
            except OSError:  # the kernel forgot the inode: nothing to fill
                continue
            self.pushed_files += 1
            self.pushed_bytes += len(data)
