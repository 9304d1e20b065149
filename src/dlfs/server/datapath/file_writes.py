"""Writes over the data path: one file of a checkpoint space on a data connection.

The conversation (`dlfs/proto/datapath.md`, "Writes"; frames in
`dlfs.formats.datapath_writes`): FILE_OPEN, answered by FILE_OPENED or
ERROR; then FILE_WRITE and FILE_TRUNCATE frames, which are not answered (the
client streams them); FILE_SYNC and FILE_CLOSE, answered by FILE_STATE or
ERROR once the file is durable and visible (space_machine.py says what
that means); FILE_READ, answered by FILE_DATA.  After FILE_CLOSE's answer
the connection serves requests again.  Served by the main process, which
owns the catalog (a worker hands FILE_OPEN over with its socket).

A write that fails (a full disk) is answered at once by WRITE_FAILED (an
ERROR frame's body), so the writer learns of it at its next write; later
writes are read and dropped, and every later request is answered with the
same error.  A connection that closes, or idles past
`limits.space_draft_idle_timeout_s`, before FILE_CLOSE drops what the file
received since its last FILE_SYNC, as a process killed before close(2)
loses its unsynced writes.  Rights: an admin token when the daemon has a
tokens file (as for ingests).  Nothing here imports grpc.
"""

from __future__ import annotations

import logging
import socket
import struct

from dlfs import limits
from dlfs.errors import DlfsError, InvalidArgument, PermissionDenied
from dlfs.formats import datapath_frames as frames
from dlfs.formats import datapath_writes as writes
from dlfs.formats.datapath_frames import Kind
from dlfs.server.datapath.uploads import FrameReader, FrameTimedOut

log = logging.getLogger("dlfs.server.datapath.listener")

# Receive buffer of one write connection: several FILE_WRITE frames per recv_into.
_BUFFER_BYTES = 4 * writes.WRITE_FRAME_BODY_MAX


class ConnectionEnded(Exception):
    """The client went away (or broke the protocol) mid-file: the caller closes."""


def serve_file(connection, request: writes.FileOpenRequest) -> None:
    """Serve one FILE_OPEN conversation on `connection` (a ServedConnection).

    Raises DlfsError before FILE_OPENED (the caller answers ERROR), and
    ConnectionEnded when the connection must close; returns after FILE_CLOSE's
    answer, the connection usable again.
    """
    authorizer = connection.server.authorizer
    if authorizer is not None and connection.role != "admin":
        raise PermissionDenied("writing to a checkpoint space needs an admin token (this "
                               "connection's token is not one)")
    draft = connection.store.spaces.open(request.space, request.path, request.flags,
                                         request.mode)
    try:
        base = draft.committed_version
        connection.send([writes.file_opened(draft.size, base.version_id if base else 0)])
        connection.sock.settimeout(limits.space_draft_idle_timeout_s)
        _converse(connection, draft, FrameReader(connection.sock, _BUFFER_BYTES))
    finally:
        draft.close(commit=False)  # no-op after FILE_CLOSE; else drops the unsynced rest


def _converse(connection, draft, reader: FrameReader) -> None:
    failure: DlfsError | None = None
    while True:
        try:
            kind, body = reader.next(writes.write_frame_bytes_max)
        except (OSError, frames.FrameError, FrameTimedOut) as exc:
            log.warning("%s, open for writing from %s, was dropped: %s", draft.label,
                        connection.peer, exc or type(exc).__name__)
            raise ConnectionEnded() from exc
        if kind == 0:
            log.info("%s was dropped: its writer closed the connection before closing the "
                     "file", draft.label)
            raise ConnectionEnded()
        try:
            if kind in (Kind.FILE_WRITE, Kind.FILE_TRUNCATE):
                if failure is None:
                    try:
                        _change(draft, kind, body)
                    except DlfsError as exc:
                        failure = exc
                        connection.send([writes.write_failed(exc)])
                continue
            if failure is not None:
                raise failure
            if kind == Kind.FILE_SYNC:
                writes.fixed(body, _EMPTY, "FILE_SYNC")
                connection.send([_state(draft, draft.sync())])
            elif kind == Kind.FILE_READ:
                offset, length = writes.fixed(body, writes.FILE_READ, "FILE_READ")
                if length > writes.READ_BYTES_MAX:
                    raise InvalidArgument(f"a FILE_READ of {length} bytes is over the limit "
                                          f"of {writes.READ_BYTES_MAX}")
                data = draft.read(offset, length)
                connection.send([writes.file_data_header(len(data)), data])
            elif kind == Kind.FILE_CLOSE:
                (flags,) = writes.fixed(body, writes.FILE_CLOSE, "FILE_CLOSE")
                version = draft.close(commit=not flags & writes.CLOSE_DISCARD)
                connection.send([_state(draft, version)])
                return
            else:
                raise frames.FrameError(f"frame kind {kind} in the middle of a file's writes")
        except frames.FrameError as exc:
            connection.send([frames.error(InvalidArgument(str(exc)))])
            raise ConnectionEnded() from exc
        except DlfsError as exc:
            failure = failure or exc
            if kind == Kind.FILE_CLOSE:
                # Let go of the path before the answer: a listing right after a
                # failed close must not show the file as being written.
                draft.close(commit=False)
            connection.send([frames.error(exc)])
            if kind == Kind.FILE_CLOSE:
                return
        except socket.timeout as exc:
            raise ConnectionEnded() from exc


_EMPTY = struct.Struct("")


def _change(draft, kind: int, body) -> None:
    if kind == Kind.FILE_WRITE:
        offset, data = writes.parse_file_write(body)
        draft.write(offset, data)
    else:
        (size,) = writes.fixed(body, writes.FILE_TRUNCATE, "FILE_TRUNCATE")
        draft.truncate(size)


def _state(draft, version) -> bytes:
    if version is None:
        return writes.file_state(0, draft.size, 0)
    return writes.file_state(version.version_id, version.length, version.crc)

