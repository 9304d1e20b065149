"""One data path connection on the daemon: handshake, then one request at a time.

`ServedConnection.handshake` reads HELLO (the token checked in constant time
against the daemon's tokens), has the connection admitted (`admission`: the
daemon's connection limit and the peer's share) and answers WELCOME, with
the daemon's limits when the client asked for them; `serve` then reads each
request frame, parses it (`datapath_frames`), answers it (`replies`) and
turns a `DlfsError` into an ERROR frame naming the request id, counted and
logged as gRPC calls are.  A frame that breaks the protocol, or asks for
more than the daemon's limits allow, gets an ERROR that says why and ends
the connection.

Deadlines are for whole operations on the monotonic clock: the handshake
(HELLO whole within `limits.datapath_hello_timeout_s` of the accept), a
request frame (whole within `limits.datapath_request_timeout_s` of its
first byte), a reply (`reply_deadline`); idle connections end after
`idle_timeout_s` without a first byte, and a reply the client does not read
for `stall_timeout_s` ends it too.  Nothing here imports grpc.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import select
import socket
import struct
import time
from typing import Callable

from dlfs import limits, logs
from dlfs.errors import (
    DeadlineExceeded,
    DlfsError,
    InvalidArgument,
    Overloaded,
    Unauthenticated,
    VersionMismatch,
)
from dlfs.formats import datapath_frames as frames
from dlfs.formats import datapath_writes
from dlfs.server.datapath import file_writes, replies, uploads
from dlfs.server.metrics import OPERATOR_CODES
from dlfs.sockio import recv_exactly, send_all
from dlfs.version import interoperates, mismatch_message

log = logging.getLogger("dlfs.server.datapath.listener")


class ServedConnection:
    """One accepted connection of `server` (a DataPathServer): its socket, its admission
    `entry` and its request buffer."""

    def __init__(self, server, entry):
        self.server = server
        self.store = server.store
        self.entry = entry
        self.sock = entry.sock
        self.peer_key = entry.peer  # whose share it counts against
        self.header = bytearray(frames.FRAME.size)
        self.body = bytearray(1024)
        self.peer = _peer_name(self.sock)  # as logs name it
        # Replies to it send cached windows of large samples from mappings, not sendfile.
        self.same_host_tcp = _same_host_tcp(self.sock)
        self.role: str | None = None  # the HELLO token's role, when the daemon has tokens
        # Set by an `ingest` hook that handed the socket to another process: serving
        # ends and the socket is closed here without shutting the connection down.
        self.detached = False
        self.request_body: memoryview = memoryview(b"")  # the request being answered
        self._writable: select.poll | None = None  # polls the socket for room to send
        self._started = False  # the frame being read has begun to arrive

    def handshake(self) -> bool:
        """Read HELLO, answer WELCOME; False (after an ERROR where one can be sent) when
        the client may not stay: a bad HELLO, a bad token, no common version, the
        daemon's limit or the peer's share reached, the handshake's deadline passed,
        or the connection evicted by newer ones while it had not finished its HELLO."""
        entry = self.entry
        try:
            kind, _flags, body = self._frame(_hello_bytes_max, deadline=entry.deadline)
            if entry.evicted or not kind:
                raise ConnectionResetError(0, "closed before its HELLO")
            if kind != frames.Kind.HELLO:
                raise frames.FrameError(f"the first frame must be HELLO, not kind {kind}")
            hello = frames.parse_hello(body)
        except frames.FrameError as exc:
            self._refuse(InvalidArgument(str(exc)), "malformed")
            return False
        except OSError as exc:
            if entry.evicted:
                self._refuse(self.server.admission.eviction_error(), "handshake_evicted")
            elif isinstance(exc, socket.timeout):
                self._refuse(DeadlineExceeded(
                    f"the HELLO did not arrive whole within "
                    f"{limits.datapath_hello_timeout_s:g} s of the connect; send it at once"),
                    "handshake_deadline")
            return False
        if hello.version != frames.VERSION or not interoperates(hello.release):
            self._refuse(VersionMismatch(mismatch_message("client", hello.release,
                                                          this="daemon")), "version")
            return False
        authorizer = self.server.authorizer
        if authorizer is not None:
            self.role = authorizer.role(hello.token)
        if authorizer is not None and self.role is None:
            self._refuse(Unauthenticated(
                "this daemon requires a token: pass --token (or set DLFS_TOKEN) with a token "
                "from its tokens file"), "unauthenticated")
            return False
        try:
            self.server.admission.admit(entry)
        except Overloaded as exc:
            self._refuse(exc, exc.refusal)
            return False
        self.server.count_connections()
        self.send([frames.welcome(self.server.buffers.window_bytes, self.server.instance,
                                  self.server.limits)])
        return True

    def serve(self, first: tuple[int, bytes] | None = None) -> None:
        """Answer requests until the client leaves, idles out, stalls or breaks the protocol.
        `first`: a request frame (kind, body) another process read on this connection
        (listener.DataPathServer.adopt), answered before the next one is read."""
        ids_max = self.store.batch_limits.ids_max

        def body_bytes_max(kind: int) -> int | None:
            return frames.request_body_bytes_max(kind, ids_max)

        while True:
            # A wait for anything that is not deadline-bound (FDS frames of OPEN_DATASET).
            self.sock.settimeout(self.server.stall_timeout_s)
            try:
                if first is not None:
                    (kind, body), first = first, None
                    body = memoryview(body)
                else:
                    kind, _flags, body = self._frame(body_bytes_max,
                                                     idle_s=self.server.idle_timeout_s)
            except socket.timeout:
                if not self._started:
                    self._cut_off("idle")  # the client reconnects at its next read
                    return
                self._cut_off("request")
                with contextlib.suppress(OSError):
                    self.send([frames.error(DeadlineExceeded(
                        f"a request frame did not arrive whole within "
                        f"{limits.datapath_request_timeout_s:g} s of its first byte; send "
                        "each request at once"))],
                        deadline=time.monotonic() + limits.datapath_error_send_s)
                return
            except frames.FrameError as exc:
                self.send([frames.error(InvalidArgument(str(exc)))])
                return
            except DlfsError as exc:  # a batch over the daemon's limits, refused by its size
                self.fail(frames.Kind.GET_BATCH, exc)
                return
            if not kind:
                return  # orderly close by the client
            self.server.count_request()
            self.request_body = body
            try:
                request, request_id = _parse(kind, body)
            except frames.FrameError as exc:
                self.send([frames.error(InvalidArgument(str(exc)))])
                return
            with _serving(request_id) as call:
                try:
                    self._handle(kind, request)
                except socket.timeout:
                    call.code = "CANCELLED"
                    self._cut_off("reply")  # the client stopped reading, or too slowly
                    return
                except DlfsError as exc:
                    call.code = exc.status_code_name
                    self.fail(kind, exc)
                except Exception as exc:
                    if uploads.is_closed(exc) or isinstance(exc, file_writes.ConnectionEnded):
                        call.code = "CANCELLED"
                        return
                    raise
                finally:
                    call.end(_METHODS[kind], self.peer)
            if self.detached:
                return

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
            self.server.ingest(self, request)
        elif kind == frames.Kind.FILE_OPEN:
            self.server.write_file(self, request)
        elif kind == frames.Kind.BLOCK_CRCS:
            replies.block_crcs(self, *request)
        else:
            replies.stat_dataset(self, request)

    # --- deadlines ----------------------------------------------------------------------------

    def reply_deadline(self, payload_bytes: int) -> float:
        """When a reply of `payload_bytes` must have gone out (time.monotonic()): the
        stall timeout plus its payload at `limits.datapath_reply_bytes_per_s_min`."""
        return time.monotonic() + self.server.stall_timeout_s +             payload_bytes / limits.datapath_reply_bytes_per_s_min

    def wait_writable(self, deadline: float) -> None:
        """Wait, holding nothing, until the client made room in the socket.  Raises
        socket.timeout when it made none for the stall timeout, or at `deadline`."""
        left = deadline - time.monotonic()
        wait_s = min(left, self.server.stall_timeout_s)
        if self._writable is None:
            self._writable = select.poll()
            self._writable.register(self.sock, select.POLLOUT)
        if wait_s <= 0 or not self._writable.poll(wait_s * 1000):
            raise socket.timeout("the client stopped reading the reply" if wait_s > 0
                                 else "the reply's deadline passed")

    # --- frames -----------------------------------------------------------------------------

    def _frame(self, body_bytes_max: Callable[[int], int | None], *,
               deadline: float | None = None,
               idle_s: float | None = None) -> tuple[int, int, memoryview]:
        """(kind, flags, body) of the next frame; kind 0 when the client closed the
        connection between frames.  The header is checked against its kind's largest
        body (`body_bytes_max(kind)`; None: no such frame is due here) before any of
        the body is read or a buffer grown for it.  The whole frame must arrive by
        `deadline`, or, with `idle_s`, within `limits.datapath_request_timeout_s` of
        its first byte, which may take `idle_s`.  Raises socket.timeout, FrameError,
        and (with `idle_s`: serving requests) InvalidArgument for a GET_BATCH over
        the daemon's batch limits."""
        view = memoryview(self.header)
        self._started = False
        if idle_s is not None:
            self.sock.settimeout(idle_s)
            got = self.sock.recv_into(view)
            if not got:
                return 0, 0, memoryview(b"")
            self._started = True  # a frame began: the request deadline runs
            deadline = time.monotonic() + limits.datapath_request_timeout_s
            recv_exactly(self.sock, view[got:], deadline=deadline)
        elif not recv_exactly(self.sock, view, eof_ok=True, deadline=deadline):
            return 0, 0, memoryview(b"")
        kind, flags, length = frames.parse_frame(self.header)
        limit = body_bytes_max(kind)
        if limit is None:
            raise frames.FrameError(f"frame kind {frames.kind_name(kind)} is not a request")
        if length > limit:
            self._oversized(kind, length, limit, requests=idle_s is not None)
        if len(self.body) < length:
            self.body = bytearray(length)
        body = memoryview(self.body)[:length]
        recv_exactly(self.sock, body, deadline=deadline)
        return kind, flags, body

    def _oversized(self, kind: int, length: int, body_bytes_max: int, *,
                   requests: bool) -> None:
        """Raise why a frame of `length` bytes is refused: a GET_BATCH (a request, past
        the handshake) of more ids than the daemon's limit gets the batch limit's own
        error (the one gRPC gives, and the client gives when it knows the limit) when
        its fixed part came with its header, any other frame its size (FrameError).
        Nothing is waited for: the fixed part is only peeked at, if it is there."""
        if requests and kind == frames.Kind.GET_BATCH and length >= frames.GET_BATCH.size:
            fixed = bytearray(frames.GET_BATCH.size)
            timeout_s = self.sock.gettimeout()
            self.sock.settimeout(0)  # a socket with a timeout would wait for it in poll()
            try:
                got = self.sock.recv_into(fixed, len(fixed), socket.MSG_PEEK)
            except OSError:
                got = 0  # none there yet: refused by its size
            finally:
                self.sock.settimeout(timeout_s)
            if got == len(fixed):
                self.store.batch_limits.check_count(frames.get_batch_ids(fixed))
        raise frames.FrameError(f"a frame of kind {frames.kind_name(kind)} announces {length} "
                                f"bytes, over the limit of {body_bytes_max} for its kind")

    def send(self, buffers: list, deadline: float | None = None) -> None:
        """Send frames, by `deadline` (default: the stall timeout from now)."""
        send_all(self.sock, buffers, deadline=deadline if deadline is not None
                 else time.monotonic() + self.server.stall_timeout_s)

    def _cut_off(self, reason: str) -> None:
        """Count a served connection the daemon ends for its client's pace: `idle`, a
        `request` that did not arrive whole in time, a `reply` not read in time."""
        self.store.metrics.data_cut_off.labels(reason).inc()
        log.debug("%s: cut off (%s)", self.peer, reason)

    def _refuse(self, error: DlfsError, reason: str) -> None:
        """Answer a connection that may not stay, counted under `reason`."""
        self.store.metrics.data_refused.labels(reason).inc()
        with contextlib.suppress(OSError):
            self.send([frames.error(error)],
                      deadline=time.monotonic() + limits.datapath_error_send_s)


def _hello_bytes_max(_kind: int) -> int:
    """The largest first frame (due: a HELLO) a connection may announce."""
    return frames.HELLO.size + limits.datapath_token_bytes_max


# Requests by kind, named as in logs and in the dlfs_batches_total "method" label.
_METHODS = {frames.Kind.GET_BATCH: "DataBatch", frames.Kind.READ_RANGE: "DataRange",
            frames.Kind.STAT_DATASET: "DataStat", frames.Kind.OPEN_DATASET: "DataOpen",
            frames.Kind.DATA: "DataBatch", frames.Kind.INGEST_START: "DataIngest",
            frames.Kind.BLOCK_CRCS: "DataBlockCrcs", frames.Kind.FILE_OPEN: "DataWrite"}


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
    if kind == frames.Kind.FILE_OPEN:
        request = datapath_writes.parse_file_open(body)
        return request, request.request_id
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


def _same_host_tcp(sock: socket.socket) -> bool:
    """Whether `sock` is TCP to a client on this host: from a loopback address or from
    one of this host's own (the kernel routes those over loopback too).  Such bytes
    never reach a NIC, so `sendfile`'s saved copy buys nothing there, and over the
    loopback it measured dearer than one `sendmsg` from mappings (docs/DESIGN.md,
    "How the daemon sends").  A client in another network namespace counts as
    another host."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    try:
        peer = ipaddress.ip_address(sock.getpeername()[0])
    except (OSError, ValueError):  # gone already, or a scoped IPv6 address
        return False
    peer = getattr(peer, "ipv4_mapped", None) or peer
    if peer.is_loopback:
        return True
    # An address is this host's exactly when a socket can be bound to it.
    family = socket.AF_INET if peer.version == 4 else socket.AF_INET6
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((str(peer), 0))
        except OSError:
            return False
    return True
