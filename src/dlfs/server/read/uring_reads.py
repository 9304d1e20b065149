"""Pieces of a window read through the calling thread's io_uring, one submission each.

`dlfs.server.read.read_engine` sends windows of at least `limits.uring_pieces_min`
pieces this way (small samples): the probe of the page cache (RWF_NOWAIT)
and, on the data path, the blocking read of what it lacked.  One system
call and one release of the GIL per window instead of one per piece: with
four 4 KiB batches in flight the daemon's reads otherwise hand the GIL back
and forth hundreds of times a window (docs/DESIGN.md, "One submission per
window of small pieces").
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os

import numpy as np

from dlfs.server.read import uring
from dlfs.server.core.extents import ExtentFiles
from dlfs.server.read.batch_planning import Piece, PieceColumns

log = logging.getLogger(__name__)


def columns(pieces) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(extent, file offset, buffer offset, bytes) arrays of `pieces`."""
    if isinstance(pieces, PieceColumns):
        return pieces.extent, pieces.file_offset, pieces.buffer_offset, pieces.size
    table = np.array(pieces, dtype=np.int64).reshape(-1, 4)
    return table[:, 0], table[:, 1], table[:, 2], table[:, 3]


@contextlib.contextmanager
def _descriptors(files: ExtentFiles, dataset_id: int, extent: np.ndarray):
    """The descriptor of each entry's extent (int32 array), each extent acquired once
    and held until the block ends."""
    first = int(extent[0]) if extent.size else 0
    if (extent == first).all():
        # One extent (1 GiB each: most windows): no sort of the extent numbers.
        with files.acquire(dataset_id, first) as fd:
            yield np.full(extent.size, fd, np.int32)
        return
    extents, which = np.unique(extent, return_inverse=True)
    with files.acquire_all(dataset_id, extents.tolist()) as fds:
        yield np.array(fds, dtype=np.int32)[which]


def read(ring: uring.RingReads, files: ExtentFiles, dataset_id: int, pieces,
         buffer: memoryview, *, nowait: bool) -> list[Piece] | None:
    """Read `pieces` into `buffer` in one submission; returns the pieces (or their
    remainders) not read.

    With `nowait`, what the page cache lacked (a miss costs little: the
    kernel starts reading it and answers EAGAIN).  Without, the thread waits
    for the device, and what comes back are pieces the kernel cut short
    (the end of an extent): the caller reads them again one by one, which
    tells a truncated extent from a short read.  None when the ring cannot
    take these pieces (the caller reads one piece per call).  Raises OSError
    for a failed read.
    """
    extent, file_offset, buffer_offset, size = columns(pieces)
    # The kernel writes at raw addresses: every piece must lie inside the buffer.
    if (buffer.readonly or (buffer_offset < 0).any() or (size <= 0).any()
            or (buffer_offset + size > len(buffer)).any()
            or int(size.max()) > uring.READ_BYTES_MAX):
        return None
    with _descriptors(files, dataset_id, extent) as fds:
        try:
            results = ring.read(fds, file_offset, uring.buffer_address(buffer) + buffer_offset,
                                size, uring.RWF_NOWAIT if nowait else 0)
        except OSError as exc:
            # The ring itself failed (not a read): no reads are in flight, so
            # this window and every later one go one preadv per piece.
            log.warning("io_uring failed (%s): reading one system call per piece from now on",
                        exc)
            uring.refuse(f"io_uring failed: {exc}")
            return None
    short = np.flatnonzero(results < size)
    if not short.size:
        return []
    failed = results[short]
    errors = failed[(failed < 0) & (failed != -errno.EAGAIN) & (failed != -errno.EINTR)]
    if errors.size:
        code = -int(errors[0])
        if nowait and code in (errno.EOPNOTSUPP, errno.EINVAL):
            # An io_uring without what this needs: the preadv path decides
            # whether RWF_NOWAIT itself works.
            uring.refuse(f"io_uring reads with RWF_NOWAIT failed: {os.strerror(code)}")
            return None
        raise OSError(code, os.strerror(code))
    got = np.maximum(failed, 0)
    return list(zip(extent[short].tolist(), (file_offset[short] + got).tolist(),
                    (buffer_offset[short] + got).tolist(), (size[short] - got).tolist()))


def advise(ring: uring.RingReads, files: ExtentFiles, dataset_id: int, pieces,
           chunk_bytes: int) -> None:
    """WILLNEED advice for every piece in one submission, pieces cut into advice calls
    of at most `chunk_bytes` (the kernel reads at most its read-ahead size per call).
    Raises OSError when an advice call fails."""
    extent, file_offset, _buffer_offset, size = columns(pieces)
    if not size.size:
        return
    calls = (size + chunk_bytes - 1) // chunk_bytes
    piece = np.repeat(np.arange(size.size), calls)
    # Position of each call within its piece: 0, 1, ... calls-1.
    nth = np.arange(piece.size) - np.repeat(np.cumsum(calls) - calls, calls)
    offsets = file_offset[piece] + nth * chunk_bytes
    lengths = np.minimum(chunk_bytes, file_offset[piece] + size[piece] - offsets)
    with _descriptors(files, dataset_id, extent[piece]) as fds:
        results = ring.advise(fds, offsets, lengths)
    failed = results[results < 0]
    if failed.size:
        code = -int(failed[0])
        raise OSError(code, f"posix_fadvise(WILLNEED): {os.strerror(code)}")


def all_cached(ring: uring.RingReads, files: ExtentFiles, dataset_id: int, pieces) -> bool:
    """Whether the page cache holds the middle byte of every piece (one submission of
    one-byte RWF_NOWAIT reads; nothing else is copied).  A piece's first page may
    be cached only because it ends the piece before, hence the middle."""
    extent, file_offset, _buffer_offset, size = columns(pieces)
    if not size.size:
        return True
    scratch = np.zeros(size.size, np.uint8)
    with _descriptors(files, dataset_id, extent) as fds:
        results = ring.read(fds, file_offset + size // 2,
                            scratch.ctypes.data + np.arange(size.size, dtype=np.uint64),
                            np.ones(size.size, np.uint32), uring.RWF_NOWAIT)
    return bool((results == 1).all())
