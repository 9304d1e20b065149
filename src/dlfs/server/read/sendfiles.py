"""Windows of cached large pieces sent straight from the page cache (`sendfile`).

Why (docs/DESIGN.md, "How the daemon sends"): reading a window into a
buffer and sending it copies every byte twice in the daemon; `sendfile`
hands the socket references to the extent's page-cache pages (a NIC sends
them by DMA; over loopback or a Unix socket the receiver's `recv_into`
makes the one copy): about twice the bandwidth for a third of the
sender's CPU of reading into a buffer and sending it.

Only for windows whose pieces average at least
`limits.sendfile_piece_bytes_min` (a system call per piece must be worth
it) and whose pages are all in the page cache (the last scan of the extents'
mappings where they are mapped: ExtentMaps.resident; else `cachestat(2)` on
Linux 6.5+, `mincore(2)` on a mapping before, a call per piece; no byte
copied; residency.py): a `sendfile` of an uncached range would wait for the
device a piece at a time, so those windows go the read path, which keeps
the device queue full.  A piece that ends early (a truncated extent) is
padded with zeros to the frame's announced length and reported as
`ShortRead`: the connection then answers with an ERROR frame, and the
client, which checks every sample's CRC32C, never hands out the zeros.
Nothing here imports grpc.
"""

from __future__ import annotations

import os
import socket
from typing import Callable

import numpy as np

from dlfs import limits
from dlfs.server.core.extents import ExtentFiles
from dlfs.server.read.batch_planning import PieceColumns
from dlfs.server.read.preadv_reads import ShortRead
from dlfs.server.read.residency import all_cached, noted
from dlfs.sockio import send_all, wait_writable

_FIRST = np.zeros(1, dtype=np.intp)  # the one extent of a one-piece window


def state(enabled: bool) -> str:
    """What `dlfs status` says of this path: "on" (noting residency asked by mincore
    where the kernel has no cachestat), or "off" and why."""
    if not enabled:
        return "off (--sendfile off)"
    return noted("on")


def worth(pieces: PieceColumns) -> bool:
    """Whether a window of `pieces` is large-piece enough to be sent by `sendfile`."""
    count = len(pieces)
    return 0 < count <= limits.sendfile_pieces_max and \
        int(pieces.size.sum()) >= count * limits.sendfile_piece_bytes_min


def send(sock: socket.socket, files: ExtentFiles, dataset_id: int, pieces: PieceColumns,
         head: bytes, *, before: Callable[[], None] | None = None,
         deadline: float | None = None,
         known: Callable[[np.ndarray, np.ndarray, np.ndarray], bool | None] | None = None
         ) -> bool:
    """Send `head`, then `pieces` in buffer-offset order (they must tile the window),
    each by `sendfile` from its extent, if the page cache holds all of them.

    Whether it does: `known(extent, offset, size)` where it answers (the
    extents' mapping scans: ExtentMaps.resident), else the kernel, a system
    call per piece (residency.all_cached).  Returns False, having sent
    nothing, when some page is not cached;
    `before()` runs once they are known cached, before anything is sent.
    Raises ShortRead after padding the window when an extent ends early,
    socket.timeout when the peer stops reading for the socket's timeout or
    when `deadline` (time.monotonic()) passes first, OSError.
    """
    if len(pieces) == 1:  # one sample (a mount's file): nothing to order
        extent, offset, size = pieces.extent, pieces.file_offset, pieces.size
        numbers, which = extent, _FIRST
    else:
        order = np.argsort(pieces.buffer_offset, kind="stable")
        extent, offset, size = pieces.extent[order], pieces.file_offset[order], pieces.size[order]
        numbers, which = np.unique(extent, return_inverse=True)
    answer = known(extent, offset, size) if known is not None else None
    if answer is False:
        return False
    with files.acquire_all(dataset_id, numbers.tolist()) as held:
        fds = np.array(held, dtype=np.int64)[which]
        if answer is None and not all_cached(fds, offset, size):
            return False
        if before is not None:
            before()
        timeout = sock.gettimeout()
        send_all(sock, [head], deadline=deadline)
        out = sock.fileno()
        pieces_left = zip(extent.tolist(), fds.tolist(), offset.tolist(), size.tolist())
        for index, (extent_no, fd, start, length) in enumerate(pieces_left):
            got = _sendfile(out, fd, start, length, timeout, deadline)
            if got < length:
                # Keep the framing whole: the rest of the window as zeros, then the error.
                send_all(sock, [bytes(int(size[index:].sum()) - got)], deadline=deadline)
                raise ShortRead(extent_no, start, length, got)
    return True


def _sendfile(out: int, fd: int, offset: int, count: int, timeout: float | None,
              deadline: float | None) -> int:
    """`sendfile` until `count` bytes went out or the file ended; returns the bytes sent."""
    sent = 0
    while sent < count:
        try:
            n = os.sendfile(out, fd, offset + sent, count - sent)
        except BlockingIOError:
            wait_writable(out, timeout, deadline)
            continue
        if n == 0:
            break
        sent += n
    return sent
