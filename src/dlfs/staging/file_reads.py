"""Reading one file of a tree into the reader pool, cheaply for cold files.

A file that is wholly in the page cache is copied out of it; one that is
not is read with O_DIRECT into a page-aligned buffer (cold reads through
the page cache cost three times the kernel CPU to fill it;
log-ingest.md).  What a file system
refuses (O_NOATIME on files not ours, RWF_NOWAIT, O_DIRECT) is remembered in
`ReadHints`, so no file pays for a refusal twice.  A file that shrank or grew
since the walk stops the ingest (InvalidArgument).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading

from dlfs.errors import InvalidArgument
from dlfs.staging.source_files import ReadContext, SourceFile

# Open flags and read flags this platform may lack (0 then: the plain way is taken).
O_DIRECT = getattr(os, "O_DIRECT", 0)
RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
# What O_DIRECT reads align offsets, lengths and buffers to.
DIRECT_ALIGN_BYTES = 4096
_O_NOATIME = getattr(os, "O_NOATIME", 0)
_local = threading.local()


class ReadHints:
    """What reading one source learnt about its file system, so that no file pays
    for a refusal twice (on a parallel file system a refused open costs a round trip)."""

    def __init__(self):
        self.noatime = bool(_O_NOATIME)  # O_NOATIME is allowed (we own the files)
        self.nowait = bool(RWF_NOWAIT and O_DIRECT)  # RWF_NOWAIT and O_DIRECT work


def _open_for_reading(path: str, hints: ReadHints) -> int:
    """A read-only descriptor, without updating the access time where allowed."""
    flags = os.O_RDONLY | os.O_CLOEXEC
    if hints.noatime:
        try:
            return os.open(path, flags | _O_NOATIME)
        except PermissionError:  # O_NOATIME needs the file's owner (or CAP_FOWNER)
            hints.noatime = False
    return os.open(path, flags)


def _read_up_to(fd: int, n: int) -> bytes:
    """Read `n` bytes, fewer only at end of file (a network file system may
    return short reads before it)."""
    data = os.read(fd, n)
    if len(data) >= n or not data:
        return data
    parts = [data]
    got = len(data)
    while got < n:
        more = os.read(fd, n - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _aligned_buffer(size: int) -> memoryview:
    """This thread's page-aligned buffer of at least `size` bytes (O_DIRECT reads)."""
    buffer = getattr(_local, "buffer", None)
    if buffer is None or len(buffer) < size:
        buffer = mmap.mmap(-1, -(-size // DIRECT_ALIGN_BYTES) * DIRECT_ALIGN_BYTES)
        _local.buffer = buffer
    return memoryview(buffer)


def _read_small(fd: int, size: int, hints: ReadHints) -> bytes:
    """The whole of a small file (`size` + 1 bytes asked for, to see growth).

    Cached pages are copied (preadv with RWF_NOWAIT); a file that is not
    wholly in the page cache is read with O_DIRECT into an aligned buffer:
    a third of the kernel CPU of a read through the page cache (the copy out
    of the buffer included), and at least as fast.  File systems
    without RWF_NOWAIT or O_DIRECT are read the plain way.
    """
    want = size + 1
    if hints.nowait and size:
        view = _aligned_buffer(want + DIRECT_ALIGN_BYTES)
        try:
            got = os.preadv(fd, [view[:want]], 0, RWF_NOWAIT)
            if got == size or got == want:
                return bytes(view[:got])
        except BlockingIOError:
            pass  # not (wholly) cached
        except OSError:
            hints.nowait = False  # no RWF_NOWAIT on this file system
            return _read_up_to(fd, want)
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | O_DIRECT)
        except OSError:
            hints.nowait = False
            return _read_up_to(fd, want)
        try:
            padded = -(-want // DIRECT_ALIGN_BYTES) * DIRECT_ALIGN_BYTES
            got = total = 0
            while total < want:
                got = os.preadv(fd, [view[total:padded]], total)
                if got <= 0:
                    break
                total += got
                if total % DIRECT_ALIGN_BYTES:  # a short read: end of file
                    break
            return bytes(view[:min(total, want)])
        except OSError:  # O_DIRECT refused after all (alignment rules of this device)
            hints.nowait = False
            fcntl.fcntl(fd, fcntl.F_SETFL, flags)
            return _read_up_to(fd, want)
    return _read_up_to(fd, want)


def _uncached(fd: int) -> bool:
    """Whether the file's first page is not in the page cache; then reads switch the
    descriptor to O_DIRECT (see `_read_small`).  False where that cannot be told."""
    try:
        os.preadv(fd, [bytearray(1)], 0, RWF_NOWAIT)
        return False
    except BlockingIOError:
        pass
    except OSError:
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | O_DIRECT)
        return True
    except OSError:
        return False


def _read_direct(fd: int, offset: int, n: int, hints: ReadHints) -> bytes:
    """`n` bytes at aligned `offset` of an O_DIRECT descriptor (fewer at end of file)."""
    view = _aligned_buffer(n + DIRECT_ALIGN_BYTES)
    padded = -(-n // DIRECT_ALIGN_BYTES) * DIRECT_ALIGN_BYTES
    got = 0
    while got < n:
        done = os.preadv(fd, [view[got:padded]], offset + got)
        if done <= 0:
            break
        got += done
        if got % DIRECT_ALIGN_BYTES:
            break
    return bytes(view[:min(got, n)])


def read_file(file: SourceFile, ctx: ReadContext, hints: ReadHints | None = None) -> None:
    """Read one file of a tree into the pool, in chunks of at most ctx.chunk_bytes.

    Raises InvalidArgument when it shrank or grew since the walk, OSError
    when it cannot be read.
    """
    hints = hints or ReadHints()
    fd = _open_for_reading(file.source, hints)
    try:
        size, step = file.size, ctx.chunk_bytes
        if size <= step:
            ctx.reserve(size)
            data = _read_small(fd, size, hints)
            _check_size(file, len(data))
            ctx.push(file, data, True, size, size)
            return
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        direct = hints.nowait and step % DIRECT_ALIGN_BYTES == 0 and _uncached(fd)
        sent = 0
        head: SourceFile | None = file
        while sent < size:
            n = min(step, size - sent)
            ctx.reserve(n)
            data = _read_direct(fd, sent, n, hints) if direct else _read_up_to(fd, n)
            if len(data) < n:
                _check_size(file, sent + len(data))
            sent += n
            last = sent == size
            if last and (os.fstat(fd).st_size > size if direct else os.read(fd, 1)):
                _check_size(file, size + 1)
            ctx.push(head, data, last, n, n)
            head = None
    finally:
        os.close(fd)


def _check_size(file: SourceFile, got: int) -> None:
    if got < file.size:
        raise InvalidArgument(
            f"{file.source} shrank while being ingested ({got} of {file.size} bytes); "
            "ingest again once the source is stable")
    if got > file.size:
        raise InvalidArgument(f"{file.source} grew while being ingested; ingest again once "
                              "the source is stable")
