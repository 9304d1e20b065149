"""Whole-buffer socket I/O shared by both ends of the data path, and which accept
errors mean what (for both front doors' accept loops).

Blocking sockets with a timeout may send or receive fewer bytes than
asked; these loops finish the job without copying: `send_all` hands the
kernel a list of buffers per `sendmsg` (a frame header and a window go out
in one system call), `recv_exactly` receives into the caller's memory.

With a `deadline` (on the `time.monotonic()` clock) the whole send or
receive must end by then, however the peer trickles its bytes: each wait
gets at most the time left (one `settimeout` per system call; the socket's
own timeout still bounds each wait, and is put back at the end).  Without
one, the socket's timeout alone bounds each wait.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import time


# Accept errors that mean "no room now" (descriptors, kernel memory), not "no listener".
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# Accept errors of one connection that went away (or a firewall's verdict on it).
TRANSIENT_ERRNOS = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN,
                               errno.EPERM, errno.ENETDOWN, errno.ENOPROTOOPT, errno.EHOSTDOWN,
                               errno.ENONET, errno.EHOSTUNREACH, errno.EOPNOTSUPP,
                               errno.ENETUNREACH})

# Buffers one sendmsg takes at most (the kernel's UIO_MAXIOV).
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def send_all(sock: socket.socket, buffers: list, *, deadline: float | None = None) -> None:
    """Send every buffer, in order, at most IOV_MAX per system call.

    Raises OSError (socket.timeout on a stall or at `deadline`; EFAULT when
    a mapped page cannot be read).
    """
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    timeout = sock.gettimeout()
    try:
        while views:
            if deadline is not None:
                wait_at_most(sock, deadline, timeout)
            sent = sock.sendmsg(views[:IOV_MAX])
            while views and sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            if sent:
                views[0] = views[0][sent:]
    finally:
        if deadline is not None:
            sock.settimeout(timeout)


def recv_exactly(sock: socket.socket, view: memoryview, *, eof_ok: bool = False,
                 deadline: float | None = None) -> bool:
    """Fill `view` from `sock`.

    Returns False when the peer closed the connection before the first byte
    and `eof_ok`; raises ConnectionResetError when it closed in the middle,
    OSError (socket.timeout when nothing came in time, or the whole did not
    by `deadline`) otherwise.
    """
    got = 0
    timeout = sock.gettimeout()
    try:
        while got < len(view):
            if deadline is not None:
                wait_at_most(sock, deadline, timeout)
            n = sock.recv_into(view[got:])
            if n == 0:
                if got == 0 and eof_ok:
                    return False
                raise ConnectionResetError(0, "connection closed in the middle of a frame")
            got += n
        return True
    finally:
        if deadline is not None:
            sock.settimeout(timeout)


def recv_waiting(sock: socket.socket, view: memoryview, *, deadline: float) -> None:
    """Fill `view` from `sock` as `recv_exactly` does (the socket's timeout bounds each
    wait, `deadline` the whole), waiting in the kernel: a blocking `recv` with
    MSG_WAITALL returns once the whole view arrived, where a socket with a timeout
    costs a `poll` and a `recv` (and a turn of Python) per segment the sender's
    kernel delivers, 64 KiB at a time over loopback.  For large payloads.

    Raises socket.timeout, ConnectionResetError (closed in the middle), OSError.
    """
    timeout = sock.gettimeout()
    sock.settimeout(None)  # blocking; SO_RCVTIMEO bounds each call instead
    try:
        got = 0
        while got < len(view):
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("the deadline passed")
            wait = left if timeout is None else min(left, timeout)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(wait))
            try:
                n = sock.recv_into(view[got:], 0, socket.MSG_WAITALL)
            except BlockingIOError:  # SO_RCVTIMEO ran out with nothing received
                raise socket.timeout("timed out") from None
            if n == 0:
                raise ConnectionResetError(0, "connection closed in the middle of a frame")
            got += n
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(0))
        sock.settimeout(timeout)


def _timeval(seconds: float) -> bytes:
    """A struct timeval of `seconds` (0: no timeout; anything else at least 1 us)."""
    micros = max(1, round(seconds * 1e6)) if seconds > 0 else 0
    return struct.pack("ll", micros // 1_000_000, micros % 1_000_000)


def wait_at_most(sock: socket.socket, deadline: float, bound_s: float | None = None) -> None:
    """Let the next system call on `sock` wait only until `deadline` (and at most
    `bound_s`); raises socket.timeout when the deadline passed already."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout("the deadline passed")
    sock.settimeout(left if bound_s is None else min(left, bound_s))


def bound_send_wait(sock: socket.socket, timeout: float | None, deadline: float | None) -> None:
    """Let the next send on the blocking socket `sock` wait at most `timeout` seconds
    (None: no bound) and not past `deadline` (time.monotonic()), by SO_SNDTIMEO (a
    send then returns what it sent, or fails with EAGAIN when it sent nothing);
    raises socket.timeout when the deadline passed already."""
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("the reply's deadline passed")
        timeout = left if timeout is None else min(timeout, left)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(timeout or 0))


def wait_writable(fd: int, timeout: float | None, deadline: float | None) -> None:
    """Wait until the socket `fd` takes bytes: at most `timeout` seconds (None: no bound)
    and not past `deadline` (time.monotonic()); raises socket.timeout otherwise."""
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("the reply's deadline passed")
        timeout = left if timeout is None else min(timeout, left)
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    if not poller.poll(None if timeout is None else timeout * 1000):
        raise socket.timeout("the client stopped reading the reply")


def unix_address(name: str):
    """The `bind`/`connect` address of a Unix socket: a path, or "@name" in the
    abstract namespace (Linux: no file, gone with the process, reachable from
    the same network namespace only)."""
    return b"\0" + name[1:].encode() if name.startswith("@") else name
