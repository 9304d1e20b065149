"""One data path connection on the daemon: handshake, then one request at a time.

`DataConnection.handshake` reads HELLO (the token checked in constant time
against the daemon's tokens) and answers WELCOME; `serve` then reads each
request frame, parses it (`datapath_frames`), answers it (`replies`) and turns
a `DlfsError` into an ERROR frame naming the request id, counted and
logged as gRPC calls are.  A frame that breaks the protocol gets an ERROR
where possible and ends the connection; idle connections end after
`idle_timeout_s`, and a reply the client does not read for
`stall_timeout_s` ends it too (socket timeouts).  Nothing here imports grpc.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import time

from dlfs import limits, logs
from dlfs.formats import datapath_frames as frames
from dlfs.errors import DlfsError, FailedPrecondition, InvalidArgument, Unauthenticated
from dlfs.server.datapath import replies, uploads
from dlfs.server.metrics import OPERATOR_CODES
from dlfs.sockio import recv_exactly, send_all

log = logging.getLogger("dlfs.server.datapath.listener")


class DataConnection:
    """One accepted connection of `server` (a DataPathServer): its socket and request buffer."""

    def __init__(self, server, sock: socket.socket):
        self.server = server
        self.store = server.store
        self.sock = sock
        self.header = bytearray(frames.FRAME.size)
        self.body = bytearray(1024)
        self.peer = _peer_name(sock)
        self.role: str | None = None  # the HELLO token's role, when the daemon has tokens

    def handshake(self) -> bool:
        """Read HELLO, answer WELCOME; False (after an ERROR) when the client may not stay."""
        self.sock.settimeout(limits.datapath_hello_timeout_s)
        try:
            kind, body = self._request(frames.HELLO.size + limits.datapath_token_bytes_max)
            if kind != frames.Kind.HELLO:
                raise frames.FrameError(f"the first frame must be HELLO, not kind {kind}")
            version, token = frames.parse_hello(body)
        except frames.FrameError as exc:
            self.send([frames.error(InvalidArgument(str(exc)))])
            return False
        authorizer = self.server.authorizer
        if authorizer is not None:
            self.role = authorizer.role(token)
        if authorizer is not None and self.role is None:
            self.send([frames.error(Unauthenticated(
                "this daemon requires a token: pass --token (or set DLFS_TOKEN) with a token "
                "from its tokens file"))])
            return False
        if version < 1:
            self.send([frames.error(FailedPrecondition(
                f"data path version {version} is not supported; this daemon speaks 1 to "
                f"{frames.VERSION}"))])
            return False
        self.send([frames.welcome(min(version, frames.VERSION),
                                     self.server.buffers.window_bytes, self.server.instance)])
        return True

    def serve(self) -> None:
        """Answer requests until the client leaves, idles out, stalls or breaks the protocol."""
        while True:
            self.sock.settimeout(self.server.idle_timeout_s)
            try:
                kind, body = self._request(limits.datapath_request_bytes_max)
            except socket.timeout:
                return  # idle: the client reconnects at its next read
            except frames.FrameError as exc:
                self.send([frames.error(InvalidArgument(str(exc)))])
                return
            if not kind:
                return  # orderly close by the client
            self.sock.settimeout(self.server.stall_timeout_s)
            try:
                request, request_id = _parse(kind, body)
            except frames.FrameError as exc:
                self.send([frames.error(InvalidArgument(str(exc)))])
                return
            with _serving(request_id) as call:
                try:
                    self._handle(kind, request)
                except DlfsError as exc:
                    call.code = exc.status_code_name
                    self.fail(kind, exc)
                except Exception as exc:
                    if uploads.is_closed(exc):
                        call.code = "CANCELLED"
                        return
                    raise
                finally:
                    call.end(_METHODS[kind], self.peer)

    def fail(self, kind: int, exc: DlfsError) -> None:
        """Answer a failed request with an ERROR frame naming the request id; count and
        log it as gRPC calls are."""
        code = exc.status_code_name
        self.store.metrics.count_error(code, _METHODS[kind])
        log.log(logging.WARNING if code in OPERATOR_CODES else logging.DEBUG,
                "%s -> %s: %s", _METHODS[kind], code, exc.message,
                extra={"method": _METHODS[kind], "code": code})
        self.send([frames.error(exc, logs.current_request_id())])

    def _handle(self, kind: int, request) -> None:
        if kind == frames.Kind.GET_BATCH:
            replies.batch(self, request)
        elif kind == frames.Kind.READ_RANGE:
            replies.byte_range(self, request)
        elif kind == frames.Kind.OPEN_DATASET:
            replies.open_dataset(self, *request)
        elif kind == frames.Kind.INGEST_START:
            uploads.ingest(self, request)
        elif kind == frames.Kind.BLOCK_CRCS:
            replies.block_crcs(self, *request)
        else:
            replies.stat_dataset(self, request)

    # --- frames -----------------------------------------------------------------------------

    def _request(self, body_bytes_max: int) -> tuple[int, memoryview]:
        """The next frame; kind 0 when the client closed the connection between frames."""
        view = memoryview(self.header)
        if not recv_exactly(self.sock, view, eof_ok=True):
            return 0, memoryview(b"")
        kind, _flags, length = frames.parse_frame(self.header)
        if length > body_bytes_max:
            raise frames.FrameError(f"a frame of {length} bytes is over the limit of "
                                      f"{body_bytes_max}")
        if len(self.body) < length:
            self.body = bytearray(length)
        body = memoryview(self.body)[:length]
        recv_exactly(self.sock, body)
        return kind, body

    def send(self, buffers: list) -> None:
        send_all(self.sock, buffers)


# Requests by kind, named as in logs and in the dlfs_batches_total "method" label.
_METHODS = {frames.Kind.GET_BATCH: "DataBatch", frames.Kind.READ_RANGE: "DataRange",
            frames.Kind.STAT_DATASET: "DataStat", frames.Kind.OPEN_DATASET: "DataOpen",
            frames.Kind.DATA: "DataBatch", frames.Kind.INGEST_START: "DataIngest",
            frames.Kind.BLOCK_CRCS: "DataBlockCrcs"}


def _parse(kind: int, body: memoryview):
    """(request, request id) of a request frame.  Raises FrameError."""
    if kind == frames.Kind.GET_BATCH:
        request = frames.parse_get_batch(body)
        return request, request.request_id
    if kind == frames.Kind.READ_RANGE:
        request = frames.parse_read_range(body)
        return request, request.request_id
    if kind == frames.Kind.STAT_DATASET:
        return frames.parse_stat_dataset(body)
    if kind == frames.Kind.OPEN_DATASET:
        name, generation, request_id = frames.parse_open_dataset(body)
        return (name, generation), request_id
    if kind == frames.Kind.INGEST_START:
        request = frames.parse_ingest_start(body)
        return request, request.request_id
    if kind == frames.Kind.BLOCK_CRCS:
        name, generation, sample_id, request_id = frames.parse_block_crcs(body)
        return (name, generation, sample_id), request_id
    raise frames.FrameError(f"unknown request kind {kind}")


class _Served:
    """One request being served: its status for the log line written when it ends."""

    def __init__(self):
        self.code = "OK"
        self.started = time.monotonic()

    def end(self, method: str, peer: str) -> None:
        elapsed = time.monotonic() - self.started
        level = logging.WARNING if elapsed >= limits.slow_rpc_log_s else logging.DEBUG
        if log.isEnabledFor(level):
            log.log(level, "%s %s in %.1f ms from %s%s", method, self.code, elapsed * 1e3, peer,
                    " (slow)" if level == logging.WARNING else "",
                    extra={"method": method, "code": self.code,
                           "duration_ms": round(elapsed * 1e3, 3), "peer": peer})


@contextlib.contextmanager
def _serving(request_id: str):
    """Log lines written while serving a request name its id (a fresh one if none came)."""
    binding = logs.bind_request_id(logs.accept_request_id(request_id))
    try:
        yield _Served()
    finally:
        logs.unbind_request_id(binding)


def _peer_name(sock: socket.socket) -> str:
    """The client as logs name it: ip:port, or unix:pid=PID,uid=UID from SO_PEERCRED."""
    try:
        if sock.family == socket.AF_UNIX:
            pid, uid, _gid = struct.unpack("3i", sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            return f"unix:pid={pid},uid={uid}"
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"
