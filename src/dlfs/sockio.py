"""Whole-buffer socket I/O shared by both ends of the data path.

Blocking sockets with a timeout may send or receive fewer bytes than
asked; these loops finish the job without copying: `send_all` hands the
kernel a list of buffers per `sendmsg` (a frame header and a window go out
in one system call), `recv_exactly` receives into the caller's memory.
"""

from __future__ import annotations

import os
import socket


# Buffers one sendmsg takes at most (the kernel's UIO_MAXIOV).
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def send_all(sock: socket.socket, buffers: list) -> None:
    """Send every buffer, in order, at most IOV_MAX per system call.

    Raises OSError (socket.timeout on a stall; EFAULT when a mapped page
    cannot be read).
    """
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        sent = sock.sendmsg(views[:IOV_MAX])
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if sent:
            views[0] = views[0][sent:]


def recv_exactly(sock: socket.socket, view: memoryview, *, eof_ok: bool = False) -> bool:
    """Fill `view` from `sock`.

    Returns False when the peer closed the connection before the first byte
    and `eof_ok`; raises ConnectionResetError when it closed in the middle,
    OSError (socket.timeout when nothing came in time) otherwise.
    """
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            if got == 0 and eof_ok:
                return False
            raise ConnectionResetError(0, "connection closed in the middle of a frame")
        got += n
    return True


def unix_address(name: str):
    """The `bind`/`connect` address of a Unix socket: a path, or "@name" in the
    abstract namespace (Linux: no file, gone with the process, reachable from
    the same network namespace only)."""
    return b"\0" + name[1:].encode() if name.startswith("@") else name
