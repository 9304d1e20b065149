"""The daemon as the mount sees it: blocking calls over one `dlfs.Client`.

Everything here blocks (gRPC) and is thread-safe; the file system calls it
from worker threads only (`trio.to_thread`), never on the trio loop.  Each
call is one round trip with the client's deadline and UNAVAILABLE retry
(bounded by `reconnect_timeout_s`), so a dead daemon turns into
`dlfs.Unavailable` after that long, never a hang.

The backend also notices when the daemon goes away and comes back and logs
one line for each transition, naming the daemon's address.  `calls` counts
the calls made, by method (the mount logs them with its request counts).

Reconnecting after a long outage is prompt because `Client` caps gRPC's
reconnect backoff (`limits.reconnect_backoff_max_s`).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, TypeVar

from dlfs import errors
from dlfs import limits as fuse_limits
from dlfs.client import (Client, DaemonStatus, DatasetInfo, DirectReader, Entry, FileWriter,
                         SampleKey, open_writer)
from dlfs.fuse.errno_map import DAEMON_DOWN

log = logging.getLogger(__name__)
T = TypeVar("T")


class Backend:
    """Blocking access to one daemon, or to a cluster found in `etcd`.  Create it
    in the process that serves the mount (after any fork): it opens a gRPC
    channel."""

    def __init__(self, address: str | None, *, etcd: str | None = None,
                 cluster: str | None = None,
                 reconnect_timeout_s: float = fuse_limits.mount_reconnect_timeout_s_default,
                 metadata_timeout_s: float = fuse_limits.mount_metadata_timeout_s_default,
                 read_timeout_s: float = fuse_limits.mount_read_timeout_s_default):
        self.client = Client(address, etcd=etcd, cluster=cluster, timeout_s=metadata_timeout_s,
                             batch_timeout_s=read_timeout_s,
                             reconnect_timeout_s=reconnect_timeout_s)
        self.address = self.client.address
        # Co-located reads of the extents (splicereads.py): made at the first use.
        self._direct_options = dict(timeout_s=metadata_timeout_s, batch_timeout_s=read_timeout_s,
                                    reconnect_timeout_s=reconnect_timeout_s)
        self._direct: Client | None = None
        self._lock = threading.Lock()
        self._down_since: float | None = None
        # The daemon answered once: until then a failure is the mount's start failing
        # (its caller says so), not a mount whose reads fail with EIO.
        self._answered = False
        self.calls: collections.Counter[str] = collections.Counter()

    def cli_options(self) -> list[str]:
        """The `dlfs` options that reach what this backend reads: ["--server", ADDR], or
        ["--etcd", URLS, "--cluster", NAME] (for advice printed as a command)."""
        etcd = self.client.options.get("etcd")
        if not etcd:
            return ["--server", self.address]
        urls = etcd if isinstance(etcd, str) else ",".join(etcd)
        return ["--etcd", urls, "--cluster", str(self.client.options["cluster"])]

    def close(self) -> None:
        self.client.close()
        if self._direct is not None:
            self._direct.close()

    def extent_reader(self, dataset: str) -> DirectReader:
        """The dataset's extents, mapped from descriptors the daemon passes over its Unix
        socket (`Client.extent_reader`).  Raises FailedPrecondition or
        PermissionDenied when this process cannot have them (another host, TLS, a
        foreign user without a token)."""
        if self.client.options.get("etcd"):
            raise errors.FailedPrecondition("a cluster mount reads through its members, not "
                                            "from one daemon's extents")
        with self._lock:
            if self._direct is None:
                self._direct = Client(self.address, direct=True, **self._direct_options)
            direct = self._direct
        # A daemon call (OPEN_DATASET the first time): counted, and its failures say the
        # daemon is down as every call's do.
        return self._run("extent_reader", lambda _c: direct.extent_reader(dataset))

    def reserve_reply_buffers(self, size: int, count: int) -> int:
        """Fault in `count` reply buffers of `size` bytes for the data path's
        replies (none over gRPC, which allocates its own); returns how many."""
        pool = self.client.reply_buffers
        return pool.reserve(size, count) if pool is not None else 0

    # --- calls (each one round trip) ------------------------------------------------

    def status(self) -> DaemonStatus:
        """The daemon's status (its data dir's free space, its spaces' files)."""
        return self._run("status", lambda c: c.status())

    def sealed_datasets(self) -> list[DatasetInfo]:
        """Summaries of the sealed datasets, sorted by name."""
        return [i for i in self._run("datasets", lambda c: c.dataset_infos()) if i.sealed]

    def dataset(self, name: str) -> DatasetInfo:
        """Summary of dataset `name`.  Raises NotFound (also while it is being
        ingested: an unsealed dataset cannot be read)."""
        info = self._run("dataset", lambda c: c.dataset(name)).info
        if not info.sealed:
            raise errors.NotFound(f"dataset {name!r} is still being ingested")
        return info

    def stat(self, dataset: str, path: str, generation: int) -> Entry:
        """Entry of a file or directory of `dataset` ("" is its root), of version
        `generation` (0: the current one).  Raises NotFound, StaleGeneration."""
        return self._run("stat", lambda c: c.stat(dataset, path, generation=generation))

    def list_page(self, dataset: str, path: str, start_after: str, page_size: int,
                  generation: int) -> tuple[list[Entry], bool]:
        """Entries of a directory of version `generation` (as `stat`) after name
        `start_after`, at most `page_size` of them, in name order; and whether
        more follow.  Raises NotFound, InvalidArgument (not a directory),
        StaleGeneration."""
        return self._run("list_page", lambda c: c.list_page(dataset, path, start_after,
                                                          page_size, generation=generation))

    def read(self, dataset: str, sample: SampleKey, offset: int, length: int,
             generation: int = 0) -> memoryview:
        """`length` bytes at `offset` of a sample (0: to the end; from 0 the
        whole sample, CRC32C verified), of version `generation` (0: the
        current one).  `sample` is its path, or its id (no Lookup first:
        name the generation then, ids are per version).  Raises NotFound,
        DataCorruption, StaleGeneration."""
        return self._run("read", lambda c: c.read(dataset, sample, offset, length,
                                                  generation=generation))

    def read_batch(self, dataset: str, ids: list[int], generation: int) -> list[memoryview]:
        """Whole samples `ids` of version `generation`, CRC32C verified; one round trip.
        Raises NotFound, DataCorruption, StaleGeneration."""
        return self._run("read_batch", lambda c: c.get_batch(ids, dataset=dataset,
                                                             generation=generation))

    def warm_budget_bytes(self, dataset: str) -> int:
        """The smallest warm-up budget of the daemons warming `dataset` now or
        before (bytes), or 0 if any of them does not (never asked to, or
        stopped, failed, warm-ups off)."""
        infos = self._run("warm_status", lambda c: c.warm_status(dataset))
        if any(i.state in ("none", "stopped", "failed") for i in infos):
            return 0
        return min((i.budget_bytes for i in infos), default=0)

    def read_chunks(self, dataset: str, sample: SampleKey, offset: int, length: int,
                    deliver: Callable[[int, memoryview], None], generation: int = 0) -> int:
        """Stream `length` bytes at `offset` of a sample; returns how many came.

        Calls `deliver(position, chunk)` for each piece as it arrives, in
        order, `position` counted from `offset`: one round trip, no copy into
        a reply-sized buffer (unlike `read`), so a large range costs one RPC
        and reaches the caller piece by piece.  The daemon verifies every
        piece before sending it (the CRC32C of each block it touches, see
        dlfs.formats.block_crcs; for datasets ingested before block CRCs, nothing), so
        a damaged block ends the stream with DataCorruption after the pieces
        before it.  UNAVAILABLE before the first piece is retried like every
        read; a stream that breaks later raises.  Raises what `read` does.
        """
        def stream(client: Client) -> int:
            received = 0
            for position, chunk in client.read_chunks(dataset, sample, offset, length,
                                                      generation=generation):
                deliver(position, chunk)
                received = position + len(chunk)
            return received

        return self._run("read_chunks", stream)

    # --- checkpoint spaces (one daemon's; each change durable when it returns) ----------

    @property
    def writable(self) -> bool:
        """Whether checkpoint spaces can be written through this backend: one daemon
        (a cluster mount reads through its members only)."""
        return not self.client.options.get("etcd")

    def create_space(self, name: str) -> DatasetInfo:
        """Create the empty checkpoint space `name`.  Raises AlreadyExists,
        InvalidArgument, PermissionDenied."""
        return self._run("create_space", lambda c: _control(c).create_space(name))

    def delete_space(self, name: str) -> None:
        """Remove checkpoint space `name` with everything in it.  Raises NotFound."""
        self._run("delete_space", lambda c: _control(c).delete_dataset(name))

    def make_dir(self, space: str, path: str, mode: int) -> Entry:
        """Create directory `path` of `space`.  Raises AlreadyExists, NotFound (its
        parent), NotADirectory."""
        return self._run("make_dir", lambda c: _control(c).make_dir(space, path, mode))

    def remove(self, space: str, path: str, *, directory: bool) -> None:
        """unlink (`directory` False) or rmdir `path` of `space`.  Raises NotFound,
        IsADirectory, NotADirectory, DirectoryNotEmpty."""
        self._run("remove", lambda c: _control(c).remove(space, path, directory=directory))

    def rename(self, space: str, path: str, target: str) -> None:
        """Move `path` of `space` to `target` atomically, replacing a file there.
        Raises NotFound, Busy (being written), IsADirectory, NotADirectory,
        DirectoryNotEmpty, InvalidArgument."""
        self._run("rename", lambda c: _control(c).rename(space, path, target))

    def file_writer(self, space: str, path: str, flags: int, mode: int) -> FileWriter:
        """`path` of `space` open for writing on a data-path connection of its own
        (`datapath_writes` OPEN_* `flags`).  Raises what FileWriter raises."""
        return self._run("file_open", lambda c: open_writer(c.transport, space, path, flags,
                                                             mode))

    @property
    def down(self) -> bool:
        """Whether the daemon failed to answer since its last answer."""
        return self._down_since is not None

    def call_counts(self) -> dict[str, int]:
        """Calls made to the daemon so far, by kind: a copy (the metrics read it)."""
        with self._lock:
            return dict(self.calls)

    # --- internals ---------------------------------------------------------------------

    def _run(self, kind: str, call: Callable[[Client], T]) -> T:
        with self._lock:
            self.calls[kind] += 1
        try:
            result = call(self.client)
        except DAEMON_DOWN as exc:
            if self._answered:
                self._went_down(exc)
            raise
        self._answered = True
        self._came_back()
        return result

    def _went_down(self, exc: errors.DlfsError) -> None:
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
        log.error("DLFS daemon at %s is not answering; reads through the mount fail with EIO "
                  "until it is back (%s: %s)", self.address, type(exc).__name__, exc)

    def _came_back(self) -> None:
        if self._down_since is None:  # fast path, no lock: the common case
            return
        with self._lock:
            since, self._down_since = self._down_since, None
        if since is not None:
            log.warning("DLFS daemon at %s answers again after %.1f s; the mount serves again",
                        self.address, time.monotonic() - since)


def _control(client: Client):
    """The one daemon's control calls (spaces live on one daemon)."""
    control = getattr(client.transport, "control", None)
    if control is None:
        raise errors.ReadOnly("checkpoint spaces are written through a mount of one daemon, "
                              "not of a cluster")
    return control
