"""The control channel between the daemon's main process and one data path worker.

A Unix SOCK_SEQPACKET socketpair: each message is one JSON object in one
packet (the kernel keeps message boundaries and order), with descriptors
riding on it (SCM_RIGHTS: a dataset's shared index, a connection handed
over).  Messages, main -> worker: `start` (settings), `publish` (a
dataset's index descriptor), `remove`, `state_end`, `go`, `stats`,
`missing_reply`, `stop`; worker -> main: `hello`, `ack`, `ready`, `released`,
`stats_reply`, `missing`, `first_read`, `ingest` (a connection handed over
with the request it carried).  workers.py and worker_main.py say what each
means; the order of a channel is the order its messages were sent in.
A worker's first message is `hello` (its interpreter is up and reading).

Bounds: `limits.worker_control_message_bytes_max` per message (larger
ones raise ValueError before anything is sent), `limits.worker_control_fds_max`
descriptors per message.  Nothing here imports grpc.
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
import threading
from typing import Sequence

from dlfs import limits


class ChannelClosed(Exception):
    """The other end of a control channel went away (its process exited)."""


class ControlChannel:
    """One end of a control channel.  `send` is thread-safe; one thread receives.

    `send_timeout_s`: a send that finds the peer's buffer full for this long
    raises socket.timeout (a peer that stopped reading its channel).
    """

    def __init__(self, sock: socket.socket, send_timeout_s: float | None = None):
        self.sock = sock
        self._send_lock = threading.Lock()
        if send_timeout_s is not None:
            # At the socket, not `settimeout`: that would bound the receiving
            # thread's wait for the next message too.
            seconds = int(send_timeout_s)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack(
                "ll", seconds, int((send_timeout_s - seconds) * 1e6)))
        # Both directions carry at most a few messages at once; room for a few
        # of the largest ones (the kernel caps it at net.core.wmem_max).
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option,
                                4 * limits.worker_control_message_bytes_max)
            except OSError:
                pass

    @classmethod
    def pair(cls, send_timeout_s: float = limits.worker_ack_timeout_s
             ) -> tuple["ControlChannel", socket.socket]:
        """(the main process's end, whose sends give up after `send_timeout_s`, and the
        socket to pass to the worker)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.set_inheritable(False)
        theirs.set_inheritable(True)
        return cls(mine, send_timeout_s=send_timeout_s), theirs

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: dict, fds: Sequence[int] = ()) -> None:
        """Send `message` (JSON-serialisable) with `fds` (duplicated into the peer).

        Raises ValueError (too large, too many descriptors), ChannelClosed
        (the peer is gone), socket.timeout (its buffer stayed full).
        """
        data = json.dumps(message, separators=(",", ":")).encode()
        if len(data) > limits.worker_control_message_bytes_max:
            raise ValueError(f"a control message of {len(data)} bytes is over the limit of "
                             f"{limits.worker_control_message_bytes_max}")
        if len(fds) > limits.worker_control_fds_max:
            raise ValueError(f"{len(fds)} descriptors in one control message; at most "
                             f"{limits.worker_control_fds_max}")
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds \
            else []
        with self._send_lock:
            try:
                self.sock.sendmsg([data], ancillary)
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise ChannelClosed(str(exc)) from None
            except BlockingIOError:
                raise socket.timeout("the peer stopped reading its control channel") from None

    def receive(self) -> tuple[dict, list[int]]:
        """The next message and the descriptors it carried (the caller owns them).

        Blocks.  Raises ChannelClosed at the end of the channel, ValueError
        for a message that is not one JSON object (after closing any
        descriptors that came with it).
        """
        space = socket.CMSG_SPACE(limits.worker_control_fds_max * array.array("i").itemsize)
        try:
            data, ancillary, flags, _ = self.sock.recvmsg(
                limits.worker_control_message_bytes_max + 1, space)
        except OSError as exc:  # reset, or the socket was closed under this thread
            raise ChannelClosed(str(exc)) from None
        fds: list[int] = []
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", raw[:len(raw) - len(raw) % 4]))
        if not data and not fds:
            raise ChannelClosed("the peer closed its end")
        try:
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                raise ValueError("a control message was cut short")
            message = json.loads(data)
            if not isinstance(message, dict) or "type" not in message:
                raise ValueError("a control message must be an object with a type")
        except ValueError:
            for fd in fds:
                os.close(fd)
            raise
        return message, fds

    def close(self) -> None:
        self.sock.close()
