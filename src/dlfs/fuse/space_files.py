"""Checkpoint spaces written through the mount: open files, their writes and closes,
and changes of a space's tree.

Each open of a space file for writing is one `WriteHandle` holding one
`FileWriter` (dlfs.client.transport.datapath_writer): a data-path
connection of its own, on which writes stream to the daemon.  Every call
on a handle takes the handle's lock, so concurrent writes to one open file
reach the daemon one at a time, in the order they took the lock; different
files write in parallel.  Handles are called from libfuse's worker
threads (blocking there, never on the trio loop).

What each request does to a file open for writing:

- write: sent at the kernel's offset (in order or not; the daemon keeps
  the draft);
- flush (every close(2) of a descriptor): commits (the file is durable,
  whole and visible to every reader when close returns; ENOSPC and EIO are
  close's errors) and ends the conversation, so the path is free for a
  rename at once (RELEASE comes later, asynchronously).  A write after
  that (through a dup'd descriptor) starts a new draft as a copy of the
  version the flush made;
- fsync, fdatasync: commits, the conversation goes on;
- ftruncate, fallocate (mode 0: grows the file, zeros): on the draft;
- read (O_RDWR, w+): what this handle wrote (`FileWriter.read`);
- release: ends a conversation a flush did not (a commit nobody hears of:
  failures are logged).

A handle that failed (a full disk, the daemon gone) keeps failing with the
same errno: the daemon dropped its draft, and writing on in a fresh draft
would make a file the program never wrote.

A commit moves the file's node to the key of the version it made (its
inode stays: space_names.py) and drops the kernel's cached pages and
attributes of that inode before the request is answered, so an open after
a close reads the new bytes.  Readers of the version the node was before
get ESTALE for what is not in their page cache (`check_read`).

Read-only opens of a space's file check its version with the daemon first
(one Stat): a path closed again elsewhere, or replaced, answers ESTALE, on
which the kernel looks the name up again and opens the new version
(close-to-open consistency across mounts).  A file being written that was
never closed cannot be read through another descriptor: EBUSY.
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import logging
import os
import threading
import time
from typing import Callable

from dlfs import errors
from dlfs.client import FileState, FileWriter
from dlfs.formats import datapath_writes as writes
from dlfs.fuse.backend import Backend
from dlfs.fuse.errno_map import FuseError
from dlfs.fuse.inodes import InodeTable, Node
from dlfs.fuse.space_names import (SpaceNames, child_path, draft_key, entry_attrs,
                                   file_version, space_id, space_key_prefixes, version_key)
from dlfs.paths import file_version_name
from dlfs.types import Entry

log = logging.getLogger(__name__)

RENAME_NOREPLACE = 1  # linux/fs.h
RENAME_EXCHANGE = 2

# setattr's to_set bits (fuse_lowlevel.h, FUSE_SET_ATTR_*).
SET_MODE, SET_UID, SET_GID, SET_SIZE = 1 << 0, 1 << 1, 1 << 2, 1 << 3
SET_ATIME, SET_MTIME, SET_ATIME_NOW, SET_MTIME_NOW = 1 << 4, 1 << 5, 1 << 7, 1 << 8
SET_CTIME = 1 << 10


def writes_file(flags: int) -> bool:
    """Whether open(2) `flags` change the file (O_TRUNC truncates even read-only)."""
    return flags & os.O_ACCMODE != os.O_RDONLY or bool(flags & os.O_TRUNC)


@dataclasses.dataclass(eq=False)
class ReadHandle:
    """A space's file open read-only: the version it was opened as."""

    node: Node
    version: int


class WriteHandle:
    """A space's file open for writing (see the module).  Thread-safe."""

    def __init__(self, files: "SpaceFiles", node: Node, writer: FileWriter):
        self.files = files
        self.node = node
        self.lock = threading.Lock()
        self.writer: FileWriter | None = writer
        self.failure: errors.DlfsError | None = None
        self.committed: FileState | None = None

    @property
    def size(self) -> int:
        writer = self.writer
        return writer.size if writer is not None else self.node.size

    def write(self, offset: int, data) -> None:
        with self.lock:
            writer = self._live()
            self._guard(lambda: writer.write(offset, data))
            self.node.mtime_ns = time.time_ns()

    def truncate(self, size: int) -> None:
        with self.lock:
            writer = self._live()
            self._guard(lambda: writer.truncate(size))
            self.node.mtime_ns = time.time_ns()

    def allocate(self, offset: int, length: int) -> None:
        """fallocate mode 0: at least `offset + length` bytes (the new ones zeros)."""
        with self.lock:
            writer = self._live()
            if offset + length > writer.size:
                self._guard(lambda: writer.truncate(offset + length))

    def read(self, offset: int, length: int) -> bytes | memoryview:
        with self.lock:
            self._check()
            writer = self.writer
            if writer is not None:
                return self._guard(lambda: writer.read(offset, length))
            state = self.committed  # closed by a flush: read the version it made
            if state is None or not state.version or offset >= state.size:
                return b""
            length = min(length, state.size - offset)
            return self.files.backend.read(file_version_name(self.node.space, state.version),
                                           0, offset, length, state.version)

    def sync(self) -> None:
        """fsync: commit, keep writing."""
        with self.lock:
            self._check()
            if self.writer is not None:
                self._guard(lambda: self._committed(self.writer.sync()))

    def flush(self) -> None:
        """close(2) of a descriptor: commit and end the conversation."""
        with self.lock:
            self._check()
            writer, self.writer = self.writer, None
            if writer is not None:
                self._guard(lambda: self._committed(writer.close()))

    def release(self) -> None:
        with self.lock:
            writer, self.writer = self.writer, None
            if writer is None:
                return
            if self.failure is not None:
                _discard(writer)
                return
            try:
                self._committed(writer.close())
            except errors.DlfsError as exc:
                log.warning("%s/%s was not committed when its last descriptor was released: "
                            "%s", self.node.space, self.node.space_path, exc)

    # --- with the lock held --------------------------------------------------------

    def _check(self) -> None:
        if self.failure is not None:
            raise self.failure

    def _live(self) -> FileWriter:
        """The writer, started again (as a copy of the last commit) after a flush."""
        self._check()
        if self.writer is None:
            self.writer = self._guard(lambda: self.files.backend.file_writer(
                self.node.space, self.node.space_path, 0, self.node.mode))
        return self.writer

    def _guard(self, call: Callable):
        try:
            return call()
        except errors.DlfsError as exc:
            self.failure = exc
            writer, self.writer = self.writer, None
            if writer is not None:
                _discard(writer)
            raise

    def _committed(self, state: FileState) -> None:
        self.committed = state
        if state.version:
            self.files.committed(self.node, state)


class SpaceFiles:
    """The open files and tree changes of checkpoint spaces (see the module).

    `invalidate(inode)` drops the kernel's pages and attributes of an inode
    (`Session.notify_inval_inode`).  Thread-safe.
    """

    def __init__(self, backend: Backend, table: InodeTable, names: SpaceNames,
                 invalidate: Callable[[int], None]):
        self.backend = backend
        self._table = table
        self._names = names
        self._invalidate = invalidate
        self._lock = threading.Lock()
        self._handles: dict[int, ReadHandle | WriteHandle] = {}
        self._writing: dict[int, set[WriteHandle]] = {}  # inode -> its write handles
        # fh 0 is a dataset file's (no handle).
        self._numbers = itertools.count(1)
        self.commits = 0

    # --- opening ---------------------------------------------------------------------

    def open(self, node: Node, flags: int) -> tuple[int, bool]:
        """Open space file `node` with open(2) `flags` (the kernel took O_CREAT and
        O_EXCL off): (fh, for writing).  Blocks (one Stat, or a data-path
        connection and FILE_OPEN)."""
        if writes_file(flags):
            daemon_flags = writes.OPEN_TRUNCATE if flags & os.O_TRUNC else 0
            try:
                writer = self.backend.file_writer(node.space, node.space_path, daemon_flags,
                                                  node.mode)
            except errors.NotFound:
                raise FuseError(errno.ESTALE) from None  # gone: the kernel looks it up again
            return self._add_writer(node, writer), True
        version = file_version(node)
        try:
            entry = self.backend.stat(node.space, node.space_path, 0)
        except errors.NotFound:
            raise FuseError(errno.ESTALE) from None
        if entry.is_dir or entry.version != version:
            raise FuseError(errno.ESTALE)  # closed again or replaced since the lookup
        if not version:
            raise errors.Busy(f"'{node.space}/{node.space_path}' is being written and was "
                              "never closed: it can be read once its writer closes it")
        return self._add(ReadHandle(node, version)), False

    def create(self, directory: Node, name: str, mode: int, flags: int) -> tuple[Node, int]:
        """Create (or open, as O_CREAT does) file `name` in space directory `directory`
        for writing: its node and fh.  Blocks."""
        path = child_path(directory, name)
        daemon_flags = writes.OPEN_CREATE
        if flags & os.O_EXCL:
            daemon_flags |= writes.OPEN_EXCLUSIVE
        if flags & os.O_TRUNC:
            daemon_flags |= writes.OPEN_TRUNCATE
        writer = self.backend.file_writer(directory.space, path, daemon_flags, mode & 0o7777)
        try:
            key = draft_key(directory.space, space_id(directory), path)
            attrs = entry_attrs(directory.space, _draft_entry(name, path, writer.size, mode))
            node = self._table.node_for(key, lambda: attrs)
            self._table.refresh(node, attrs)
            self._table.ref(node)  # the kernel holds the entry the reply gives it
        except BaseException:
            writer.abandon()
            raise
        return node, self._add_writer(node, writer)

    # --- open files ------------------------------------------------------------------

    def handle(self, fh: int) -> ReadHandle | WriteHandle:
        handle = self._handles.get(fh)
        if handle is None:
            raise FuseError(errno.EBADF)
        return handle

    def writer(self, fh: int) -> WriteHandle:
        handle = self.handle(fh)
        if not isinstance(handle, WriteHandle):
            raise FuseError(errno.EBADF)  # the kernel checks the access mode first
        return handle

    def writing(self, fh: int, call: Callable[[WriteHandle], None]) -> None:
        """`call(handle)` if `fh` is a file open for writing (flush and fsync of others
        have nothing to do)."""
        handle = self._handles.get(fh)
        if isinstance(handle, WriteHandle):
            call(handle)

    def check_read(self, handle: ReadHandle) -> None:
        """ESTALE when the node was closed into another version since `handle` opened
        it (its pages now hold the other version's bytes)."""
        if file_version(handle.node) != handle.version:
            raise FuseError(errno.ESTALE)

    def release(self, fh: int) -> None:
        with self._lock:
            handle = self._handles.pop(fh, None)
        if isinstance(handle, WriteHandle):
            try:
                handle.release()
            finally:
                with self._lock:
                    handles = self._writing.get(handle.node.inode)
                    if handles is not None:
                        handles.discard(handle)
                        if not handles:
                            del self._writing[handle.node.inode]

    def live_size(self, node: Node) -> int | None:
        """The size of `node` as its write handles here have it, or None (none)."""
        handles = self._writing.get(node.inode)
        if not handles:
            return None
        return max((h.size for h in list(handles)), default=None)

    def truncate(self, node: Node, size: int, fh: int) -> None:
        """truncate(2) / ftruncate(2) of a space's file to `size` bytes.  Blocks."""
        if fh:
            self.writer(fh).truncate(size)
        else:  # by path: a writer for the one change, committed at once
            flags = writes.OPEN_TRUNCATE if size == 0 else 0
            writer = self.backend.file_writer(node.space, node.space_path, flags, node.mode)
            try:
                if size:
                    writer.truncate(size)
                state = writer.close()
            except BaseException:
                writer.abandon()
                raise
            if state.version:
                self.committed(node, state)
        node.size = size

    def committed(self, node: Node, state: FileState) -> None:
        """A handle's commit made version `state` of `node`'s file: the node becomes
        that version and the kernel forgets its pages and attributes."""
        with self._lock:
            self.commits += 1
        if file_version(node) != state.version:
            self._table.rekey(node, version_key(node.space, state.version))
        node.size, node.sample_id, node.mtime_ns = state.size, 0, time.time_ns()
        self._invalidate(node.inode)

    # --- the tree ----------------------------------------------------------------------

    def mkdir(self, directory: Node, name: str, mode: int) -> Node:
        """Directory `name` in `directory` (a space's), made durably.  Blocks."""
        entry = self.backend.make_dir(directory.space, child_path(directory, name),
                                      mode & 0o7777)
        return self._names.node(directory, entry)

    def remove(self, directory: Node, name: str, *, is_dir: bool) -> None:
        """unlink(2) or rmdir(2) of `name` in `directory`.  Blocks."""
        path = child_path(directory, name)
        self.backend.remove(directory.space, path, directory=is_dir)
        # A path made again later must get a new inode, not this one.
        sid = space_id(directory)
        key = (directory.space, sid, path) if is_dir else draft_key(directory.space, sid, path)
        node = self._table.find(key)
        if node is not None:
            self._table.retire(node)

    def rename(self, directory: Node, name: str, new_directory: Node, new_name: str,
               flags: int) -> None:
        """rename(2) within one space (the caller checked that).  Blocks."""
        if flags & RENAME_EXCHANGE or flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE):
            raise FuseError(errno.EINVAL)
        source = child_path(directory, name)
        target = child_path(new_directory, new_name)
        if flags & RENAME_NOREPLACE:
            try:
                self.backend.stat(directory.space, target, 0)
                raise FuseError(errno.EEXIST)
            except errors.NotFound:
                pass
        self.backend.rename(directory.space, source, target)
        self._table.rename_paths(space_key_prefixes(directory), source, target)

    # --- inside --------------------------------------------------------------------------

    def _add(self, handle: ReadHandle | WriteHandle) -> int:
        with self._lock:
            fh = next(self._numbers)
            self._handles[fh] = handle
        return fh

    def _add_writer(self, node: Node, writer: FileWriter) -> int:
        handle = WriteHandle(self, node, writer)
        with self._lock:
            self._writing.setdefault(node.inode, set()).add(handle)
        return self._add(handle)

    def open_counts(self) -> dict[str, int]:
        """Handles open now, by kind, and commits so far (for the log)."""
        with self._lock:
            writing = sum(1 for h in self._handles.values() if isinstance(h, WriteHandle))
            return {"reading": len(self._handles) - writing, "writing": writing,
                    "commits": self.commits}


def _discard(writer: FileWriter) -> None:
    """End a failed file's conversation so the daemon lets go of its draft now (it
    answers with the failure again)."""
    try:
        writer.close(discard=True)
    except errors.DlfsError:
        pass


def _draft_entry(name: str, path: str, size: int, mode: int) -> Entry:
    return Entry(name, path, False, size, 0o100000 | (mode & 0o7777), time.time_ns(), -1, 0, 0)

