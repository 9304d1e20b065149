"""Appending to an extent with O_DIRECT: large aligned writes that skip the page cache.

Writing through the page cache costs several times the time and an order
of magnitude more kernel CPU (page allocation, dirty accounting,
write-back; docs/DESIGN.md, "On-disk format and durability order", has
the figure); an ingest is one long sequential append, the case O_DIRECT
is for.  `DirectAppender` offers what ExtentWriter needs of a
buffered file (`write`, `flush`, `fileno`, `close`): bytes are copied into
a page-aligned buffer and written a whole buffer at a time, on a thread of
its own while the next buffer fills (two buffers: receiving and writing
overlap, the device sees one large write after the other); `flush` waits
for that, writes the partial last block padded with zeros, cuts the file
back to what was written, and keeps that block to rewrite with what
follows.  A
file system without O_DIRECT (tmpfs) gets a plain buffered file instead
(`open_appender`).  Nothing here imports grpc.
"""

from __future__ import annotations

import errno
import io
import logging
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger(__name__)

ALIGN = 4096  # the largest logical block size of the devices we write to

_O_DIRECT = getattr(os, "O_DIRECT", 0)


class DirectAppender:
    """Append-only writes to `fd` (opened with O_DIRECT, empty) through an aligned buffer.

    A write that fails (ENOSPC, EIO) breaks the appender: the buffer that
    failed is gone and the file offset of what follows is no longer known,
    so every later `write` and `flush` raises that error again (writing on
    would leave a hole that a checkpoint or a seal could claim).  `close`
    never raises: it always closes the file and lets go of the buffers.
    """

    def __init__(self, fd: int, buffer_bytes: int):
        assert buffer_bytes % ALIGN == 0
        self._fd = fd
        self._buffers = [mmap.mmap(-1, buffer_bytes) for _ in range(2)]  # page aligned
        self._views = [memoryview(b) for b in self._buffers]
        self._current = 0  # the buffer being filled
        self._view = self._views[0]
        self._fill = 0  # bytes in the buffer
        self._base = 0  # file offset of the buffer's first byte (aligned)
        self._writer: ThreadPoolExecutor | None = None
        self._pending: Future | None = None  # the other buffer's write
        self._failed: OSError | None = None  # the write that broke it

    def fileno(self) -> int:
        return self._fd

    def write(self, data) -> int:
        """Copy `data` into the buffer; a full buffer is handed to the writer thread.
        Raises OSError (this write's or an earlier one's failure)."""
        self._check()
        data = memoryview(data).cast("B")
        n, pos, size = len(data), 0, len(self._view)
        while pos < n:
            take = min(size - self._fill, n - pos)
            self._view[self._fill:self._fill + take] = data[pos:pos + take]
            self._fill += take
            pos += take
            if self._fill == size:
                self._wait()
                if self._writer is None:
                    self._writer = ThreadPoolExecutor(1, thread_name_prefix="dlfs-extent-write")
                self._pending = self._writer.submit(self._write, self._view, self._base)
                self._current ^= 1
                self._view = self._views[self._current]
                self._base += size
                self._fill = 0
        return n

    def _check(self) -> None:
        if self._failed is not None:
            raise OSError(self._failed.errno, f"an earlier write to this extent failed "
                                              f"({self._failed.strerror}); nothing more is "
                                              "written to it")

    def _wait(self) -> None:
        """Wait for the write in flight; raise its error (and keep it: see the class)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.result()
            except OSError as exc:
                self._failed = exc
                raise

    def flush(self) -> None:
        """Put everything written into the file, which then ends where the data does.
        Raises OSError (the appender is broken then, see the class)."""
        self._check()
        self._wait()
        if not self._fill:
            return
        padded = -(-self._fill // ALIGN) * ALIGN
        self._view[self._fill:padded] = bytes(padded - self._fill)
        try:
            # Released on the way out, also when the write fails: a traceback that
            # kept this slice would keep the buffer exported, and `close` could
            # not let it go (BufferError).
            with self._view[:padded] as block:
                self._write(block, self._base)
            os.ftruncate(self._fd, self._base + self._fill)
        except OSError as exc:
            self._failed = exc
            raise
        whole = self._fill - self._fill % ALIGN  # keep the partial block to rewrite later
        if whole:
            tail = self._fill - whole
            self._view[:tail] = self._view[whole:self._fill]
            self._base += whole
            self._fill = tail

    def close(self) -> None:
        """Close without flushing (as for a BufferedWriter whose data is being dropped,
        call `flush` first to keep it).  Never raises; idempotent."""
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        try:
            try:
                self._wait()
            except OSError:
                pass  # the data is being dropped
            if self._writer is not None:
                self._writer.shutdown()
        finally:
            try:
                os.close(fd)
            except OSError:
                pass  # the data is being dropped; the descriptor is gone either way
            self._release_buffers()

    def _release_buffers(self) -> None:
        views, buffers = self._views, self._buffers
        self._views, self._buffers, self._view = [], [], memoryview(b"")
        for view, buffer in zip(views, buffers):
            try:
                view.release()
                buffer.close()
            except BufferError:
                # Something still holds a slice of it (a traceback being handled):
                # the mapping goes when that does; closing it is only sooner.
                log.debug("extent write buffer still exported at close; left to the GC")

    def _write(self, view: memoryview, offset: int) -> None:
        written = os.pwrite(self._fd, view, offset)
        if written != len(view):  # O_DIRECT writes whole blocks or fail; short means full
            raise OSError(errno.ENOSPC, "short write to an extent")


def open_appender(path: str, buffer_bytes: int):
    """A new file at `path` (mode 0600, must not exist) to append to: a DirectAppender
    where the file system takes O_DIRECT, else a BufferedWriter.  Raises OSError."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    if _O_DIRECT:
        try:
            fd = os.open(path, flags | _O_DIRECT, 0o600)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            try:  # some kernels create the file before they refuse O_DIRECT
                os.unlink(path)
            except FileNotFoundError:
                pass
        else:
            try:
                return DirectAppender(fd, buffer_bytes)
            except BaseException:
                os.close(fd)
                raise
    fd = os.open(path, flags, 0o600)
    return io.BufferedWriter(io.FileIO(fd, "wb"), buffer_size=buffer_bytes)


def is_direct(appender) -> bool:
    return isinstance(appender, DirectAppender)
