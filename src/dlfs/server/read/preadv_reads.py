"""Reads of planned pieces from extent files, one system call per piece.

A piece is (extent no, file offset, buffer offset, bytes), as
`batch_planning` cuts them, sorted by extent.  Three ways to read them:
`read_cached` copies what the page cache holds without blocking
(`preadv(RWF_NOWAIT)`, or one io_uring submission through `uring_reads`);
`advise_willneed` asks the device for every piece at once; `read_pieces`
reads with blocking `preadv`s (on a reader thread).  The read engine
(read_engine.py) decides which runs where; the prefetcher advises.
`ShortRead` is what an extent that ends early raises, here and in
sendfiles.py.  Nothing here imports grpc.
"""

from __future__ import annotations

import contextlib
import errno
import os

from dlfs import limits
from dlfs.server.core.extents import ExtentFiles
from dlfs.server.read import uring, uring_reads
from dlfs.server.read.batch_planning import Piece


class ShortRead(Exception):
    """An extent ended before a planned range did (the extent is truncated)."""

    def __init__(self, extent_no: int, file_offset: int, wanted: int, got: int):
        super().__init__(extent_no, file_offset, wanted, got)
        self.extent_no, self.file_offset = extent_no, file_offset
        self.wanted, self.got = wanted, got


# Whether RWF_NOWAIT works here: cleared when the file system refuses it.
_nowait_supported = hasattr(os, "RWF_NOWAIT")


@contextlib.contextmanager
def _with_fds(files: ExtentFiles, dataset_id: int, pieces: list[Piece]):
    """Iterate (fd, piece) over `pieces`, holding the current extent's descriptor.

    Pieces come sorted by extent, so each extent is acquired once; the last
    one is released when the `with` block ends, also on an early exit.
    """
    with contextlib.ExitStack() as stack:
        def walk():
            current_extent, fd = -1, -1
            for piece in pieces:
                if piece[0] != current_extent:
                    stack.close()
                    fd = stack.enter_context(files.acquire(dataset_id, piece[0]))
                    current_extent = piece[0]
                yield fd, piece

        yield walk()


def read_cached(files: ExtentFiles, dataset_id: int, pieces: list[Piece],
                buffer: memoryview, ring: uring.RingReads | None = None) -> list[Piece]:
    """Copy what the page cache holds of `pieces` into `buffer` without blocking.

    Returns the pieces (or their remainders) that still need a blocking read.
    One `preadv(RWF_NOWAIT)` per piece, where, when the first
    `limits.nowait_probe_pieces` pieces all miss, the window is cold and
    everything is returned without probing the rest; or with a `ring` one
    submission of all pieces (`_read_cached_ring`).  All pieces are
    returned where the file system does not support RWF_NOWAIT.
    """
    global _nowait_supported
    if not _nowait_supported:
        return pieces
    if ring is not None:
        missed = _read_cached_ring(ring, files, dataset_id, pieces, buffer)
        if missed is not None:
            return missed
    missed: list[Piece] = []
    with _with_fds(files, dataset_id, pieces) as walk:
        for index, (fd, piece) in enumerate(walk):
            if index == limits.nowait_probe_pieces and len(missed) == index:
                # Nothing cached so far: a cold window; leave the rest to the
                # reader threads rather than paying a syscall per piece here.
                return pieces
            extent_no, file_offset, buffer_offset, size = piece
            try:
                got = os.preadv(fd, [buffer[buffer_offset:buffer_offset + size]], file_offset,
                                os.RWF_NOWAIT)
            except BlockingIOError:
                got = 0
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                _nowait_supported = False
                return pieces
            if got < size:
                missed.append((extent_no, file_offset + got, buffer_offset + got, size - got))
    return missed


def _read_cached_ring(ring: uring.RingReads, files: ExtentFiles, dataset_id: int,
                      pieces: list[Piece], buffer: memoryview) -> list[Piece] | None:
    """`read_cached` in one submission of RWF_NOWAIT reads of every piece.  None when
    the ring cannot take the pieces (the caller probes them one call each).

    A cold window costs little more than its first pieces would: a miss is
    answered at once, after the kernel started reading exactly that piece
    (the extents are FADV_RANDOM), which the blocking read or the advice
    that follows would ask for anyway.  Probing the first pieces alone first
    cost a warm window a second submission (about a tenth of its read time).
    """
    return uring_reads.read(ring, files, dataset_id, pieces, buffer, nowait=True)


def advise_willneed(files: ExtentFiles, dataset_id: int, pieces: list[Piece]) -> None:
    """Submit the device reads of every piece at once, without waiting for them.

    `posix_fadvise(WILLNEED)` starts the read and returns, so one thread puts
    a whole window's misses into the device queue within microseconds; the
    reader threads' `preadv`s then only wait for data already on its way.
    One thread advising a whole window beats both no advice and advice from
    each share (docs/DESIGN.md, "Read engine").
    """
    with _with_fds(files, dataset_id, pieces) as walk:
        for fd, (_extent_no, file_offset, _buffer_offset, size) in walk:
            # The kernel reads at most its read-ahead size per call.
            for start in range(file_offset, file_offset + size, limits.willneed_chunk_bytes):
                length = min(limits.willneed_chunk_bytes, file_offset + size - start)
                os.posix_fadvise(fd, start, length, os.POSIX_FADV_WILLNEED)


def read_pieces(files: ExtentFiles, dataset_id: int, pieces: list[Piece],
                buffer: memoryview) -> None:
    """Read `pieces` into `buffer`, one blocking `preadv` per piece.  Runs on a reader thread."""
    with _with_fds(files, dataset_id, pieces) as walk:
        for fd, (extent_no, file_offset, buffer_offset, size) in walk:
            target = buffer[buffer_offset:buffer_offset + size]
            got = os.preadv(fd, [target], file_offset)
            while got < size:
                more = os.preadv(fd, [target[got:]], file_offset + got)
                if more == 0:
                    raise ShortRead(extent_no, file_offset, size, got)
                got += more
