"""The file system: FUSE low-level requests answered from the mount's core.

Layout: with one dataset (`--dataset NAME`) the mount root is that dataset's
root; otherwise the root lists every sealed dataset and every checkpoint
space as a directory.  Inside, files and directories are the dataset's,
with the sizes, modes and mtimes kept at ingest, or the space's as they
are now.  Owner is the user who mounted; a dataset's directories are
``dr-xr-xr-x`` with the dataset's creation time.

Writable: the checkpoint spaces of a mount of every dataset of one daemon
(no `--dataset`, no `--etcd`); `mkdir MNT/NAME` makes a space, `rmdir` of
an empty one removes it.  Files of a space are created, written, synced,
truncated, renamed and removed as on a local disk (space_files.py says
what each request does, space_names.py how a space's names are found and
cached); datasets answer every change with EROFS, and what a space does
not keep (links, special files, modes, owners, explicit times, xattrs,
fallocate modes) with EPERM or EOPNOTSUPP.  A mount with `--dataset` or
`--etcd` is read-only, in the VFS too.

What each request costs (requests reach this process only when the kernel
has no answer cached):

- lookup (`names`): in a dataset nothing if the node is in the inode table
  (every entry a listing returned is), answered by the libfuse worker
  thread that took it; else, the first time in a directory, one ListDir
  page that brings the whole directory into the table if it fits
  (`siblings`), and one Stat RPC if the name is still unknown; names
  under the root one GetDataset RPC; names in a space one Stat RPC.
- getattr: nothing (attributes live in the inode table; a file this mount
  writes has the size its writers have).
- open: a dataset's file: answered by the libfuse worker thread from
  memory, with its pages kept across opens and no FLUSH at close; its
  RELEASE too (docs/DESIGN.md, "The mount's writes", has what that
  costs).  A read-only mount answers the first OPEN with ENOSYS instead,
  which tells the kernel (FUSE no-open support) to stop sending OPEN,
  FLUSH and RELEASE for files altogether: an `open()` of a file whose name
  is cached costs no request at all, and reads name the file by inode.  A
  space's file: one Stat (reading: is it still the version the kernel
  has?) or a data-path connection of its own (writing).
- read: a file up to 8 MiB: read whole on its first read by the libfuse
  worker thread that took the request (`wholereads`): on the daemon's host
  from the mapped extent, checked there (`extentreads`, no RPC; datasets
  only), else one RPC; larger files: on the daemon's host, spliced from the
  extent's pages by that worker thread (`splicereads`, no RPC), else see
  `readcache` (one RPC per run of 1 MiB units, shared by concurrent readers
  and pushed ahead into the page cache).  Nothing once the page cache holds
  the bytes.  With one dataset mounted, the first read answered also
  starts `pagepush`: the listed small files go into the page cache in
  get_batch batches, so a later first read of them costs nothing.  A read
  through a descriptor open for writing: one FILE_READ on its connection.
- write, flush, fsync, ftruncate of a space's file: in the libfuse worker
  thread that took it, on the file's own connection (a write: sent, not
  waited for; flush and fsync: one commit round trip).
- mkdir, rmdir, unlink, rename: one RPC each, durable when answered (rmdir
  of a space at the root and a RENAME_NOREPLACE check first: one more or two).
- opendir / readdirplus: one ListDir RPC per `dir_page_entries` entries;
  each entry comes with its attributes (the kernel then needs no lookup
  for it) and the kernel caches a dataset's listing (`cache_readdir`).
- ioctl (Python 3.11's `open()` asks isatty): answered by libfuse in C (no
  handler here), without waking Python; FLUSH too on a read-only mount.

Requests the table can answer are answered on the spot: reads and lookups
in the libfuse worker thread that took them (the table is thread-safe),
the rest on the session's trio thread; the others become trio tasks whose
blocking calls run in worker threads (`trio.to_thread`, at most
`rpcs_in_flight_max` at once), so requests served from memory are never
queued behind the network.  Only
`FuseError` leaves a handler: DLFS errors become errno values through
`errno_map`, anything else is logged as a bug and becomes EIO (session.py).

Caching and staleness: sealed datasets are immutable, so the kernel keeps
entries, attributes and pages for `cache_timeout_s` (default one hour) and
missing names inside a dataset as negative entries for as long.  Dataset
names at the root are re-checked after `dataset_entry_timeout_s`; a dataset
replaced under the same name then shows up as new directory (new inodes).
A dataset deleted or replaced while files of it are open or cached is
served stale until the caches expire; reads that reach the daemon fail with
ESTALE (each read names the dataset version its inode belongs to).  With
`--dataset` the root cannot change, so a replacement there needs a remount.
A space's names and attributes are kept for `mount_space_cache_timeout_s`
(1 s); each closed version of a file is an inode of its own, so its pages
never mix with another version's (space_names.py).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import logging
import os
from typing import Any, Callable

import trio

from dlfs import errors
from dlfs.fuse import errno_map
from dlfs import limits as fuse_limits
from dlfs.fuse import lowlevel as ll
from dlfs.fuse.attributes import dataset_attrs, dataset_key, entry_of, read_generation, stat_of
from dlfs.fuse.backend import Backend
from dlfs.fuse.dirlist import DirStream
from dlfs.fuse.errno_map import FuseError
from dlfs.fuse.extentreads import ExtentReaders
from dlfs.fuse.failurelog import FailureLog
from dlfs.fuse.inodes import ROOT_KEY, Attrs, InodeTable, Key, Node
from dlfs.fuse.names import Names
from dlfs.fuse.pagepush import PagePush
from dlfs.fuse.readcache import ReadCache
from dlfs.fuse.session import Session, inline
from dlfs.fuse.space_files import (SET_ATIME, SET_ATIME_NOW, SET_GID, SET_MODE, SET_MTIME,
                                   SET_MTIME_NOW, SET_SIZE, SET_UID, SpaceFiles, WriteHandle,
                                   writes_file)
from dlfs.fuse.space_names import SpaceNames
from dlfs.fuse.splicereads import SpliceReads
from dlfs.fuse.wholereads import WholeReads

log = logging.getLogger(__name__)

_STATFS_FRAGMENT_BYTES = 4096  # unit of f_blocks in statfs


def statfs_totals(total_bytes: int, samples: int, free_bytes: int = 0,
                  files_free: int = 0) -> ll.Statvfs:
    """What `df` shows of the mount: `total_bytes` in use (the datasets', and on a
    writable mount the checkpoint spaces') and `free_bytes` available (a writable
    mount: the daemon's data dir's free space, where spaces write; 0 on a read-only
    one, which shows like squashfs, all used, the kernel adding ST_RDONLY, by which
    disk-full alerts leave such mounts out), `samples` files in use and
    `files_free` more allowed (the daemon's --space-files-max less its files)."""
    result = ll.Statvfs()
    result.f_bsize = fuse_limits.mount_block_bytes
    result.f_frsize = _STATFS_FRAGMENT_BYTES
    free = free_bytes // _STATFS_FRAGMENT_BYTES
    result.f_blocks = -(-total_bytes // _STATFS_FRAGMENT_BYTES) + free
    result.f_bfree = result.f_bavail = free
    result.f_files = samples + files_free
    result.f_ffree = result.f_favail = files_free
    result.f_namemax = 255
    return result


def _handler(*, on_handle: bool = False) -> Callable:
    """Wrap a request handler so that only `FuseError` escapes it (sync or async).

    `on_handle`: the request names an open file or directory (NotFound then
    means it vanished under the mount: ESTALE).
    """

    def wrap(method: Callable) -> Callable:
        name = method.__name__.lstrip("_")  # _read does the work of read

        def translate(self: "DlfsOperations", exc: errors.DlfsError) -> FuseError:
            number = errno_map.errno_for(exc, on_handle=on_handle)
            self._report(name, exc, number)
            return FuseError(number)

        if inspect.iscoroutinefunction(method):
            @functools.wraps(method)
            async def handle(self: "DlfsOperations", *args: Any) -> Any:
                try:
                    return await method(self, *args)
                except errors.DlfsError as exc:
                    raise translate(self, exc) from None
        else:
            @functools.wraps(method)
            def handle(self: "DlfsOperations", *args: Any) -> Any:
                try:
                    return method(self, *args)
                except errors.DlfsError as exc:
                    raise translate(self, exc) from None
        return handle

    return wrap


class DlfsOperations:
    """The request handlers of a DLFS mount (the contract: session.py).

    `root_key`/`root_attrs` name the mount root: `ROOT_KEY` for a mount of
    every dataset, a dataset's key for a mount of one.  `writable`: its
    checkpoint spaces can be written (a mount of every dataset of one
    daemon); else everything is read-only.  Call `start(nursery, session)`
    inside the trio run before serving.
    """

    def __init__(self, backend: Backend, root_key: Key, root_attrs: Attrs, *,
                 writable: bool = False,
                 cache_timeout_s: float = fuse_limits.mount_cache_timeout_s_default,
                 dataset_entry_timeout_s: float = fuse_limits.mount_dataset_entry_timeout_s,
                 rpcs_in_flight_max: int = fuse_limits.mount_rpcs_in_flight_max):
        self.backend = backend
        self.cache_timeout_s = cache_timeout_s
        self.dataset_entry_timeout_s = min(dataset_entry_timeout_s, cache_timeout_s)
        self.table = InodeTable(root_key, root_attrs, idle_max=fuse_limits.mount_idle_inodes_max)
        self.multi = root_key == ROOT_KEY
        assert self.multi or not writable, "only a mount of every dataset writes spaces"
        self.writable = writable
        self.uid = os.getuid()
        self.gid = os.getgid()
        self._limiter = trio.CapacityLimiter(rpcs_in_flight_max)
        self._store_limiter = trio.CapacityLimiter(fuse_limits.mount_stores_in_flight_max)
        self._next_handle = 1
        self._dirs: dict[int, DirStream] = {}
        self.names = Names(backend, self.table, self._thread, multi=self.multi)
        self.spaces = SpaceFiles(backend, self.table, self.names.spaces, self._invalidate)
        self._cache: ReadCache | None = None
        self.whole_reads = WholeReads(self._fetch_whole_blocking)
        self.pages: PagePush | None = None
        self._session: Session | None = None
        self._statfs_last: tuple[int, int, int, int] = (0, 0, 0, 0)
        self._report_failure = FailureLog()
        # The daemon's extents, on its host (set by main): small files read whole from
        # them, large files spliced from their pages.
        self.extents: ExtentReaders | None = None
        self.splice: SpliceReads | None = None

    def start(self, nursery: trio.Nursery, session: Session) -> None:
        """Bind to the session that answers and the nursery that runs read-ahead."""
        self._session = session
        self._cache = ReadCache(self._fetch_whole, self._fetch_range, nursery, self._store)
        self._reserve_reply_buffers()
        if not self.multi:  # one dataset mounted: push its small files after the first read
            self.pages = PagePush(self._root_files, self._warm_budget_bytes, self._fetch_batch,
                                  self._fetch_piece, self._store_pages, self._thread,
                                  from_extent=self._store_from_extent)
            nursery.start_soon(self.pages.run)

    def _reserve_reply_buffers(self) -> None:
        """Map reply buffers for one sequential reader now, once: runs for the
        read-ahead window, the run being read and the pushed units kept
        (each kept unit pins its run's buffer), and single units for the
        kernel's own read-ahead window (it reaches the mount as unit-sized
        reads before the reader counts as sequential); 120 MiB with the
        default limits.  A first large read then lands in mapped memory
        instead of faulting pages in run by run, which costs much of the
        mount's CPU time in a long read, and far more on a VM whose host has
        taken idle memory back (docs/DESIGN.md, "Fresh memory")."""
        cache = self.cache
        run_bytes = cache.run_units * cache.unit_bytes
        window = cache.ahead_units * cache.unit_bytes + run_bytes + cache.pushed_keep_bytes
        self.backend.reserve_reply_buffers(run_bytes, -(-window // run_bytes))
        self.backend.reserve_reply_buffers(
            cache.unit_bytes, fuse_limits.mount_kernel_read_ahead_bytes // cache.unit_bytes)

    @property
    def unanswered(self) -> frozenset[str]:
        """Operations libfuse answers for this mount (`Session(unanswered=)`): on a
        read-only mount FLUSH, which libfuse answers ENOSYS, after which the kernel
        sends none (files opened without OPEN would each send one at close)."""
        return frozenset() if self.writable else frozenset({"flush"})

    @property
    def cache(self) -> ReadCache:
        assert self._cache is not None, "call start(nursery, session) before serving"
        return self._cache

    @property
    def session(self) -> Session:
        assert self._session is not None, "call start(nursery, session) before serving"
        return self._session

    async def follow_root_version(self) -> None:
        """With one dataset mounted (`--dataset`): every `dataset_entry_timeout_s`
        ask the daemon for the dataset's current version; once it was
        replaced, make the root the new version's and tell the kernel to
        forget the names, attributes and listing it cached under the root, so
        that new lookups find the new version (open files keep the old one:
        ESTALE).  Returns at once for a mount of every dataset, whose dataset
        directories are re-checked by the kernel instead.  Runs until cancelled.
        """
        if self.multi:
            return
        name = self.table.root.dataset
        while True:
            await trio.sleep(self.dataset_entry_timeout_s)
            try:
                info = await self._thread(self.backend.dataset, name)
            except errors.DlfsError as exc:  # deleted, or the daemon away: keep serving
                self._report("version check", exc, errno_map.errno_for(exc))
                continue
            key = dataset_key(info)
            if key == self.table.root.key:
                continue
            old = read_generation(self.table.root)
            children = self.table.rekey_root(key, dataset_attrs(info))
            log.warning("dataset %r was replaced (version %d -> %d): the mount shows the new "
                        "version; files open since before read ESTALE", name, old,
                        read_generation(self.table.root))
            # In a worker thread: the kernel may wait for this loop to answer a
            # lookup under the root before it can drop the root's entries.
            await trio.to_thread.run_sync(self._forget_root_entries,
                                          [c.path.encode() for c in children])

    def _forget_root_entries(self, names: list[bytes]) -> None:
        for name in names:
            self.session.notify_inval_entry(ll.ROOT_INODE, name)
        self.session.notify_inval_inode(ll.ROOT_INODE)

    # --- metadata --------------------------------------------------------------------

    @inline
    @_handler()
    def lookup(self, req: int, parent_inode: int, name: bytes) -> Any:
        # In libfuse's worker thread: a name the inode table knows is answered
        # here (a cold pass over files the kernel forgot: one lookup per open),
        # without waking the trio thread; the others become a trio task.
        parent = self._node(parent_inode)
        text = self.names.decode(name)
        if text == ".":
            return self._reply_node(req, parent)
        if text not in ("..", "") and not (self.multi and parent is self.table.root) and \
                not parent.space:  # a space's names are asked for every time (they change)
            node = self.table.lookup(parent.child_key(text)) if parent.is_dir else None
            if node is not None:  # known: answered from memory
                self.session.reply_entry(req, self._entry(node))
                return None
        return self._lookup(req, parent, text)

    @_handler()
    async def _lookup(self, req: int, parent: Node, text: str) -> None:
        node = await (self.names.parent(parent) if text == ".." else
                      self.names.child(parent, text))
        if node is None:  # cached by the kernel as a negative entry
            entry = ll.EntryParam()
            # Under a --dataset root, names can appear with a new version (and
            # negative entries cannot be invalidated one by one: unknown); in a
            # space, files appear.
            entry.entry_timeout = (SpaceNames.timeout_s() if parent.space else
                                   self.dataset_entry_timeout_s if parent is self.table.root
                                   else self.cache_timeout_s)
            self.session.reply_entry(req, entry)
            return
        self._reply_node(req, node)

    def _reply_node(self, req: int, node: Node) -> None:
        self.table.ref(node)
        self.session.reply_entry(req, self._entry(node))

    def forget(self, items: list[tuple[int, int]]) -> None:
        for inode, count in items:
            self.table.forget(inode, count)

    @inline
    @_handler()
    def getattr(self, req: int, inode: int) -> None:
        # In libfuse's worker thread: the table and a writer's size are thread-safe.
        node = self._node(inode)
        self.session.reply_attr(req, self._stat(node), self._attr_timeout_s(node))

    @_handler()
    async def statfs(self, req: int) -> None:
        try:
            if self.writable:  # datasets and spaces, and the disk the spaces write to
                infos = await self._thread(self.backend.sealed_datasets)
                status = await self._thread(self.backend.status)
                self._statfs_last = (sum(i.bytes for i in infos), sum(i.samples for i in infos),
                                     status.disk_free_bytes,
                                     max(0, status.space_files_max - status.space_files))
            else:
                if self.multi:
                    infos = await self._thread(self.backend.sealed_datasets)
                else:
                    infos = [await self._thread(self.backend.dataset, self.table.root.dataset)]
                self._statfs_last = (sum(i.bytes for i in infos),
                                     sum(i.samples for i in infos), 0, 0)
        except errors.DlfsError as exc:  # df should still work: report what we knew
            self._report("statfs", exc, errno.EIO)
        self.session.reply_statfs(req, statfs_totals(*self._statfs_last))

    # --- files -------------------------------------------------------------------------

    @inline
    @_handler()
    def open(self, req: int, inode: int, flags: int) -> None:
        # In libfuse's worker thread: a dataset's file is answered from memory; a
        # space's costs one Stat (reading) or a data-path connection (writing).
        node = self._node(inode)
        if node.is_dir:
            raise FuseError(errno.EISDIR)
        if node.space:
            fh, writing = self.spaces.open(node, flags)
            # Writes bypass the page cache (it holds versions only: space_files.py);
            # a closed version's pages never change, so they are kept across opens.
            self.session.reply_open(req, fh, keep_cache=not writing, direct_io=writing,
                                    noflush=not writing)
            return
        if writes_file(flags):
            raise FuseError(errno.EROFS)
        if not self.writable and self.session.capable & ll.CAP_NO_OPEN_SUPPORT:
            # Nothing here can be written: the kernel opens every file from now on
            # without asking (and sends no FLUSH or RELEASE for them).
            raise FuseError(errno.ENOSYS)
        # A dataset's file: no handle, its pages kept, no FLUSH at close.
        self.session.reply_open(req, 0, keep_cache=True, noflush=True)

    @inline
    @_handler()
    def create(self, req: int, parent_inode: int, name: bytes, mode: int, flags: int) -> None:
        parent = self._node(parent_inode)
        if not parent.space:
            raise FuseError(self._unwritable(parent))
        node, fh = self.spaces.create(parent, self.names.decode(name), mode, flags)
        self.session.reply_create(req, self._entry(node), fh, direct_io=True)

    @inline
    @_handler(on_handle=True)
    def read(self, req: int, inode: int, size: int, offset: int, fh: int) -> Any:
        # In libfuse's worker thread: the inode table is only read here (a dict
        # lookup; the kernel holds the inode, so it is not forgotten meanwhile).
        node = self._node(inode, errno.EBADF)
        if node.is_dir:
            raise FuseError(errno.EISDIR)
        if node.space:
            handle = self.spaces.handle(fh)
            if isinstance(handle, WriteHandle):  # O_RDWR: what this handle wrote
                self.session.reply_data(req, handle.read(offset, size))
                return None
            self.spaces.check_read(handle)
        if self.whole_reads.handles(node):
            data = self.whole_reads.read(node, offset, size)
            if data is not None:
                self.session.reply_data(req, data)
                self._read_done()
                return None
        elif self.splice is not None and self.splice.read(req, node, offset, size):
            self._read_done()  # answered from the extent's pages, in this thread
            return None
        return self._read(req, node, offset, size)  # a trio task answers

    @_handler(on_handle=True)
    async def _read(self, req: int, node: Node, offset: int, size: int) -> None:
        self.session.reply_data(req, await self.cache.read(node, offset, size))
        self._read_done()

    def _read_done(self) -> None:
        # After the reply: the daemon has seen a read, so it warms the dataset
        # now if it ever will (the push asks it).
        if self.pages is not None:
            self.pages.notice_read()

    # IOCTL: no handler, so libfuse answers it in C, without Python.  Python
    # 3.11's buffered open() asks every file whether it is a terminal (an
    # ioctl the kernel forwards each time): ENOSYS, which the kernel turns
    # into ENOTTY.  Answered in Python it cost several times the time per
    # open() (log-fuse.md).

    @inline
    @_handler(on_handle=True)
    def write(self, req: int, inode: int, data: memoryview, offset: int, fh: int) -> None:
        # In libfuse's worker thread, synchronously: `data` is libfuse's buffer.
        self.spaces.writer(fh).write(offset, data)
        self.session.reply_write(req, len(data))

    @inline
    @_handler(on_handle=True)
    def flush(self, req: int, inode: int, fh: int) -> None:
        # Only files open for writing ask (the others were opened with noflush).
        self.spaces.writing(fh, WriteHandle.flush)
        self.session.reply_err(req, 0)

    @inline
    @_handler(on_handle=True)
    def fsync(self, req: int, inode: int, fh: int) -> None:
        self.spaces.writing(fh, WriteHandle.sync)
        self.session.reply_err(req, 0)  # a dataset's file: nothing to write back

    @inline
    def release(self, req: int, inode: int, fh: int) -> None:
        self.session.reply_err(req, 0)  # the kernel does not wait for what follows
        if fh:
            try:
                self.spaces.release(fh)
            except errors.DlfsError as exc:
                self._report("release", exc, errno_map.errno_for(exc, on_handle=True))

    @inline
    @_handler(on_handle=True)
    def setattr(self, req: int, inode: int, size: int, to_set: int, fh: int) -> None:
        node = self._node(inode)
        if not node.space:
            raise FuseError(self._unwritable(node))
        if to_set & (SET_MODE | SET_UID | SET_GID):
            raise FuseError(errno.EPERM)  # a space's modes and owners are the mount's
        if to_set & SET_ATIME and not to_set & SET_ATIME_NOW or \
                to_set & SET_MTIME and not to_set & SET_MTIME_NOW:
            raise FuseError(errno.EPERM)  # times are the daemon's (touch, "now": accepted)
        if to_set & SET_SIZE:
            if node.is_dir:
                raise FuseError(errno.EISDIR)
            self.spaces.truncate(node, size, fh)
        self.session.reply_attr(req, self._stat(node), self._attr_timeout_s(node))

    @inline
    @_handler(on_handle=True)
    def fallocate(self, req: int, inode: int, mode: int, offset: int, length: int,
                  fh: int) -> None:
        node = self._node(inode)
        if not node.space:
            raise FuseError(errno.EROFS)
        if mode:
            raise FuseError(errno.EOPNOTSUPP)  # holes, keep-size, ...: not kept
        self.spaces.writer(fh).allocate(offset, length)
        self.session.reply_err(req, 0)

    # --- directories ----------------------------------------------------------------------

    @_handler()
    def opendir(self, req: int, inode: int) -> None:
        node = self._node(inode)
        if not node.is_dir:
            raise FuseError(errno.ENOTDIR)
        fetch = self.names.datasets if (self.multi and node is self.table.root) else \
            functools.partial(self.names.children, node)
        fh = self._next_handle
        self._next_handle += 1
        self._dirs[fh] = DirStream(fetch, fuse_limits.mount_dir_page_entries)
        # Inside a dataset a listing never changes: the kernel may keep it.
        # The root of a multi-dataset mount changes with ingests and deletes,
        # and a space with every change.
        cache = not (self.multi and node is self.table.root) and not node.space
        self.session.reply_open(req, fh, keep_cache=cache, cache_readdir=cache)

    @_handler(on_handle=True)
    def readdirplus(self, req: int, inode: int, size: int, offset: int, fh: int) -> Any:
        stream = self._dirs.get(fh)
        if stream is None:
            raise FuseError(errno.EBADF)
        return self._readdirplus(req, stream, size, offset)

    @_handler(on_handle=True)
    async def _readdirplus(self, req: int, stream: DirStream, size: int, offset: int) -> None:
        reply = self.session.directory_buffer(req, size)
        async with contextlib.aclosing(stream.entries_from(offset)) as entries:
            async for next_offset, child in entries:
                node = self.table.node_for(child.key, lambda: child.attrs)
                if child.attrs.space:  # a space's node: as the daemon has it now
                    self.table.refresh(node, child.attrs)
                if not reply.add(child.name.encode(), self._entry(node), next_offset):
                    break
                self.table.ref(node)  # the kernel now holds one reference more
        reply.reply()

    def releasedir(self, req: int, inode: int, fh: int) -> None:
        self._dirs.pop(fh, None)
        self.session.reply_err(req, 0)

    # --- changes of the tree (spaces only; a dataset answers EROFS) -----------------------

    @_handler()
    async def mkdir(self, req: int, parent_inode: int, name: bytes, mode: int) -> None:
        parent = self._node(parent_inode)
        text = self.names.decode(name)
        if self.writable and parent is self.table.root:  # `mkdir MNT/NAME`: a new space
            node = self.names.top(await self._thread(self.backend.create_space, text))
        elif parent.space:
            node = await self._thread(self.spaces.mkdir, parent, text, mode)
        else:
            raise FuseError(self._unwritable(parent))
        self._reply_node(req, node)

    @_handler()
    async def rmdir(self, req: int, parent_inode: int, name: bytes) -> None:
        parent = self._node(parent_inode)
        text = self.names.decode(name)
        if self.writable and parent is self.table.root:
            await self._thread(self._remove_space, text)
        elif parent.space:
            await self._thread(functools.partial(self.spaces.remove, is_dir=True), parent, text)
        else:
            raise FuseError(self._unwritable(parent))
        self.session.reply_err(req, 0)

    @_handler()
    async def unlink(self, req: int, parent_inode: int, name: bytes) -> None:
        parent = self._node(parent_inode)
        if not parent.space:
            raise FuseError(self._unwritable(parent))
        await self._thread(functools.partial(self.spaces.remove, is_dir=False), parent,
                           self.names.decode(name))
        self.session.reply_err(req, 0)

    @_handler()
    async def rename(self, req: int, parent_inode: int, name: bytes, new_parent_inode: int,
                     new_name: bytes, flags: int) -> None:
        parent, new_parent = self._node(parent_inode), self._node(new_parent_inode)
        for side in (parent, new_parent):
            if not side.space:
                raise FuseError(self._unwritable(side))
        if parent.key[:2] != new_parent.key[:2]:
            raise FuseError(errno.EXDEV)  # another space: copy, then remove
        await self._thread(self.spaces.rename, parent, self.names.decode(name), new_parent,
                           self.names.decode(new_name), flags)
        self.session.reply_err(req, 0)

    @inline
    def mknod(self, req: int, parent_inode: int, *_args: Any) -> None:
        # Only special files reach mknod (regular ones are created): not kept.
        self._refuse(req, parent_inode, errno.EPERM)

    @inline
    def symlink(self, req: int, parent_inode: int, *_args: Any) -> None:
        self._refuse(req, parent_inode, errno.EPERM)

    @inline
    def link(self, req: int, parent_inode: int, *_args: Any) -> None:
        self._refuse(req, parent_inode, errno.EPERM)

    @inline
    def setxattr(self, req: int, inode: int) -> None:
        self._refuse(req, inode, errno.ENOTSUP)

    @inline
    def removexattr(self, req: int, inode: int) -> None:
        self._refuse(req, inode, errno.ENOTSUP)

    def _refuse(self, req: int, inode: int, number: int) -> None:
        """Answer a change this mount never makes: `number` in a space, EROFS in a
        dataset (or a read-only mount)."""
        try:
            node = self.table.get(inode)
        except KeyError:
            node = None
        in_space = node is not None and bool(node.space)
        self.session.reply_err(req, number if in_space else self._unwritable(node))

    def _unwritable(self, node: Node | None) -> int:
        """The errno of a change asked of `node`, which is not in a space: EPERM at the
        root of a writable mount (it holds datasets and spaces only), else EROFS."""
        if self.writable and node is self.table.root:
            return errno.EPERM
        return errno.EROFS

    def _remove_space(self, name: str) -> None:
        """`rmdir MNT/NAME`: remove space NAME if it is empty (ENOTEMPTY otherwise;
        a dataset: EROFS).  Blocks."""
        info = self.backend.dataset(name)
        if info.kind != "space":
            raise FuseError(errno.EROFS)
        entries, _ = self.backend.list_page(name, "", "", 1, 0)
        if entries:
            raise FuseError(errno.ENOTEMPTY)
        self.backend.delete_space(name)

    def _invalidate(self, inode: int) -> None:
        """Drop the kernel's pages and attributes of `inode` (a space's file this mount
        just closed into a new version)."""
        try:
            self.session.notify_inval_inode(inode)
        except OSError as exc:
            log.warning("the kernel did not drop its cache of inode %d: %s", inode, exc)

    # --- internals ----------------------------------------------------------------------------

    async def _thread(self, function: Callable, *args: Any) -> Any:
        """Run a blocking backend call in a worker thread (bounded by the limiter)."""
        return await trio.to_thread.run_sync(function, *args, limiter=self._limiter,
                                             abandon_on_cancel=True)

    def _root_files(self) -> list[Node]:
        """Files of the mounted dataset version the kernel holds (it listed or looked
        them up).  O(nodes); on the trio thread."""
        version = self.table.root.key[:2]
        return [n for n in self.table.nodes() if not n.is_dir and n.lookups > 0 and
                n.key[:2] == version and n.key[1] > 0]

    def _warm_budget_bytes(self) -> int:
        """The daemon's warm-up budget if it warms this dataset, else 0; blocks."""
        return self.backend.warm_budget_bytes(self.table.root.dataset)

    def _fetch_batch(self, nodes: list[Node]) -> list[memoryview]:
        if self.extents is not None:
            datas = self.extents.batch(nodes)
            if datas is not None:
                return datas
        return self.backend.read_batch(nodes[0].dataset, [n.sample_id for n in nodes],
                                       read_generation(nodes[0]))

    def _fetch_piece(self, node: Node, offset: int, length: int) -> memoryview:
        if self.extents is not None:
            data = self.extents.range(node, offset, length)
            if data is not None:
                return data
        return self.backend.read(node.dataset, node.read_key, offset, length,
                                 read_generation(node))

    def _store_pages(self, node: Node, offset: int, data: memoryview) -> None:
        self.session.notify_store(node.inode, offset, data)

    def _store_from_extent(self, node: Node, offset: int, length: int) -> bool:
        return self.splice is not None and self.splice.store(node, offset, length)

    def _fetch_whole_blocking(self, node: Node) -> memoryview:  # blocks: a worker thread
        if self.extents is not None:
            data = self.extents.whole(node)
            if data is not None:
                return data
        return self.backend.read(node.dataset, node.read_key, 0, 0, read_generation(node))

    async def _fetch_whole(self, node: Node) -> memoryview:
        return await self._thread(self._fetch_whole_blocking, node)

    async def _fetch_range(self, node: Node, offset: int, length: int,
                           deliver: Callable[[int, memoryview], None]) -> int:
        if self.extents is not None:  # on the daemon's host: one checked view, no copy
            data = await self._thread(self.extents.range, node, offset, length)
            if data is not None:
                deliver(0, data)
                return len(data)
        token = trio.lowlevel.current_trio_token()

        def deliver_on_loop(position: int, piece: memoryview) -> None:  # in the worker thread
            trio.from_thread.run_sync(deliver, position, piece, trio_token=token)

        return await self._thread(self.backend.read_chunks, node.dataset, node.read_key, offset,
                                  length, deliver_on_loop, read_generation(node))

    async def _store(self, node: Node, offset: int, data: memoryview) -> None:
        # Copies into the page cache; may wait for pages the kernel is reading.
        await trio.to_thread.run_sync(self.session.notify_store, node.inode, offset, data,
                                      limiter=self._store_limiter, abandon_on_cancel=True)

    def _node(self, inode: int, number: int = errno.ESTALE) -> Node:
        try:
            return self.table.get(inode)
        except KeyError:
            log.error("the kernel asked for inode %d, which this mount does not know", inode)
            raise FuseError(number) from None

    def _stat(self, node: Node) -> ll.Stat:
        attr = stat_of(node, self.uid, self.gid)
        if node.space:
            size = self.spaces.live_size(node)  # being written here: its size so far
            if size is not None:
                attr.st_size, attr.st_blocks = size, -(-size // 512)
        return attr

    def _attr_timeout_s(self, node: Node) -> float:
        return SpaceNames.timeout_s() if node.space else self.cache_timeout_s

    def _entry(self, node: Node) -> ll.EntryParam:
        if node.space:
            timeout_s = SpaceNames.timeout_s()
            entry = entry_of(node, self.uid, self.gid, timeout_s, timeout_s)
            entry.attr = self._stat(node)
            return entry
        entry_timeout_s = (self.dataset_entry_timeout_s
                           if self.multi and node.is_dir and not node.path
                           else self.cache_timeout_s)
        return entry_of(node, self.uid, self.gid, self.cache_timeout_s, entry_timeout_s)

    def _report(self, handler: str, exc: errors.DlfsError, number: int) -> None:
        if isinstance(exc, errors.NotFound) and number == errno.ENOENT:
            return  # an ordinary answer, not a failure
        kind = f"{handler}:{type(exc).__name__}"
        level = logging.ERROR if isinstance(exc, errno_map.DAEMON_DOWN) else logging.WARNING
        self._report_failure(level, kind, f"{handler} failed with {errno.errorcode[number]} "
                                          f"(daemon {self.backend.address}): {exc}")
