"""How the data path ends a connection it will not serve: one ERROR frame that says
why, then a close that lets the frame arrive.  Nothing here imports grpc."""

from __future__ import annotations

import socket
import time

from dlfs import limits
from dlfs.errors import DlfsError
from dlfs.formats import datapath_frames as frames
from dlfs.sockio import send_all, wait_at_most


def refuse(sock: socket.socket, error: DlfsError) -> None:
    """Answer a connection that cannot be served with one ERROR frame, then close it."""
    try:
        send_all(sock, [frames.error(error)],
                 deadline=time.monotonic() + limits.datapath_error_send_s)
    except OSError:
        pass
    close_connection(sock, drain=False)


def close_connection(sock: socket.socket, *, drain: bool = True) -> None:
    """Close so that a last ERROR frame arrives: closing with unread input would reset
    the connection, and with `drain` the client's unread bytes are read first (at
    most `limits.datapath_drain_bytes_max`, for at most `limits.datapath_drain_s`).
    The frame survives a reset on Linux, but a client's send then fails instead of
    finishing; a connection that never authenticated is not owed that."""
    try:
        sock.shutdown(socket.SHUT_WR)
        if drain:
            give_up = time.monotonic() + limits.datapath_drain_s
            drained = 0
            chunk = bytearray(65536)
            while drained < limits.datapath_drain_bytes_max:
                wait_at_most(sock, give_up)
                n = sock.recv_into(chunk)
                if not n:
                    break
                drained += n
    except OSError:
        pass
    finally:
        sock.close()
