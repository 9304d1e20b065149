"""One file read front to back at the disk's pace: an archive streamed by its source.

`open_sequential(path)` gives a `SequentialReader` (O_DIRECT, large aligned
chunks, the next one read on a thread while this one is used: the disk sees
one large read after another, the page cache is neither filled nor needed)
where the file system takes O_DIRECT and the file is not already cached,
else a plain buffered file.
"""

from __future__ import annotations

import fcntl
import io
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor

from dlfs.staging.file_reads import DIRECT_ALIGN_BYTES, O_DIRECT, RWF_NOWAIT


class SequentialReader(io.RawIOBase):
    """A file read front to back with O_DIRECT in large aligned chunks, the next one
    read on a thread while this one is used (an archive: the disk sees one large
    read after another, the page cache is neither filled nor needed).

    Seeks inside the chunk in hand, or forward, are cheap; others restart the
    read-ahead there.  `open_sequential` falls back to a plain file where
    O_DIRECT does not work or the file is already in the page cache.
    """

    CHUNK = 8 * 1024 * 1024

    def __init__(self, fd: int, size: int):
        super().__init__()
        self._fd = fd
        self._size = size
        self._buffers = [mmap.mmap(-1, self.CHUNK) for _ in range(2)]
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dlfs-archive-read")
        self._pos = 0  # the reader's position
        self._start = 0  # file offset of the chunk in hand (aligned)
        self._have = 0  # valid bytes of the chunk in hand
        self._current = 0  # index of the buffer holding it
        # (offset, the read of it into the other buffer)
        self._ahead: tuple[int, Future[int]] | None = None
        self._load(0)

    def _read_chunk(self, index: int, offset: int) -> int:
        view = memoryview(self._buffers[index])
        got = 0
        while got < self.CHUNK and offset + got < self._size:
            n = os.preadv(self._fd, [view[got:]], offset + got)
            if n <= 0:
                break
            got += n
        return got

    def _load(self, offset: int) -> None:
        """Make the chunk at `offset` (aligned) the one in hand; start reading the next."""
        if self._ahead is not None:
            ahead_offset, future = self._ahead
            self._ahead = None
            got = future.result()
            if ahead_offset == offset:
                self._current ^= 1
                self._start, self._have = offset, got
                self._prefetch()
                return
        self._start, self._have = offset, self._read_chunk(self._current, offset)
        self._prefetch()

    def _prefetch(self) -> None:
        following = self._start + self.CHUNK
        if following < self._size:
            self._ahead = (following, self._pool.submit(self._read_chunk, self._current ^ 1,
                                                        following))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, target) -> int:
        target = memoryview(target).cast("B")
        if self._pos >= self._size:
            return 0
        if not self._start <= self._pos < self._start + self._have:
            self._load(self._pos - self._pos % self.CHUNK)
            if not self._start <= self._pos < self._start + self._have:
                return 0
        at = self._pos - self._start
        n = min(len(target), self._have - at)
        target[:n] = memoryview(self._buffers[self._current])[at:at + n]
        self._pos += n
        return n

    def close(self) -> None:
        if not self.closed:
            if self._ahead is not None:
                self._ahead[1].cancel()
            self._pool.shutdown(wait=True)
            os.close(self._fd)
            for buffer in self._buffers:
                buffer.close()
        super().close()


def open_sequential(path: str):
    """`path` opened for one front-to-back read: a SequentialReader (O_DIRECT) when the
    file system takes it and the file's start is not in the page cache, else a plain
    buffered file."""
    if O_DIRECT and RWF_NOWAIT:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            probe = bytearray(DIRECT_ALIGN_BYTES)
            try:
                os.preadv(fd, [probe], 0, RWF_NOWAIT)
                cached = True
            except BlockingIOError:
                cached = False
            if not cached:
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | O_DIRECT)
                reader = SequentialReader(fd, os.fstat(fd).st_size)
                fd = -1
                return io.BufferedReader(reader, buffer_size=64 * 1024)
        except OSError:
            pass
        finally:
            if fd >= 0:
                os.close(fd)
    return open(path, "rb")
