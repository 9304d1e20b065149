"""The Python send of iovec arrays from the daemon's mappings: the iovecs of a window or
of a whole reply (frame headers between the pieces), a send loop over them, and the
rest of a frame after a page could not be read.

The Python twin of native_send.c's send (server/read/mapped_sends.py decides which
runs): the array is built by numpy and handed to libc's `sendmsg` through ctypes,
which releases the interpreter lock while the kernel copies; no Python object per
piece.  Nothing here imports grpc.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import time
from typing import Sequence

import numpy as np

from dlfs.sockio import IOV_MAX, bound_send_wait, send_all

_sendmsg = ctypes.CDLL(None, use_errno=True).sendmsg
_sendmsg.restype = ctypes.c_ssize_t
_sendmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]


class _MsgHdr(ctypes.Structure):
    _fields_ = [("msg_name", ctypes.c_void_p), ("msg_namelen", ctypes.c_uint32),
                ("msg_iov", ctypes.c_void_p), ("msg_iovlen", ctypes.c_size_t),
                ("msg_control", ctypes.c_void_p), ("msg_controllen", ctypes.c_size_t),
                ("msg_flags", ctypes.c_int)]


# struct iovec.
IOVEC = np.dtype([("base", np.uint64), ("len", np.uint64)])


def build_iovecs(head: bytes, later_heads: Sequence[tuple[int, bytes]],
                 buffer_offset: np.ndarray, address: np.ndarray,
                 size: np.ndarray) -> tuple[bytes, np.ndarray, np.ndarray]:
    """(the heads' bytes joined, the iovecs of a send, which iovecs are heads): `head`,
    then the pieces at `address` of `size` bytes each (in buffer-offset order), each
    of `later_heads` (buffer offset, bytes) before the piece at its offset."""
    is_head = np.zeros(len(size) + 1 + len(later_heads), dtype=bool)
    iovecs = np.empty(len(is_head), dtype=IOVEC)
    if not later_heads:  # one window: the common case, in fewer array operations
        head_bytes = np.frombuffer(head, dtype=np.uint8)
        iovecs[0] = (head_bytes.ctypes.data, len(head))
        iovecs["base"][1:] = address
        iovecs["len"][1:] = size
        is_head[0] = True
        return head, iovecs, is_head
    heads = [head, *(h for _, h in later_heads)]
    joined = b"".join(heads)
    head_lengths = np.fromiter(map(len, heads), dtype=np.uint64, count=len(heads))
    # Head k sits before the piece at its offset: after k heads and the pieces before it.
    head_entry = np.arange(len(heads))
    head_entry[1:] += np.searchsorted(
        buffer_offset, np.fromiter((at for at, _ in later_heads), dtype=np.int64))
    is_head[head_entry] = True
    iovecs["base"][head_entry] = np.frombuffer(joined, dtype=np.uint8).ctypes.data + \
        np.concatenate(([0], np.cumsum(head_lengths)[:-1])).astype(np.uint64)
    iovecs["len"][head_entry] = head_lengths
    iovecs["base"][~is_head] = address
    iovecs["len"][~is_head] = size
    return joined, iovecs, is_head


def complete_frame(sock: socket.socket, heads: bytes, lengths: np.ndarray, is_head: np.ndarray,
                   sent: int, deadline: float | None) -> int:
    """After `sent` bytes of the iovecs of `lengths` (those where `is_head` are the
    bytes of `heads`, in order) went out and a piece could not be read: send
    the rest of the frame they stopped in, a head's bytes as they are and the
    pieces' as zeros (the client's checks never pass them), so that the next
    frame the peer reads is whole.  Returns the iovec it stopped in."""
    ends = np.cumsum(lengths)
    entry = int(np.searchsorted(ends, sent, side="right"))
    later = np.flatnonzero(is_head[entry + 1:])
    if later.size:  # the frame ends where the next head starts
        next_head = entry + 1 + int(later[0])
        frame_end = int(ends[next_head]) - int(lengths[next_head])
    else:
        frame_end = int(ends[-1])
    parts: list[bytes] = []
    zeros_from = sent
    if is_head[entry]:  # stopped inside a head: its own bytes first
        head_start = int(np.sum(lengths[:entry][is_head[:entry]]))
        entry_start = int(ends[entry]) - int(lengths[entry])
        parts.append(heads[head_start + sent - entry_start:head_start + int(lengths[entry])])
        zeros_from = int(ends[entry])
    parts.append(bytes(frame_end - zeros_from))
    send_all(sock, parts, deadline=deadline)
    return entry


def send_iovecs(sock: socket.socket, iovecs: np.ndarray, deadline: float | None) -> int | None:
    """Send every byte the iovecs name, at most IOV_MAX per `sendmsg`.  Returns None
    when all went out, or the bytes sent before a page could not be read (EFAULT).
    Raises socket.timeout (the socket's timeout per wait, `deadline` for the whole),
    OSError.  `iovecs` is changed (its first unsent entry is advanced).

    The first `sendmsg` does not wait: a reply the socket buffer takes whole (a
    batch of 4 KiB samples, as a rule) costs that one call.  For the rest the
    socket blocks, each `sendmsg` bounded by SO_SNDTIMEO, and the kernel waits
    for room itself: non-blocking, a reply of 28 MB went out in some twenty
    `sendmsg`s, each after a `poll` and a turn of Python (a third of the
    daemon's user time at 110 KB); blocking, in one call unless the client
    stalls.  The listener's `stop` wakes a blocked call (shutdown)."""
    fd = sock.fileno()
    timeout = sock.gettimeout()
    address = iovecs.ctypes.data
    total = int(iovecs["len"].sum())
    ends = lengths = bases = None  # for a send cut short: made then
    message = _MsgHdr()
    sent = first = 0
    blocking = False
    try:
        while sent < total:
            message.msg_iov = address + first * IOVEC.itemsize
            message.msg_iovlen = min(IOV_MAX, len(iovecs) - first)
            if blocking:
                bound_send_wait(sock, timeout, deadline)
                n = _sendmsg(fd, ctypes.byref(message), socket.MSG_NOSIGNAL)
            else:
                n = _sendmsg(fd, ctypes.byref(message), socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
            if n < 0:
                code = ctypes.get_errno()
                if code == errno.EINTR:
                    continue
                if code == errno.EFAULT:
                    return sent
                if code not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    raise OSError(code, os.strerror(code))
                if blocking:  # SO_SNDTIMEO ran out with nothing taken
                    if deadline is not None and time.monotonic() >= deadline:
                        raise socket.timeout("the reply's deadline passed")
                    raise socket.timeout("the client stopped reading the reply")
                n = 0
            sent += n
            if sent == total:
                break
            if not blocking:
                sock.settimeout(None)
                blocking = True
            if n == 0:
                continue
            if ends is None:  # the iovecs as given, before any is advanced
                lengths, bases = iovecs["len"].copy(), iovecs["base"].copy()
                ends = np.cumsum(lengths)
            first = int(np.searchsorted(ends, sent, side="right"))
            if first < len(iovecs):
                done = sent - (int(ends[first - 1]) if first else 0)
                iovecs["base"][first] = bases[first] + done
                iovecs["len"][first] = lengths[first] - done
    finally:
        if blocking:  # as found: SO_SNDTIMEO bounds no later blocking send
            bound_send_wait(sock, None, None)
            sock.settimeout(timeout)
    return None
