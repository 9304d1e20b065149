"""An ingest stream as gRPC Ingest messages, and the call that sends it.

`raw_messages` packs plain `IngestPiece`s into serialized IngestMessages of
about `limits.ingest_message_bytes`: standard protobuf on the wire (any
parser reads them), but a piece's small fields are serialized by protobuf
and its data is joined in after them, so the sample bytes are copied once
into the message instead of three times (into a piece, into its message,
then serialized).  The last message carries `end` with the files and data
bytes sent, which tells the daemon the stream is complete rather than cut
off.  `send` makes the call and keeps the cause of a stream that broke on
this side (gRPC would only report CANCELLED).
"""

from __future__ import annotations

from typing import Iterable, Iterator

import grpc

from dlfs import limits, logs
from dlfs.client.transport.grpc_channel import DaemonChannel
from dlfs.client.transport.grpc_errors import from_rpc_error
from dlfs.client.transport.grpc_messages import start_message
from dlfs.client.transport.ingest_requests import IngestPiece, IngestStart
from dlfs.formats.grpc_chunks import varint
from dlfs.proto import dlfs_pb2 as pb

_PIECES_TAG = b"\x12"  # IngestMessage.pieces: field 2, length-delimited
_DATA_TAG = b"\x2a"  # IngestPiece.data: field 5, length-delimited


def send(channel: DaemonChannel, start: IngestStart, pieces: Iterable[IngestPiece]
         ) -> pb.DatasetInfo:
    """One Ingest call of `start` and `pieces`; never retried.

    Raises the daemon's typed errors, or what iterating `pieces` raised
    (as it is: the caller knows its cause).  Deadline
    `limits.ingest_timeout_s_default`.
    """
    stream = _Stream(start, pieces)
    call = channel.channel.stream_unary("/dlfs.v1.Dlfs/Ingest", request_serializer=_as_is,
                                        response_deserializer=pb.DatasetInfo.FromString)
    try:
        return call(stream.messages(), timeout=limits.ingest_timeout_s_default,
                    metadata=logs.outgoing_metadata())
    except grpc.RpcError as exc:
        if stream.error is not None:
            raise stream.error from None
        raise from_rpc_error(exc, channel.address) from None


def raw_messages(start: IngestStart, pieces: Iterable[IngestPiece],
                 message_bytes: int = limits.ingest_message_bytes) -> Iterator[bytes]:
    """The serialized Ingest stream: `start`, then `pieces` packed into messages of
    about `message_bytes`, the last with `end`.  One protobuf header per piece, its
    data copied once.  When `pieces` raises, the pieces packed so far are yielded
    (without `end`) before the error."""
    yield pb.IngestMessage(start=start_message(start)).SerializeToString()
    parts: list = []
    size = files = data_bytes = 0
    try:
        for piece in pieces:
            header = _header(piece)
            data = piece.data
            n = len(data)
            length = varint(n)
            parts += (_PIECES_TAG, varint(len(header) + 1 + len(length) + n), header,
                      _DATA_TAG, length, data)
            files += bool(piece.path)
            data_bytes += n
            size += n + len(header) + 8
            if size >= message_bytes:
                yield b"".join(parts)
                parts, size = [], 0
    except BaseException:
        # The source failed (or Ctrl-C): the pieces read before it go out first, so a
        # resumable ingest parks with every file read before the failure.
        if parts:
            yield b"".join(parts)
        raise
    parts.append(pb.IngestMessage(end=pb.IngestEnd(files=files, bytes=data_bytes))
                 .SerializeToString())
    yield b"".join(parts)


def _header(piece: IngestPiece) -> bytes:
    """A piece's fields but its data, serialized."""
    if piece.path:
        head = pb.IngestPiece(path=piece.path, size=piece.size, mode=piece.mode,
                              mtime_ns=piece.mtime_ns, holders=piece.holders,
                              remote=piece.remote, kept=piece.kept, directory=piece.directory)
    else:
        head = pb.IngestPiece()
    if piece.crc32c is not None:
        head.crc32c = piece.crc32c
    return head.SerializeToString()


def _as_is(message: bytes) -> bytes:
    return message


class _Stream:
    """The messages of one call, remembering what broke them on this side."""

    def __init__(self, start: IngestStart, pieces: Iterable[IngestPiece]):
        self.start = start
        self.pieces = pieces
        self.error: BaseException | None = None

    def messages(self) -> Iterator[bytes]:
        """The messages; when `pieces` raises, the error is kept and the stream ends
        without `end` (a half-close, not a cancellation, so that the pieces before it
        reach the daemon, which parks a resumable ingest with them)."""
        try:
            yield from raw_messages(self.start, self.pieces)
        except BaseException as exc:  # gRPC would only report CANCELLED; keep the cause
            self.error = exc
