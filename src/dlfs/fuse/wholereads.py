"""Small files read whole, in libfuse's worker threads, without a trip through trio.

A cold read of a small file (an image, a clip, a small array) is one
round trip to the daemon.  Answered on the trio thread it also cost four
hand-offs between threads (libfuse worker -> trio -> trio's worker thread
for the blocking call -> trio -> reply), which cost more than the round
trip itself (log-fuse.md).  Here the libfuse worker thread
that took the request makes the call itself (the GIL is released while it
waits on the socket) and answers.

A file of at most `whole_bytes_max` is fetched whole on its first read
(one round trip, CRC32C verified by the client) and kept until the kernel
has been handed all of its bytes in replies: the kernel reads a file in
pieces (Python's buffered `open()` starts with `st_blksize`, then the
kernel's read-ahead asks for the rest), and each later piece is a memory
copy, not a round trip.  Concurrent reads of one file wait for one fetch.
Bytes of complete files are bounded by `bytes_max` (least recently used
go first; a piece the kernel asks for later is fetched again).  At most
`waiting_max` reads wait for the daemon here at once; beyond that `read`
declines and the caller serves the read on the trio thread as before.

Thread-safe; every method is called from libfuse's worker threads.
"""

from __future__ import annotations

import collections
import threading
from typing import Callable

from dlfs import errors
from dlfs import limits as fuse_limits
from dlfs.fuse.errno_map import Stale
from dlfs.fuse.inodes import Node

# fetch(node) -> all bytes of node's sample, CRC32C verified; blocks.
FetchWhole = Callable[[Node], memoryview]


class _File:
    __slots__ = ("ready", "data", "error", "served")

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.data: memoryview | None = None
        self.error: errors.DlfsError | None = None
        self.served = 0  # bytes handed out in replies


class WholeReads:
    """Whole small files by node identity (inode and version), fetched once, dropped
    once fully served."""

    def __init__(self, fetch: FetchWhole, *,
                 whole_bytes_max: int = fuse_limits.mount_whole_sample_bytes_max,
                 bytes_max: int = fuse_limits.mount_whole_reads_bytes_max,
                 waiting_max: int = fuse_limits.mount_whole_reads_waiting_max):
        assert 0 < whole_bytes_max <= bytes_max and waiting_max > 0
        self._fetch = fetch
        self.whole_bytes_max = whole_bytes_max
        self.bytes_max = bytes_max
        self._lock = threading.Lock()
        # identity -> file, least recently used first; complete and in flight.
        self._files: collections.OrderedDict[int, _File] = collections.OrderedDict()
        self.bytes_held = 0  # of complete files
        self._waiting = threading.Semaphore(waiting_max)  # reads waiting for the daemon
        self.fetches = 0  # round trips made, for tests and benchmarks
        self.declined = 0  # reads left to the caller: `waiting_max` were waiting

    def __len__(self) -> int:
        return len(self._files)

    def handles(self, node: Node) -> bool:
        """Whether reads of `node` belong here (a file small enough to fetch whole)."""
        return not node.is_dir and node.size <= self.whole_bytes_max

    def read(self, node: Node, offset: int, size: int) -> memoryview | bytes | None:
        """Up to `size` bytes of `node` at `offset`: one round trip if the file is
        not held (or being fetched), else a slice.  Blocks.  None, at once,
        when the read would wait for the daemon while `waiting_max` reads
        already do: the caller serves it another way, so that libfuse's
        worker threads stay free for requests answered from memory (a frozen
        daemon must not stop `stat`).  Raises the fetch's DlfsError, or
        Stale if the daemon's sample is not the size the mount knows (the
        dataset was replaced)."""
        assert self.handles(node), node
        end = min(offset + size, node.size)
        if offset >= end:
            return b""
        with self._lock:
            file = self._files.get(node.identity)
            waits = file is None or not file.ready.is_set()
            if waits and not self._waiting.acquire(blocking=False):
                self.declined += 1
                return None
            owner = file is None
            if owner:
                file = self._files[node.identity] = _File()
                self.fetches += 1
            else:
                self._files.move_to_end(node.identity)
        try:
            if owner:
                self._fill(node, file)
            else:
                file.ready.wait()
        finally:
            if waits:
                self._waiting.release()
        if file.error is not None:
            raise file.error
        piece = file.data[offset:end]
        with self._lock:
            file.served += len(piece)
            if file.served >= node.size:  # the kernel has it all: its page cache serves it
                self._drop(node.identity, file)
        return piece

    def _fill(self, node: Node, file: _File) -> None:
        data: memoryview | None = None
        error: errors.DlfsError | None = None
        try:
            data = self._fetch(node)
            if len(data) != node.size:
                raise Stale(f"{node.dataset}/{node.path}: the daemon returned {len(data)} "
                            f"bytes where this mount expected {node.size}; the dataset was "
                            "replaced after it was mounted (reopen it after the cache timeout)")
            node.fetched_bytes += len(data)
        except errors.DlfsError as exc:
            data, error = None, exc
        finally:  # also on a bug below (then re-raised): waiters must not hang
            if data is None and error is None:
                error = errors.Internal(f"reading {node.dataset}/{node.path} failed in the "
                                        "mount (see its log)")
            with self._lock:
                file.error = error
                if error is not None:
                    self._drop(node.identity, file)  # the next read fetches again
                else:
                    file.data = data
                    self.bytes_held += len(data)
                    self._evict()
            file.ready.set()

    def _drop(self, identity: tuple[int, int], file: _File) -> None:
        """Forget `identity`'s file if it is still `file` (lock held)."""
        if self._files.get(identity) is file:
            del self._files[identity]
            if file.data is not None and file.error is None:
                self.bytes_held -= len(file.data)

    def _evict(self) -> None:
        """Drop complete files, least recently used first, until `bytes_max` holds
        (lock held).  O(files looked at)."""
        if self.bytes_held <= self.bytes_max:
            return
        for identity, file in list(self._files.items()):
            if file.data is not None:
                self._drop(identity, file)
                if self.bytes_held <= self.bytes_max:
                    return

    def check_invariants(self) -> None:
        """Assert the bookkeeping is consistent.  O(files); for tests."""
        with self._lock:
            assert self.bytes_held == sum(len(f.data) for f in self._files.values()
                                          if f.data is not None)
            assert 0 <= self.bytes_held
            for file in self._files.values():
                assert file.error is None
                assert file.data is None or file.served < len(file.data)
