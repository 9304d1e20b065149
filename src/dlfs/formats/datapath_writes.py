"""Frames of the data path's write conversation: one file of a checkpoint space.

The contract is `dlfs/proto/datapath.md`, "Writes"; this module is its one
implementation, shared by the daemon and the client.  Frame headers, ERROR
and the kinds' numbers are `datapath_frames`'.  Nothing here touches sockets
or imports grpc.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from dlfs import errors, limits
from dlfs.formats.datapath_frames import FRAME, FrameError, Kind, frame
from dlfs.formats.datapath_frames import error as error_frame

FILE_OPEN = struct.Struct("<IIHHBB")  # flags, mode, space name bytes, path bytes,
#                                       request id bytes, reserved
FILE_WRITE = struct.Struct("<Q")  # offset; then the data (the rest of the body)
FILE_TRUNCATE = struct.Struct("<Q")  # size
FILE_READ = struct.Struct("<QQ")  # offset, length
FILE_CLOSE = struct.Struct("<I")  # flags
FILE_OPENED = struct.Struct("<QQ")  # size now, the version it starts from (0: none)
FILE_STATE = struct.Struct("<QQII")  # version (0: none yet), size, CRC32C, reserved

# FILE_OPEN flags, as open(2)'s O_CREAT, O_EXCL and O_TRUNC.
OPEN_CREATE, OPEN_EXCLUSIVE, OPEN_TRUNCATE = 0x1, 0x2, 0x4
# FILE_CLOSE flag: drop what was written since the last FILE_SYNC instead of committing.
CLOSE_DISCARD = 0x1

# What a write connection's frames may carry at most (checked before the body is read).
WRITE_FRAME_BODY_MAX = FILE_WRITE.size + limits.space_write_data_bytes_max
READ_BYTES_MAX = 8 * limits.MiB


_BODY_MAX = {Kind.FILE_WRITE: WRITE_FRAME_BODY_MAX, Kind.FILE_TRUNCATE: FILE_TRUNCATE.size,
             Kind.FILE_SYNC: 0, Kind.FILE_READ: FILE_READ.size, Kind.FILE_CLOSE: FILE_CLOSE.size}


def write_frame_bytes_max(kind: int) -> int | None:
    """The largest body a frame of `kind` may announce while a file is written; None:
    no such frame belongs there (checked on the header, before the body is read)."""
    return _BODY_MAX.get(kind)


class FileOpenRequest(NamedTuple):
    space: str
    path: str
    flags: int
    mode: int
    request_id: str


def file_open(space: str, path: str, flags: int, mode: int = 0o644,
              request_id: str = "") -> bytes:
    raw_space, raw_path, rid = space.encode(), path.encode(), request_id.encode()[:255]
    if len(raw_path) > limits.path_bytes_max or len(raw_space) > limits.dataset_name_bytes_max:
        raise errors.InvalidArgument(f"path {path[:60]!r} or space {space[:40]!r} is over its "
                                     "length limit")
    body = FILE_OPEN.pack(flags, mode, len(raw_space), len(raw_path), len(rid), 0)
    body += raw_space + raw_path + rid
    return frame(Kind.FILE_OPEN, len(body)) + body


def parse_file_open(body) -> FileOpenRequest:
    if len(body) < FILE_OPEN.size:
        raise FrameError(f"FILE_OPEN of {len(body)} bytes is shorter than its fixed part")
    flags, mode, name_bytes, path_bytes, rid_bytes, _ = FILE_OPEN.unpack_from(body)
    at = FILE_OPEN.size
    if len(body) != at + name_bytes + path_bytes + rid_bytes:
        raise FrameError("FILE_OPEN's lengths do not match its body")
    try:
        raw = bytes(body[at:])
        space = raw[:name_bytes].decode()
        path = raw[name_bytes:name_bytes + path_bytes].decode()
        request_id = raw[name_bytes + path_bytes:].decode()
    except UnicodeDecodeError:
        raise FrameError("FILE_OPEN's names are not UTF-8") from None
    return FileOpenRequest(space, path, flags, mode, request_id)


def file_write_header(offset: int, data_bytes: int) -> bytes:
    """The frame header and fixed part of a FILE_WRITE; the data follows."""
    return frame(Kind.FILE_WRITE, FILE_WRITE.size + data_bytes) + FILE_WRITE.pack(offset)


def file_truncate(size: int) -> bytes:
    return frame(Kind.FILE_TRUNCATE, FILE_TRUNCATE.size) + FILE_TRUNCATE.pack(size)


def file_sync() -> bytes:
    return frame(Kind.FILE_SYNC, 0)


def file_read(offset: int, length: int) -> bytes:
    return frame(Kind.FILE_READ, FILE_READ.size) + FILE_READ.pack(offset, length)


def file_close(discard: bool = False) -> bytes:
    return frame(Kind.FILE_CLOSE, FILE_CLOSE.size) + FILE_CLOSE.pack(
        CLOSE_DISCARD if discard else 0)


def file_opened(size: int, version: int) -> bytes:
    return frame(Kind.FILE_OPENED, FILE_OPENED.size) + FILE_OPENED.pack(size, version)


def file_state(version: int, size: int, crc: int) -> bytes:
    return frame(Kind.FILE_STATE, FILE_STATE.size) + FILE_STATE.pack(version, size, crc, 0)


def write_failed(exc: errors.DlfsError) -> bytes:
    """WRITE_FAILED: an ERROR frame's body under its own kind, sent without a request
    (a FILE_WRITE or FILE_TRUNCATE failed); the next request's answer says it again."""
    raw = bytearray(error_frame(exc))
    raw[0] = Kind.WRITE_FAILED
    return bytes(raw)


def file_data_header(data_bytes: int) -> bytes:
    return frame(Kind.FILE_DATA, data_bytes)


def fixed(body, layout: struct.Struct, name: str) -> tuple:
    """The fixed fields of a frame body that must hold exactly `layout`."""
    if len(body) != layout.size:
        raise FrameError(f"{name} of {len(body)} bytes must be {layout.size}")
    return layout.unpack(body)


def parse_file_write(body) -> tuple[int, memoryview]:
    """(offset, data) of a FILE_WRITE body."""
    if len(body) < FILE_WRITE.size:
        raise FrameError("FILE_WRITE shorter than its offset")
    (offset,) = FILE_WRITE.unpack_from(body)
    return offset, memoryview(body)[FILE_WRITE.size:]


assert FRAME.size == 8
