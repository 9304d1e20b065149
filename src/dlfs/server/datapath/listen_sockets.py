"""The data path's listening sockets: bound once by the main process, shared by its
workers (each accepts on the same sockets), closed and freed by the main process.
Nothing here imports grpc."""

from __future__ import annotations

import contextlib
import os
import socket

from dlfs.sockio import unix_address

# Connections the kernel queues for accept() on each listener.
LISTEN_BACKLOG = 128


def bind_listeners(tcp_host: str | None, tcp_port: int,
                   unix_socket: str) -> tuple[list[socket.socket], int]:
    """(listening sockets, the TCP port bound): TCP on `tcp_host`:`tcp_port` (port 0
    picks one; no TCP when `tcp_host` is None) and the Unix socket `unix_socket` (a
    path, "@name" in the abstract namespace, "" for none).  Raises RuntimeError
    naming an address that cannot be bound (nothing stays bound then)."""
    bound: list[socket.socket] = []
    port = 0
    path_bound = ""  # the Unix socket's path once it is ours to free
    try:
        if tcp_host is not None:
            family = socket.AF_INET6 if ":" in tcp_host else socket.AF_INET
            listener = socket.socket(family, socket.SOCK_STREAM)
            bound.append(listener)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((tcp_host.strip("[]"), tcp_port))
            port = listener.getsockname()[1]
            listener.listen(LISTEN_BACKLOG)
        if unix_socket:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            bound.append(listener)
            listener.bind(unix_address(unix_socket))
            path_bound = unix_socket
            if not unix_socket.startswith("@"):
                os.chmod(unix_socket, 0o666)  # tokens, not file modes, guard it
            listener.listen(LISTEN_BACKLOG)
    except OSError as exc:
        close_listeners(bound, path_bound)
        raise RuntimeError(f"cannot listen for the data path: {exc.strerror or exc}") from None
    return bound, port


def close_listeners(listeners: list[socket.socket], unix_socket: str) -> None:
    """Close listening sockets this process bound (every process that shares them
    stops accepting: their accept() fails) and free the Unix socket's path."""
    for listener in listeners:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the threads blocked in accept()
        listener.close()
    if unix_socket and not unix_socket.startswith("@"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(unix_socket)
