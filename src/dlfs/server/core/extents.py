"""Extent store: append-only extent files that pack many samples each.

Every extent belongs to exactly one dataset, so deleting a dataset (or
discarding an interrupted ingest) is removing its directory: no compaction.
The file names and the extent header are defined in `dlfs.formats.disk_layout`, which
co-located clients share.

`ExtentWriter` appends the samples of one ingest; `ExtentFiles` hands out
read-only file descriptors through an LRU cache bounded by `open_extents_max`.
Nothing here imports grpc.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import threading
from collections import OrderedDict
from contextlib import ExitStack, contextmanager
from typing import Iterator

from dlfs import limits
from dlfs.formats import disk_layout as layout
from dlfs.errors import DataCorruption, DlfsError, Overloaded, StorageFailed, StorageFull
from dlfs.formats.disk_layout import HEADER_BYTES, check_header, encode_header
from dlfs.server.core import faults
from dlfs.server.core.directio import is_direct, open_appender

WRITE_BUFFER_BYTES = 4 * limits.MiB

_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def disk_error(exc: OSError, where: str) -> DlfsError:
    """What a failed write or fsync of the data dir raises: StorageFull for ENOSPC and
    EDQUOT, StorageFailed for any other errno (EIO, EROFS, ...).  `where` names
    what was being written ("dataset 'x'", "the catalog")."""
    if exc.errno in _NO_SPACE_ERRNOS:
        return StorageFull(
            f"no space left on the data dir while writing {where}; free space there "
            "(`dlfs datasets` lists the datasets it holds, `dlfs rm NAME` deletes one)")
    reason = exc.strerror or str(exc)
    code = errno.errorcode.get(exc.errno, str(exc.errno))
    return StorageFailed(
        f"the daemon's disk failed while writing {where}: {reason} ({code}); what the call "
        "changed was undone: check the data dir's device (dmesg), then retry")


# The typed errors of a failed data-dir write (see `disk_error`).
DISK_ERRORS = (StorageFull, StorageFailed)


class ExtentStore:
    """Directory management of the extent files of the data dir `data_dir`.

    Creates DATA_DIR/extents (mode 0700) if missing: only the daemon builds one.
    """

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self.root = layout.extents_root(data_dir)
        if not os.path.isdir(self.root):
            faults.point("mkdir", self.root)
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            fsync_dir(data_dir)  # the SEALs to come depend on this entry

    def dataset_dir(self, dataset_id: int) -> str:
        return layout.dataset_dir(self.data_dir, dataset_id)

    def extent_path(self, dataset_id: int, extent_no: int) -> str:
        return layout.extent_path(self.data_dir, dataset_id, extent_no)

    def dataset_ids_on_disk(self) -> list[int]:
        """Dataset ids that have an extent directory (live or orphaned)."""
        ids = []
        for name in os.listdir(self.root):
            try:
                ids.append(int(name, 16))
            except ValueError:
                continue
        return sorted(ids)

    def remove_dataset(self, dataset_id: int) -> None:
        """Delete a dataset's extents.  Open descriptors keep working until closed.

        Call it only once the catalog durably says the dataset is gone (or
        was never sealed): what it removes cannot come back.  Raises OSError
        when the directory could not be removed; what is left is removed at
        the next start (replay drops extents no record names).
        """
        path = self.dataset_dir(dataset_id)
        if not os.path.exists(path):
            return
        faults.point("unlink", path)
        shutil.rmtree(path)
        fsync_dir(self.root)

    def cut_dataset(self, dataset_id: int, extent_no: int, end: int, label: str = "") -> None:
        """Keep a dataset's extents up to `extent_no` (that one cut at `end` bytes, header
        included, and synced) and remove later ones; extent -1 keeps none.  What a
        resumable ingest's checkpoint holds durably is all that stays (checkpoints.py).

        Cost: a listing of the dataset's directory, a truncate and an fsync.
        Raises DataCorruption when extent `extent_no` is shorter than `end` (the
        disk lost synced data), StorageFull or StorageFailed (naming `label`).
        """
        directory = self.dataset_dir(dataset_id)
        label = label or f"dataset id {dataset_id:x}"
        try:
            faults.point("mkdir", directory)
            os.makedirs(directory, mode=0o700, exist_ok=True)
            for name in os.listdir(directory):
                stem, _, suffix = name.partition(".")
                if suffix == "ext" and stem.isdigit() and int(stem) > extent_no:
                    faults.point("unlink", os.path.join(directory, name))
                    os.unlink(os.path.join(directory, name))
            if extent_no >= 0:
                path = self.extent_path(dataset_id, extent_no)
                with open(path, "r+b") as f:
                    size = os.fstat(f.fileno()).st_size
                    if size < end:  # resuming would seal samples past the extent's end
                        raise DataCorruption(
                            f"extent {path} holds {size} bytes, but the ingest's last "
                            f"checkpoint made {end} durable (the disk lost synced data?)")
                    if size > end:
                        faults.point("truncate", path)
                        f.truncate(end)
                        faults.point("fsync", path)
                        os.fsync(f.fileno())
            fsync_dir(directory)
        except OSError as exc:
            raise disk_error(exc, label) from exc

    def dataset_disk_bytes(self, dataset_id: int) -> int:
        """Bytes the dataset's extents take on the data dir's file system (allocated
        blocks, not file sizes); 0 when it has none.  Cost: a listing and a stat per
        extent.  Never raises (an extent removed meanwhile counts 0)."""
        directory = self.dataset_dir(dataset_id)
        total = 0
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    try:
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
                    except OSError:
                        continue
        except OSError:
            return 0
        return total


class ExtentWriter:
    """Appends the samples of one dataset into its extents.

    Usage: `begin_sample(size)` returns where the sample will live, then
    `write(chunk)` until `size` bytes were written, then `end_sample()`.
    `sync()` makes everything written so far durable (file data and the
    directory entries).  Not thread-safe: one ingest session owns a writer.
    A sample never spans extents: a new extent is started when the sample
    would overflow the current one, unless the current one is empty.
    """

    def __init__(self, store: ExtentStore, dataset_id: int, created_ns: int,
                 extent_bytes_max: int = limits.extent_bytes_max_default, label: str = "",
                 resume_after: tuple[int, int] | None = None):
        self._store = store
        self._label = label or f"dataset id {dataset_id:x}"  # for error messages
        self._dataset_id = dataset_id
        self._created_ns = created_ns
        self._extent_bytes_max = extent_bytes_max
        self._file = None  # a directio.DirectAppender, or a BufferedWriter without O_DIRECT
        self._extent_no = -1
        self._end = 0  # bytes in the current extent, header included
        self._remaining = 0
        self._root_synced = False
        self._unsynced = 0  # bytes written since writeback was last started
        # The error of the write or sync that failed: the writer is broken then (a
        # buffer may not have reached the file, so what lies past the last sync is
        # unknown); every later write and sync raises it again.
        self._failed: DlfsError | None = None
        self.extents = 0
        if resume_after is None:
            path = store.dataset_dir(dataset_id)
            try:
                faults.point("mkdir", path)
                os.makedirs(path, mode=0o700, exist_ok=False)
            except OSError as exc:
                raise disk_error(exc, self._label) from exc
        else:
            self._reopen(*resume_after)

    @property
    def store(self) -> ExtentStore:
        return self._store

    def _broken(self, exc: OSError, where: str) -> DlfsError:
        """Remember that the writer failed; the typed error to raise."""
        self._failed = disk_error(exc, where)
        return self._failed

    def _check(self) -> None:
        if self._failed is not None:
            raise type(self._failed)(f"{self._failed.message} (an earlier write of this "
                                     "ingest failed; nothing more is written)")

    def _reopen(self, extent_no: int, end: int) -> None:
        """Continue a resumable ingest: keep extents up to `extent_no` (that one cut
        at `end`, where its durable part ends), remove later ones, and start the next
        sample in a new extent (dlfs.server.core.checkpoints)."""
        self._store.cut_dataset(self._dataset_id, extent_no, end, self._label)
        # position() must keep naming the kept extent's durable end until the next
        # sample opens a new extent: a checkpoint taken before that (a resume that
        # breaks off at once) records it, and the next resume cuts the extent there.
        self._extent_no, self._end = extent_no, end

    def position(self) -> tuple[int, int]:
        """(extent number, bytes written to it, header included): the end of what
        this writer holds, where a checkpoint cuts.  The next sample starts there
        or at the start of the next extent; extent -1 before the first one."""
        return self._extent_no, self._end

    def begin_sample(self, size: int) -> tuple[int, int]:
        """Reserve room for a sample of `size` bytes; return (extent no, offset)."""
        assert self._remaining == 0, "previous sample not finished"
        self._check()
        if self._file is None or (
            self._end > HEADER_BYTES and self._end + size > self._extent_bytes_max
        ):
            self._open_next_extent()
        self._remaining = size
        return self._extent_no, self._end

    def write(self, chunk) -> None:
        """Append bytes of the current sample.  Raises StorageFull (ENOSPC, EDQUOT),
        StorageFailed (other errors); the writer is broken then (see `__init__`)."""
        n = len(chunk)
        assert n <= self._remaining, "sample longer than announced"
        self._check()
        try:
            faults.point("write", self._label)
            self._file.write(chunk)
            self._unsynced += n
            if self._unsynced >= limits.ingest_writeback_bytes and not is_direct(self._file):
                self._start_writeback()
        except OSError as exc:
            raise self._broken(exc, self._label) from exc
        self._remaining -= n
        self._end += n

    def _start_writeback(self) -> None:
        """Hand what was written so far to the kernel and have it start writing it out
        (no waiting), so that later fsyncs are short and writes stream to the device."""
        self._unsynced = 0
        self._file.flush()
        start_writeback(self._file.fileno())

    def end_sample(self) -> None:
        assert self._remaining == 0, "sample shorter than announced"

    def sync(self) -> None:
        """Make everything written durable: the open extent's data, the dataset
        directory's entries (the extent files), and the extents root's entry
        for the dataset directory.  A SEAL depends on all three: without the
        last two a power loss can bring back a sealed dataset whose files
        were never linked into the tree.

        Extents finished earlier were synced when the writer moved past them.
        Raises StorageFull, StorageFailed (the writer is broken then).
        """
        self._check()
        try:
            if self._file is not None:
                faults.point("write", self._label)
                self._file.flush()
                faults.point("fsync", self._label)
                os.fsync(self._file.fileno())
            fsync_dir(self._store.dataset_dir(self._dataset_id))
            if not self._root_synced:
                fsync_dir(self._store.root)
                self._root_synced = True
        except OSError as exc:
            raise self._broken(exc, self._label) from exc

    def close(self) -> None:
        """Close the open extent without syncing (call `sync()` first to keep it).
        Never raises: what was not synced is being dropped."""
        if self._file is not None:
            file, self._file = self._file, None
            try:
                file.close()
            except OSError:
                pass  # a BufferedWriter flushes on close: that write may fail too

    def discard(self) -> None:
        """Close without syncing and remove every extent written (the dataset's directory)."""
        self.close()
        self._store.remove_dataset(self._dataset_id)

    def _open_next_extent(self) -> None:
        if self._file is not None:
            self.sync()
            self.close()
        self._extent_no += 1
        path = self._store.extent_path(self._dataset_id, self._extent_no)
        try:
            faults.point("create", path)
            self._file = open_appender(path, WRITE_BUFFER_BYTES)
            self._file.write(encode_header(self._dataset_id, self._extent_no, self._created_ns))
        except OSError as exc:
            raise self._broken(exc, f"{self._label} ({path})") from exc
        self._end = HEADER_BYTES
        self.extents += 1


class ExtentFiles:
    """Read-only descriptors of extent files, cached with LRU eviction.

    `acquire(dataset_id, extent_no)` is a context manager yielding an fd that
    stays open while held, even if evicted meanwhile; at most
    `open_extents_max` idle descriptors stay cached.  Headers are checked
    once per open.  Thread-safe.
    """

    def __init__(self, store: ExtentStore, open_extents_max: int = limits.open_extents_max_default):
        assert open_extents_max >= 1
        self._store = store
        self._max = open_extents_max
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[int, int], _Handle] = OrderedDict()

    @contextmanager
    def acquire(self, dataset_id: int, extent_no: int) -> Iterator[int]:
        handle = self._get(dataset_id, extent_no)
        try:
            yield handle.fd
        finally:
            self._release(handle)

    @contextmanager
    def acquire_all(self, dataset_id: int, extent_nos: list[int]) -> Iterator[list[int]]:
        """The fds of `extent_nos` (distinct), in that order, all held until the block
        ends; those acquired so far are released if one fails."""
        if len(extent_nos) == 1:  # the usual case, without the stack's cost
            with self.acquire(dataset_id, extent_nos[0]) as fd:
                yield [fd]
            return
        with ExitStack() as stack:
            yield [stack.enter_context(self.acquire(dataset_id, e)) for e in extent_nos]

    def open_count(self) -> int:
        with self._lock:
            return len(self._cache)

    def forget_dataset(self, dataset_id: int) -> None:
        """Drop cached descriptors of a deleted dataset (held ones close on release)."""
        with self._lock:
            for key in [k for k in self._cache if k[0] == dataset_id]:
                self._evict(key)

    def close(self) -> None:
        with self._lock:
            for key in list(self._cache):
                self._evict(key)

    def _get(self, dataset_id: int, extent_no: int) -> "_Handle":
        key = (dataset_id, extent_no)
        with self._lock:
            handle = self._cache.get(key)
            if handle is not None:
                self._cache.move_to_end(key)
                handle.refs += 1
                return handle
        path = self._store.extent_path(dataset_id, extent_no)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise DataCorruption(
                f"extent file {path} is missing; the dataset must be ingested again"
            ) from None
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise Overloaded(
                    f"too many open files opening {path}; lower --open-extents-max or raise "
                    "the daemon's file limit (ulimit -n)"
                ) from exc
            raise
        try:
            # Batches read exactly the ranges they need; kernel read-ahead around
            # a random 4 KiB read would only burn device bandwidth.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            check_header(os.pread(fd, HEADER_BYTES, 0), dataset_id, extent_no, path)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            existing = self._cache.get(key)
            if existing is not None:  # another thread opened it meanwhile
                os.close(fd)
                existing.refs += 1
                self._cache.move_to_end(key)
                return existing
            handle = _Handle(fd)
            handle.refs = 1
            self._cache[key] = handle
            while len(self._cache) > self._max:
                oldest = next(iter(self._cache))
                self._evict(oldest)
            return handle

    def _release(self, handle: "_Handle") -> None:
        with self._lock:
            handle.refs -= 1
            if handle.evicted and handle.refs == 0:
                os.close(handle.fd)

    def _evict(self, key) -> None:  # caller holds the lock
        handle = self._cache.pop(key)
        handle.evicted = True
        if handle.refs == 0:
            os.close(handle.fd)


class _Handle:
    __slots__ = ("fd", "refs", "evicted")

    def __init__(self, fd: int):
        self.fd = fd
        self.refs = 0
        self.evicted = False


_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range = None


def start_writeback(fd: int) -> None:
    """sync_file_range(SYNC_FILE_RANGE_WRITE) over the whole file: start writing its
    dirty pages back without waiting.  A no-op where the C library lacks it."""
    global _sync_file_range
    if _sync_file_range is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            function = libc.sync_file_range
            function.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
            function.restype = ctypes.c_int
            _sync_file_range = function
        except (OSError, AttributeError):
            _sync_file_range = False
    if _sync_file_range:
        _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


def fsync_dir(path: str) -> None:
    """fsync directory `path`: its entries (files created, renamed, removed) become durable."""
    faults.point("fsync", path)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
