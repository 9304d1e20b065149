"""The read-only file system: pyfuse3 requests translated to the mount's core.

Layout: with one dataset (`--dataset NAME`) the mount root is that dataset's
root; otherwise the root lists every sealed dataset as a directory.  Inside,
files and directories are the dataset's, with the sizes, modes and mtimes
kept at ingest.  Owner is the user who mounted; directories are
``dr-xr-xr-x`` with the dataset's creation time.

What each request costs:

- lookup: nothing if the node is in the inode table (every entry a listing
  returned is), else one Stat RPC; names under the root one GetDataset RPC.
- getattr: nothing (attributes live in the inode table).
- open / release: nothing (no RPC; `keep_cache` so the page cache stays
  valid across opens: samples are immutable).
- read: see `readcache` (one RPC per sample up to 8 MiB, else per run of
  1 MiB units, shared by concurrent readers and pushed ahead into the page
  cache; nothing once the page cache holds the bytes).
- opendir / readdir: one ListDir RPC per `dir_page_entries` entries.
- every write-ish request: EROFS (the mount is also read-only in the VFS).

Blocking calls run in worker threads (`trio.to_thread`, at most
`rpcs_in_flight_max` at once), never on the trio loop, so requests served
from memory are never queued behind the network.  Only `pyfuse3.FUSEError`
leaves a handler: DLFS errors become errno values through `errno_map`,
anything else is logged as a bug and becomes EIO.

Caching and staleness: sealed datasets are immutable, so the kernel keeps
entries, attributes and pages for `cache_timeout_s` (default one hour) and
missing names inside a dataset as negative entries for as long.  Dataset
names at the root are re-checked after `dataset_entry_timeout_s`; a dataset
replaced under the same name then shows up as new directory (new inodes).
A dataset deleted or replaced while files of it are open or cached is
served stale until the caches expire; reads that reach the daemon fail with
ESTALE.  With `--dataset` the root cannot change, so a replacement there
needs a remount.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import logging
import os
import stat
import time
from typing import Any, Callable

import pyfuse3
import trio

from dlfs import errors
from dlfs.client.convert import DatasetInfo, Entry
from dlfs.fuse import errno_map
from dlfs import limits as fuse_limits
from dlfs.fuse.backend import Backend
from dlfs.fuse.dirlist import Child, DirStream
from dlfs.fuse.inodes import ROOT_KEY, Attrs, InodeTable, Key, Node
from dlfs.fuse.readcache import ReadCache
from dlfs.paths import check_dataset_name, check_sample_path

log = logging.getLogger(__name__)

DIR_MODE = stat.S_IFDIR | 0o555
_STATFS_FRAGMENT_BYTES = 4096  # unit of f_blocks in statfs


def dataset_attrs(info: DatasetInfo) -> Attrs:
    return Attrs(True, 0, DIR_MODE, info.created_ns)


def dataset_key(info: DatasetInfo) -> Key:
    """The key of a dataset's root: its name and version.  The version is its
    generation, or, for a striped dataset from before generations (0), minus
    its creation time: a replaced dataset gets new nodes either way."""
    return (info.name, info.generation or -info.created_ns, "")


def read_generation(node: Node) -> int:
    """The generation reads of `node` name (0, "any", when its dataset has none)."""
    return max(node.key[1], 0)


def entry_attrs(entry: Entry) -> Attrs:
    return Attrs(entry.is_dir, entry.size, entry.mode, entry.mtime_ns)


class _FailureLog:
    """Logs failures at most once per `interval_s` per kind, with a count of
    the ones held back, so a dead daemon gives a few lines, not one per read."""

    def __init__(self, interval_s: float = fuse_limits.mount_error_log_interval_s):
        self.interval_s = interval_s
        self._last: dict[str, tuple[float, int]] = {}

    def __call__(self, level: int, kind: str, message: str) -> None:
        now = time.monotonic()
        last, held = self._last.get(kind, (-self.interval_s, 0))
        if now - last < self.interval_s:
            self._last[kind] = (last, held + 1)
            return
        self._last[kind] = (now, 0)
        suffix = f" ({held} more like it in the last {now - last:.0f} s)" if held else ""
        log.log(level, "%s%s", message, suffix)


def _handler(*, on_handle: bool = False) -> Callable:
    """Wrap a request handler so that only `pyfuse3.FUSEError` escapes it.

    `on_handle`: the request names an open file or directory (NotFound then
    means it vanished under the mount: ESTALE).
    """

    def wrap(method: Callable) -> Callable:
        name = method.__name__

        @functools.wraps(method)
        async def handle(self: "DlfsOperations", *args: Any) -> Any:
            try:
                return await method(self, *args)
            except pyfuse3.FUSEError:
                raise
            except errors.DlfsError as exc:
                number = errno_map.errno_for(exc, on_handle=on_handle)
                self._report(name, exc, number)
                raise pyfuse3.FUSEError(number) from None
            except Exception:
                log.exception("%s%r failed unexpectedly (a bug in dlfs-mount); returning EIO",
                              name, args[:2])
                raise pyfuse3.FUSEError(errno.EIO) from None

        return handle

    return wrap


class DlfsOperations(pyfuse3.Operations):
    """pyfuse3 operations of a read-only DLFS mount.

    `root_key`/`root_attrs` name the mount root: `ROOT_KEY` for a mount of
    every dataset, a dataset's key for a mount of one.  Call `start(nursery)`
    inside the trio run before serving.
    """

    supports_dot_lookup = False  # no NFS export: the kernel asks for '..' only in lookups
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, backend: Backend, root_key: Key, root_attrs: Attrs, *,
                 cache_timeout_s: float = fuse_limits.mount_cache_timeout_s_default,
                 dataset_entry_timeout_s: float = fuse_limits.mount_dataset_entry_timeout_s,
                 rpcs_in_flight_max: int = fuse_limits.mount_rpcs_in_flight_max):
        super().__init__()
        self.backend = backend
        self.cache_timeout_s = cache_timeout_s
        self.dataset_entry_timeout_s = min(dataset_entry_timeout_s, cache_timeout_s)
        self.table = InodeTable(root_key, root_attrs, idle_max=fuse_limits.mount_idle_inodes_max)
        self.multi = root_key == ROOT_KEY
        self.uid = os.getuid()
        self.gid = os.getgid()
        self._limiter = trio.CapacityLimiter(rpcs_in_flight_max)
        self._store_limiter = trio.CapacityLimiter(fuse_limits.mount_stores_in_flight_max)
        self._handles = itertools.count(1)
        self._files: dict[int, Node] = {}
        self._datasets: dict[str, Key] = {}  # name -> key of its latest generation seen
        self._dirs: dict[int, DirStream] = {}
        self._cache: ReadCache | None = None
        self._statfs_last: tuple[int, int] = (0, 0)
        self._report_failure = _FailureLog()

    def start(self, nursery: trio.Nursery) -> None:
        """Bind to the nursery that runs background read-ahead."""
        self._cache = ReadCache(self._fetch_whole, self._fetch_range, nursery, self._store)

    @property
    def cache(self) -> ReadCache:
        assert self._cache is not None, "call start(nursery) before serving"
        return self._cache

    # --- metadata --------------------------------------------------------------------

    @_handler()
    async def lookup(self, parent_inode: int, name: bytes, ctx=None) -> pyfuse3.EntryAttributes:
        parent = self._node(parent_inode)
        text = self._decode(name)
        if text == ".":
            node = parent
        elif text == "..":
            node = await self._parent(parent)
        else:
            node = await self._child(parent, text)
            if node is None:  # cached by the kernel as a negative entry
                attributes = pyfuse3.EntryAttributes()
                attributes.st_ino = 0
                attributes.entry_timeout = self.cache_timeout_s
                return attributes
        self.table.ref(node)
        return self._attributes(node)

    @_handler()
    async def getattr(self, inode: int, ctx=None) -> pyfuse3.EntryAttributes:
        return self._attributes(self._node(inode))

    async def forget(self, inode_list) -> None:
        for inode, count in inode_list:
            self.table.forget(inode, count)

    @_handler()
    async def statfs(self, ctx) -> pyfuse3.StatvfsData:
        try:
            if self.multi:
                infos = await self._thread(self.backend.sealed_datasets)
            else:
                infos = [await self._thread(self.backend.dataset, self.table.root.dataset)]
            self._statfs_last = (sum(i.bytes for i in infos), sum(i.samples for i in infos))
        except errors.DlfsError as exc:  # df should still work: report what we knew
            self._report("statfs", exc, errno.EIO)
        total_bytes, samples = self._statfs_last
        result = pyfuse3.StatvfsData()
        result.f_bsize = fuse_limits.mount_block_bytes
        result.f_frsize = _STATFS_FRAGMENT_BYTES
        result.f_blocks = -(-total_bytes // _STATFS_FRAGMENT_BYTES)
        result.f_bfree = result.f_bavail = 0
        result.f_files = samples
        result.f_ffree = result.f_favail = 0
        result.f_namemax = 255
        return result

    # --- files -------------------------------------------------------------------------

    @_handler()
    async def open(self, inode: int, flags: int, ctx) -> pyfuse3.FileInfo:
        node = self._node(inode)
        if flags & os.O_ACCMODE != os.O_RDONLY:
            raise pyfuse3.FUSEError(errno.EROFS)
        if node.is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        fh = next(self._handles)
        self._files[fh] = node
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    @_handler(on_handle=True)
    async def read(self, fh: int, offset: int, size: int):
        node = self._files.get(fh)
        if node is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        return await self.cache.read(node, offset, size)

    async def flush(self, fh: int) -> None:
        # Nothing is ever dirty.  ENOSYS makes the kernel stop sending FLUSH on
        # every close(), saving a round trip per file.
        raise pyfuse3.FUSEError(errno.ENOSYS)

    async def fsync(self, fh: int, datasync: bool) -> None:
        return None  # nothing to write back; succeed as a read-only ext4 file does

    async def release(self, fh: int) -> None:
        self._files.pop(fh, None)

    # --- directories ----------------------------------------------------------------------

    @_handler()
    async def opendir(self, inode: int, ctx) -> int:
        node = self._node(inode)
        if not node.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        fetch = self._fetch_datasets if (self.multi and node is self.table.root) else \
            functools.partial(self._fetch_children, node)
        fh = next(self._handles)
        self._dirs[fh] = DirStream(fetch, fuse_limits.mount_dir_page_entries)
        return fh

    @_handler(on_handle=True)
    async def readdir(self, fh: int, start_id: int, token) -> None:
        stream = self._dirs.get(fh)
        if stream is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        async with contextlib.aclosing(stream.entries_from(start_id)) as entries:
            async for next_id, child in entries:
                node = self.table.node_for(child.key, lambda: child.attrs)
                if not pyfuse3.readdir_reply(token, child.name.encode(), self._attributes(node),
                                             next_id):
                    return
                self.table.ref(node)

    async def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    # --- everything that would change a dataset ---------------------------------------------

    async def _read_only(self, *_args: Any) -> Any:
        raise pyfuse3.FUSEError(errno.EROFS)

    setattr = mknod = mkdir = unlink = rmdir = symlink = rename = link = write = create = \
        setxattr = removexattr = _read_only

    # --- internals ----------------------------------------------------------------------------

    async def _thread(self, function: Callable, *args: Any) -> Any:
        """Run a blocking backend call in a worker thread (bounded by the limiter)."""
        return await trio.to_thread.run_sync(function, *args, limiter=self._limiter,
                                             abandon_on_cancel=True)

    async def _fetch_whole(self, node: Node) -> memoryview:
        return await self._thread(self.backend.read, node.dataset, node.path, 0, 0,
                                  read_generation(node))

    async def _fetch_range(self, node: Node, offset: int, length: int,
                           deliver: Callable[[int, memoryview], None]) -> int:
        token = trio.lowlevel.current_trio_token()

        def deliver_on_loop(position: int, piece: memoryview) -> None:  # in the worker thread
            trio.from_thread.run_sync(deliver, position, piece, trio_token=token)

        return await self._thread(self.backend.read_chunks, node.dataset, node.path, offset,
                                  length, deliver_on_loop, read_generation(node))

    async def _store(self, node: Node, offset: int, data: memoryview) -> None:
        # Copies into the page cache; may wait for pages the kernel is reading.
        await trio.to_thread.run_sync(pyfuse3.notify_store, node.inode, offset, data,
                                      limiter=self._store_limiter, abandon_on_cancel=True)

    async def _fetch_children(self, parent: Node, start_after: str, count: int
                              ) -> tuple[list[Child], bool]:
        entries, more = await self._thread(self.backend.list_page, parent.dataset, parent.path,
                                           start_after, count)
        return [Child(e.name, parent.child_key(e.name), entry_attrs(e)) for e in entries], more

    async def _fetch_datasets(self, start_after: str, count: int) -> tuple[list[Child], bool]:
        infos = [i for i in await self._thread(self.backend.sealed_datasets)
                 if i.name > start_after]
        return ([Child(i.name, dataset_key(i), dataset_attrs(i)) for i in infos[:count]],
                len(infos) > count)

    def _node(self, inode: int) -> Node:
        try:
            return self.table.get(inode)
        except KeyError:
            log.error("the kernel asked for inode %d, which this mount does not know", inode)
            raise pyfuse3.FUSEError(errno.ESTALE) from None

    @staticmethod
    def _decode(name: bytes) -> str:
        try:
            return name.decode("utf-8")
        except UnicodeDecodeError:  # DLFS paths are UTF-8: such a name cannot exist
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    async def _child(self, parent: Node, name: str) -> Node | None:
        """The node of `name` in directory `parent`; None if it does not exist
        (inside a dataset, where absence is permanent)."""
        if not parent.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if self.multi and parent is self.table.root:
            try:
                check_dataset_name(name)
            except errors.InvalidArgument:
                raise pyfuse3.FUSEError(errno.ENOENT) from None
            try:
                info = await self._thread(self.backend.dataset, name)  # new or replaced?
            except errno_map.DAEMON_DOWN:
                # Revalidating a dataset while the daemon is away: keep serving
                # what the kernel has cached rather than failing every path.
                node = self.table.find(self._datasets.get(name, ROOT_KEY))
                if node is None or node is self.table.root:
                    raise
                return node
            self._datasets[name] = dataset_key(info)
            return self.table.node_for(dataset_key(info), lambda: dataset_attrs(info))
        key = parent.child_key(name)
        node = self.table.find(key)
        if node is not None:
            return node
        try:
            check_sample_path(key[2])
        except errors.InvalidArgument:
            if len(name.encode()) > 255 or len(key[2].encode()) > 4096:
                raise pyfuse3.FUSEError(errno.ENAMETOOLONG) from None
            return None
        try:
            entry = await self._thread(self.backend.stat, parent.dataset, key[2])
        except errors.NotFound:
            return None
        return self.table.node_for(key, lambda: entry_attrs(entry))

    async def _parent(self, node: Node) -> Node:
        if node is self.table.root:
            return node
        dataset, generation, path = node.key
        if not path:  # a dataset root below the mount root
            return self.table.root
        parent_key = (dataset, generation, path.rpartition("/")[0])
        if parent_key == self.table.root.key:
            return self.table.root
        parent = self.table.find(parent_key)
        if parent is None:
            entry = await self._thread(self.backend.stat, dataset, parent_key[2])
            parent = self.table.node_for(parent_key, lambda: entry_attrs(entry))
        return parent

    def _attributes(self, node: Node) -> pyfuse3.EntryAttributes:
        attributes = pyfuse3.EntryAttributes()
        attributes.st_ino = node.inode
        attributes.st_mode = node.mode
        attributes.st_nlink = 1  # directories too: "count unknown", so find never prunes
        attributes.st_uid = self.uid
        attributes.st_gid = self.gid
        attributes.st_size = node.size
        attributes.st_blksize = fuse_limits.mount_block_bytes
        attributes.st_blocks = -(-node.size // 512)
        attributes.st_atime_ns = attributes.st_mtime_ns = attributes.st_ctime_ns = node.mtime_ns
        attributes.attr_timeout = self.cache_timeout_s
        attributes.entry_timeout = (self.dataset_entry_timeout_s
                                    if self.multi and node.is_dir and not node.path
                                    else self.cache_timeout_s)
        return attributes

    def _report(self, handler: str, exc: errors.DlfsError, number: int) -> None:
        if isinstance(exc, errors.NotFound) and number == errno.ENOENT:
            return  # an ordinary answer, not a failure
        kind = f"{handler}:{type(exc).__name__}"
        level = logging.ERROR if isinstance(exc, errno_map.DAEMON_DOWN) else logging.WARNING
        self._report_failure(level, kind, f"{handler} failed with {errno.errorcode[number]} "
                                          f"(daemon {self.backend.address}): {exc}")
