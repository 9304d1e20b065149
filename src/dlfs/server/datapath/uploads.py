"""Ingest over the data path: one dataset's files on a data connection.

The same ingest as the gRPC Ingest call (the same `IngestSession`, its
checks, checkpoints, parking and resume), carried by the data path's
frames (`dlfs/proto/datapath.md`, "Ingest"): INGEST_START, then PIECE frames,
then INGEST_END, answered by INGEST_READY, and INGESTED or ERROR.  Python
gRPC copied every byte several times (docs/DESIGN.md, "Staging and ingest",
has its cost); here the daemon receives into one buffer (`recv_into`, many
frames per system call) and hands views of it to the session.

Rights: the same as the Ingest call's (an admin token when the daemon has
a tokens file).  A failure mid-stream is answered at once with ERROR; the
connection then reads and drops what the client had already sent, up to
its INGEST_END or until it closes, so the client always finds the ERROR
frame.  A connection that closes (or idles out) before INGEST_END is a
stream that broke off: a resumable ingest is parked, any other discarded.
The idle timeout bounds the wait for a frame's first byte, and each frame
must then arrive whole within `limits.datapath_piece_timeout_s`: one that
does not is answered with DeadlineExceeded (saying what became of the
ingest) and the connection is closed.  Nothing here imports grpc.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from typing import Callable

from dlfs import limits
from dlfs.formats import datapath_frames as frames
from dlfs.errors import (Cancelled, DeadlineExceeded, DlfsError, InvalidArgument,
                         PermissionDenied)
from dlfs.server.core.extents import disk_error
from dlfs.server.ingest.ingest_machine import with_outcome
from dlfs.sockio import wait_at_most

log = logging.getLogger("dlfs.server.datapath.listener")

# Receive buffer of one ingest connection: many PIECE frames per recv_into.
_BUFFER_BYTES = 8 * limits.MiB
# A PIECE frame's body at most: its data (the client sends at most
# ingest_message_bytes per piece) and a path.
PIECE_BYTES_MAX = limits.ingest_message_bytes + 8 * 1024


def ingest_frame_bytes_max(kind: int) -> int | None:
    """The largest body a frame of `kind` may announce in the middle of an ingest;
    None: no such frame belongs there."""
    if kind == frames.Kind.PIECE:
        return PIECE_BYTES_MAX
    return frames.INGEST_END.size if kind == frames.Kind.INGEST_END else None


class FrameReader:
    """Frames from a socket through one reused buffer; a body is a view into it,
    valid until the next call.

    The socket's timeout bounds the wait for a frame's first byte; the whole
    frame must then arrive within `frame_timeout_s` (FrameTimedOut), however
    its bytes trickle."""

    def __init__(self, sock: socket.socket, size: int = _BUFFER_BYTES,
                 frame_timeout_s: float = limits.datapath_piece_timeout_s):
        self._sock = sock
        self._idle_s = sock.gettimeout()
        self._frame_timeout_s = frame_timeout_s
        self._buffer = bytearray(size)
        self._view = memoryview(self._buffer)
        self._start = self._end = 0

    def next(self, body_bytes_max: Callable[[int], int | None]) -> tuple[int, memoryview]:
        """(kind, body) of the next frame; kind 0 when the peer closed between frames.
        Its header is checked against its kind's largest body (`body_bytes_max(kind)`;
        None: no such frame belongs here) before any of its body is waited for.
        Raises FrameError, ConnectionResetError (closed mid-frame), socket.timeout (no
        first byte within the socket's timeout), FrameTimedOut."""
        if not self._fill(1, eof_ok=True):
            return 0, memoryview(b"")
        deadline = time.monotonic() + self._frame_timeout_s
        try:
            self._fill(frames.FRAME.size, deadline=deadline)
            kind, _flags, length = frames.parse_frame(
                self._view[self._start:self._start + frames.FRAME.size])
            limit = body_bytes_max(kind)
            if limit is None:
                raise frames.FrameError(f"a frame of kind {frames.kind_name(kind)} in the "
                                        "middle of a conversation it has no place in")
            if length > limit:
                raise frames.FrameError(f"a frame of kind {frames.kind_name(kind)} announces "
                                        f"{length} bytes, over the limit of {limit} for its "
                                        "kind")
            self._fill(frames.FRAME.size + length, deadline=deadline)
        finally:
            self._sock.settimeout(self._idle_s)  # what the deadline's waits shortened
        at = self._start + frames.FRAME.size
        self._start = at + length
        return kind, self._view[at:at + length]

    def _fill(self, n: int, eof_ok: bool = False, deadline: float | None = None) -> bool:
        """At least `n` unread bytes in the buffer, receiving as many as arrive (by
        `deadline`, if given: FrameTimedOut otherwise)."""
        if self._end - self._start >= n:
            return True
        if self._start + n > len(self._buffer):  # move the partial frame to the front
            left = self._end - self._start
            self._buffer[:left] = self._view[self._start:self._end]
            self._start, self._end = 0, left
        while self._end - self._start < n:
            try:
                if deadline is not None:
                    wait_at_most(self._sock, deadline, self._idle_s)
                got = self._sock.recv_into(self._view[self._end:])
            except socket.timeout:
                if deadline is not None and time.monotonic() >= deadline:
                    raise FrameTimedOut(self._frame_timeout_s) from None
                raise
            if not got:
                if eof_ok and self._end == self._start:
                    return False
                raise ConnectionResetError(0, "connection closed in the middle of a frame")
            self._end += got
        return True


class FrameTimedOut(Exception):
    """A frame began but did not arrive whole within its time."""

    def __init__(self, timeout_s: float):
        super().__init__(f"a frame did not arrive whole within {timeout_s:g} s of its "
                         "first byte")
        self.timeout_s = timeout_s


def ingest(connection, request: frames.IngestStartRequest) -> None:
    """Serve one INGEST_START conversation on `connection` (a ServedConnection).

    Raises DlfsError before INGEST_READY (the caller answers ERROR); after
    it, answers ERROR itself, drains, and returns.
    """
    store = connection.store
    authorizer = connection.server.authorizer
    if authorizer is not None and connection.role != "admin":
        raise PermissionDenied("ingesting needs an admin token (this connection's token is "
                               "not one)")
    resume = bool(request.flags & frames.INGEST_RESUME)
    replace = bool(request.flags & frames.INGEST_REPLACE)
    if resume:
        session = store.ingests.resume(request.dataset, request.resume_from, replace)
    else:
        session = store.ingests.begin(request.dataset, replace,
                                      resumable=bool(request.flags & frames.INGEST_RESUMABLE))
    connection.sock.settimeout(connection.server.idle_timeout_s)
    try:  # TCP: room for a long one-way stream (a Unix socket counts the sender's buffer)
        connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER_BYTES // 2)
    except OSError:
        pass
    reader = FrameReader(connection.sock)
    try:
        try:
            connection.send([frames.ingest_ready(session.samples)])
        except OSError as exc:
            raise _PeerGone(str(exc)) from exc
        info = _receive(reader, session, store)
    except BaseException as exc:
        note = store.ingests.break_off(session, f"{type(exc).__name__}: {exc}")  # never raises
        if isinstance(exc, FrameTimedOut):  # told why, then closed: no drain of a trickle
            log.warning("ingest of dataset %r over the data path from %s broke off: %s; %s",
                        request.dataset, connection.peer, exc, note or "it had ended")
            with contextlib.suppress(OSError):
                connection.fail(frames.Kind.INGEST_START, with_outcome(DeadlineExceeded(
                    f"a PIECE frame of the ingest did not arrive whole within "
                    f"{exc.timeout_s:g} s of its first byte (the client or its network "
                    "stalled mid-frame)"), note))
            raise _Closed() from None
        if isinstance(exc, frames.FrameError):  # told why, then closed: no frame boundary
            log.warning("ingest of dataset %r over the data path from %s broke off: %s; %s",
                        request.dataset, connection.peer, exc, note or "it had ended")
            with contextlib.suppress(OSError):
                connection.fail(frames.Kind.INGEST_START,
                                with_outcome(InvalidArgument(str(exc)), note))
            raise _Closed() from None
        if isinstance(exc, _PeerGone):
            log.warning("ingest of dataset %r over the data path from %s broke off: %s; %s",
                        request.dataset, connection.peer, exc, note or "it had ended")
            raise _Closed() from None
        if isinstance(exc, OSError):  # not the socket's (that is _PeerGone): the disk's
            exc = disk_error(exc, f"dataset {request.dataset!r}")
        if isinstance(exc, DlfsError):
            # The error says what became of the ingest (parked or discarded).
            connection.fail(frames.Kind.INGEST_START, with_outcome(exc, note))
            _drain(reader)
            return
        raise
    connection.send([frames.ingested(info.name, info.generation, info.samples, info.bytes,
                                       info.created_ns, info.extents)])


class _Closed(Exception):
    """The connection cannot go on (the caller closes it)."""


class _PeerGone(Exception):
    """The client's socket failed (its cause): the ingest broke off and no reply can
    reach it.  Only `_next_frame` raises it, so that an OSError from the disk (raised
    by the session) is never taken for the socket's."""


def _next_frame(reader: FrameReader) -> tuple[int, memoryview]:
    try:
        return reader.next(ingest_frame_bytes_max)
    except OSError as exc:
        raise _PeerGone(str(exc)) from exc


def _receive(reader: FrameReader, session, store):
    files = data_bytes = 0
    while True:
        kind, body = _next_frame(reader)
        if kind == frames.Kind.PIECE:
            piece = frames.parse_piece(body)
            if piece.flags & frames.PIECE_DIRECTORY:
                if piece.flags != frames.PIECE_FIRST | frames.PIECE_DIRECTORY or \
                        len(piece.data) or piece.size:
                    raise InvalidArgument(f"directory piece {piece.path!r} carries only its path")
                session.add_directory(piece.path)
                files += 1
                continue
            if piece.flags & frames.PIECE_FIRST:
                session.start_file(piece.path, piece.size, piece.mode, piece.mtime_ns)
                files += 1
            session.write(piece.data)
            data_bytes += len(piece.data)
            if piece.flags & frames.PIECE_LAST:
                if session.file_open:
                    raise InvalidArgument("a checksum arrived before its file was complete")
                session.check_last_crc(piece.crc)
        elif kind == frames.Kind.INGEST_END:
            claimed = frames.parse_ingest_end(body)
            if claimed != (files, data_bytes):
                raise InvalidArgument(
                    f"the ingest ended claiming {claimed[0]} files and {claimed[1]} bytes but "
                    f"carried {files} files and {data_bytes} bytes")
            return store.ingests.commit(session)
        elif kind == 0:
            raise Cancelled("the ingest connection closed before its end (the client went "
                            "away or was cut off)")
        else:
            raise frames.FrameError(f"frame kind {kind} in the middle of an ingest")


def _drain(reader: FrameReader) -> None:
    """After an ERROR: drop frames until the client's INGEST_END or close."""
    try:
        while True:
            kind, _ = reader.next(ingest_frame_bytes_max)
            if kind in (0, frames.Kind.INGEST_END):
                return
    except (OSError, frames.FrameError, FrameTimedOut):
        raise _Closed() from None


def is_closed(exc: BaseException) -> bool:
    """Whether `exc` (from `ingest`) means the connection must be closed."""
    return isinstance(exc, _Closed)

