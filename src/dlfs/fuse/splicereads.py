"""READs of large files answered from the daemon's extent pages by `splice` (co-located mounts).

Why (docs/DESIGN.md, "Splice READs"): through the daemon, a READ of a large
file costs the daemon a send, the mount a receive into a buffer, a CRC
pass, a copy into the page cache and trio's thread hand-offs; on two cores
the mount's process is then the serial part of a long read.  A mount on the
daemon's host can do better: with the extents' descriptors (passed over the
daemon's Unix socket, as to `Client(direct=True)`; the data dir stays 0700)
it checks the CRC32Cs of the blocks around the READ on a mapping of the
extent, writes the reply's 16-byte header into a pipe, `splice`s the
extent's page-cache pages behind it (references, no copy) and splices the
pipe into /dev/fuse, where the kernel copies the pages into the file's page
cache.  No sample byte passes through user space, and the worker thread that
took the READ answers it.

What it needs (else READs are answered the usual way: parts read from the
extents and copied, or through the daemon; said once in the log):
- the daemon on this host passing descriptors to this user (`direct.py`);
- pipes that hold a whole READ reply: the kernel's READs are up to 1 MiB
  and the header takes a page of its own, so 2 MiB pipes
  (`fs.pipe-max-size` of at least 2 MiB, or CAP_SYS_RESOURCE);
- the request's `unique`: libfuse 3 has no call that returns it, so it is
  read from its private `struct fuse_req`, where it follows the session
  pointer (every libfuse 3 release so far).  Every value is checked (FUSE
  uniques are even and not 0); a wrong one turns this path off for good.
  The request is then freed by `fuse_reply_none`, which sends nothing;
- block CRC32Cs for the sample (datasets ingested before them are read
  through the daemon, which checks whole samples).

Bounded: at most `limits.mount_splice_pipes_max` pipes (one per READ in
flight; more READs wait for one).  A READ the path cannot serve (a short
file, the dataset replaced meanwhile) goes the usual way.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import struct
import threading

from dlfs import errors
from dlfs import limits as fuse_limits
from dlfs.fuse.extentreads import ExtentReaders
from dlfs.fuse.inodes import Node

log = logging.getLogger(__name__)

_F_SETPIPE_SZ = 1031
_PAGE_BYTES = 4096
# struct fuse_out_header: total length, error (0; a notification's code), the request's
# unique (0 for a notification).
_OUT_HEADER = struct.Struct("<IiQ")
# struct fuse_notify_store_out: inode, offset, size, padding (FUSE_NOTIFY_STORE = 4).
_NOTIFY_STORE = struct.Struct("<QQII")
_FUSE_NOTIFY_STORE = 4
# Where libfuse 3 keeps `unique` in its private struct fuse_req: after `se`.
_UNIQUE_OFFSET = ctypes.sizeof(ctypes.c_void_p)


def pipe_bytes_available(wanted: int = fuse_limits.mount_splice_pipe_bytes) -> str:
    """"" when pipes of `wanted` bytes can be made here, else why not."""
    read_end, write_end = os.pipe()
    try:
        fcntl.fcntl(write_end, _F_SETPIPE_SZ, wanted)
        return ""
    except OSError as exc:
        return (f"pipes of {wanted >> 20} MiB are refused ({exc.strerror}): raise "
                f"fs.pipe-max-size to {wanted} (sysctl) or grant CAP_SYS_RESOURCE")
    finally:
        os.close(read_end)
        os.close(write_end)


def splice_refused() -> str:
    """"" when this process may splice a file into a pipe, else why not (a seccomp
    profile, a kernel without splice)."""
    read_end, write_end = os.pipe()
    try:
        fd = os.open(os.path.abspath(__file__), os.O_RDONLY)
        try:
            os.splice(fd, write_end, 16, offset_src=0)
            return ""
        except OSError as exc:
            return f"splice(2) is refused here ({exc.strerror})"
        finally:
            os.close(fd)
    finally:
        os.close(read_end)
        os.close(write_end)


class _Refused(Exception):
    """splice(2) failed in a way that says it will always fail here."""


# What a splice that can never work answers (a seccomp filter, no splice support).
_REFUSED_ERRNOS = (errno.EPERM, errno.EACCES, errno.ENOSYS, errno.EINVAL)
# A test hook, off unless asked for: with DLFS_MOUNT_SPLICE_FAULT=ERRNO (a name such
# as EPERM) in the mount's environment, its first splice from an extent fails with
# that errno, as one would under a seccomp filter installed after the start-up probe.
FAULT_ENV_VAR = "DLFS_MOUNT_SPLICE_FAULT"


class _Pipes:
    """Reusable pipes of `pipe_bytes`, at most `count_max` at once (thread-safe)."""

    def __init__(self, pipe_bytes: int, count_max: int):
        self.pipe_bytes = pipe_bytes
        self._idle: list[tuple[int, int]] = []
        self._slots = threading.BoundedSemaphore(count_max)
        self._lock = threading.Lock()

    def take(self) -> tuple[int, int]:
        self._slots.acquire()
        with self._lock:
            if self._idle:
                return self._idle.pop()
        try:
            read_end, write_end = os.pipe()
            fcntl.fcntl(write_end, _F_SETPIPE_SZ, self.pipe_bytes)
        except BaseException:
            self._slots.release()
            raise
        return read_end, write_end

    def give_back(self, pipe: tuple[int, int], *, empty: bool) -> None:
        """Return a pipe; one that may still hold bytes is closed instead."""
        if empty:
            with self._lock:
                self._idle.append(pipe)
        else:
            os.close(pipe[0])
            os.close(pipe[1])
        self._slots.release()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for read_end, write_end in idle:
            os.close(read_end)
            os.close(write_end)


class SpliceReads:
    """Answers READs of large files from the extents (see the module docstring).

    `read` runs in libfuse's worker threads.  The parts come checked from
    `extents` (a dataset without extents here: its READs go the usual way).
    """

    def __init__(self, session, extents: ExtentReaders, *,
                 pipe_bytes: int = fuse_limits.mount_splice_pipe_bytes,
                 pipes_max: int = fuse_limits.mount_splice_pipes_max):
        self._session = session
        self._extents = extents
        self._pipes = _Pipes(pipe_bytes, pipes_max)
        self.off_reason = ""  # set once this path turned itself off
        self.reads = 0  # READs answered here
        self.bytes = 0
        self.stored_bytes = 0  # bytes the page push stored from the extents
        fault = os.environ.get(FAULT_ENV_VAR, "")
        self._fault = getattr(errno, fault, 0) if fault else 0
        self._device = session.device_fd()

    def close(self) -> None:
        self._pipes.close()

    def read(self, req: int, node: Node, offset: int, size: int) -> bool:
        """Answer a READ of `node` from its extent; False (nothing sent) when this path
        cannot, and the caller answers it.  Raises DlfsError (StaleGeneration,
        DataCorruption, ...) for the caller to turn into an errno, and logs a
        damaged block naming the sample."""
        part = self._part(node, offset, size)
        if part is None:
            return False
        fd, file_offset, length = part
        try:
            if not self._fits(file_offset, length):
                return False
            unique = ctypes.c_uint64.from_address(req + _UNIQUE_OFFSET).value
            if unique == 0 or unique % 2:
                self._turn_off(f"libfuse's request layout is not the expected one (unique "
                               f"{unique:#x})")
                return False
            self._send(_OUT_HEADER.pack(_OUT_HEADER.size + length, 0, unique), fd,
                       file_offset, length)
        except _Refused as exc:
            self._turn_off(str(exc))
            return False  # nothing reached the kernel: the caller answers
        finally:
            os.close(fd)
        self._session.reply_none(req)
        self.reads += 1
        self.bytes += length
        node.fetched_bytes += length
        return True

    def store(self, node: Node, offset: int, length: int) -> bool:
        """Put `length` bytes of `node` at `offset` into the kernel's page cache from the
        extent's pages (FUSE_NOTIFY_STORE, spliced as READ replies are), once the blocks
        around them were checked: the page push of large files.  False when this path
        cannot (then fetch and store them the usual way).  Raises what `read` raises;
        OSError ENOENT when the kernel forgot the inode."""
        part = self._part(node, offset, length)
        if part is None:
            return False
        fd, file_offset, length = part
        # Messages of at most `unit` bytes, so that each fits a pipe with its headers.
        unit = self._pipes.pipe_bytes // 2
        try:
            for start in range(0, length, unit):
                n = min(unit, length - start)
                header = _OUT_HEADER.pack(_OUT_HEADER.size + _NOTIFY_STORE.size + n,
                                          _FUSE_NOTIFY_STORE, 0) + \
                    _NOTIFY_STORE.pack(node.inode, offset + start, n, 0)
                if not self._send(header, fd, file_offset + start, n):
                    raise OSError(errno.ENOENT, "the kernel forgot the inode")
        except _Refused as exc:
            self._turn_off(str(exc))
            return False  # the caller fetches the piece and stores it the usual way
        finally:
            os.close(fd)
        self.stored_bytes += length
        return True

    def _part(self, node: Node, offset: int, length: int) -> tuple[int, int, int] | None:
        """(descriptor, offset in the extent, bytes) of a checked part of `node`, or None
        when this path cannot serve it (a damaged block raises, naming the file)."""
        if self.off_reason:
            return None
        return self._extents.part(node, offset, length)

    def _fits(self, file_offset: int, length: int) -> bool:
        """Whether the header's page and the pages the part spans fit one pipe."""
        pages = (file_offset % _PAGE_BYTES + length + _PAGE_BYTES - 1) // _PAGE_BYTES
        return 1 + pages <= self._pipes.pipe_bytes // _PAGE_BYTES

    def _send(self, header: bytes, fd: int, file_offset: int, length: int) -> bool:
        """One message (`header`, then `length` bytes of `fd` at `file_offset`) into
        /dev/fuse through a pipe.  False when the kernel refused it with ENOENT (a
        READ it gave up on meanwhile, or a store for an inode it forgot): dropped."""
        total = len(header) + length
        pipe = self._pipes.take()
        read_end, write_end = pipe
        empty = False
        try:
            os.write(write_end, header)
            position, left = file_offset, length
            while left:
                try:
                    if self._fault:
                        number, self._fault = self._fault, 0
                        log.warning("fault injected: splice from an extent fails with %s",
                                    errno.errorcode[number])
                        raise OSError(number, os.strerror(number))
                    moved = os.splice(fd, write_end, left, offset_src=position)
                except OSError as exc:
                    if exc.errno in _REFUSED_ERRNOS:
                        raise _Refused(f"splice(2) from an extent failed ({exc.strerror})") \
                            from None
                    raise
                if moved <= 0:
                    raise errors.DataCorruption(
                        f"an extent ended {left} bytes early at offset {position}; "
                        "re-ingest the dataset")
                position += moved
                left -= moved
            left = total
            while left:
                moved = os.splice(read_end, self._device, left)
                if moved <= 0:
                    raise OSError(errno.EIO, "splice into /dev/fuse moved nothing")
                left -= moved
            empty = True
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise errors.Internal(f"writing to /dev/fuse by splice failed: {exc}") from None
        finally:
            self._pipes.give_back(pipe, empty=empty)
        return True

    def _turn_off(self, reason: str) -> None:
        if not self.off_reason:
            self.off_reason = reason
            log.warning("large files are read without splice from now on: %s", reason)
