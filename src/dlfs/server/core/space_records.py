"""The catalog records of checkpoint spaces: their payloads and encoding.

A space is a tree of directories and files that programs write (a checkpoint
folder), beside the sealed datasets.  Each closed (or fsynced) file is a
*file version*: one extent directory of its own holding one extent, whose
bytes never change once the version is recorded.  All integers little
endian; paths are UTF-8 without a NUL.

    SPACE   space id u64 | created ns i64 | flags u32 (0) | name
    FILE    space id u64 | version id u64 | length u64 | crc u32 | mode u32 |
            mtime ns i64 | block bytes u32 | block CRCs u32 | block CRC u32[n] | path
            -- `path` names this version from now on; the version it named before
            (if any) is dead.  The version's extent is synced before the record.
    MKDIR   space id u64 | mode u32 | mtime ns i64 | path
    REMOVE  space id u64 | flags u32 (bit 0: a directory, which is empty) | mtime ns i64
            (of the parent directory now) | path
    RENAME  space id u64 | flags u32 (0) | mtime ns i64 | from path NUL to path -- atomic; a file at
            `to` is replaced (dead), an empty directory at `to` too
    DELETE  (catalog_records) the space id: the space and every version in it are dead

Replay (space_replay.py) applies them in log order; a record that does not
apply to the tree it finds (a bug, never a crash: records are appended only
after the change was checked) is logged and skipped.  Version ids and space
ids come from the same counter as dataset ids, so every extent directory
name is unique.  Nothing here imports grpc.
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np

from dlfs.server.core.catalog_records import RecordType

_SPACE = struct.Struct("<QqI")
_FILE = struct.Struct("<QQQIIqII")
_MKDIR = struct.Struct("<QIq")
_REMOVE = struct.Struct("<QIq")
_RENAME = struct.Struct("<QIq")
REMOVE_DIRECTORY = 1

SPACE_RECORD_TYPES = frozenset({RecordType.SPACE, RecordType.FILE, RecordType.MKDIR,
                                RecordType.REMOVE, RecordType.RENAME})


@dataclasses.dataclass(frozen=True)
class FileVersion:
    """One closed file's bytes: extent directory `version_id` (one extent, its
    data after the header), `length` bytes with CRC32C `crc`, and the CRC32Cs of
    its `block_bytes` blocks when it is longer than one block (else empty)."""

    version_id: int
    length: int
    crc: int
    mode: int
    mtime_ns: int
    block_bytes: int
    block_crc: np.ndarray  # uint32

    def __eq__(self, other) -> bool:
        return isinstance(other, FileVersion) and self.version_id == other.version_id

    def __hash__(self) -> int:
        return hash(self.version_id)


def encode_space(space_id: int, created_ns: int, name: str) -> bytes:
    return _SPACE.pack(space_id, created_ns, 0) + name.encode("utf-8")


def decode_space(payload: bytes) -> tuple[int, int, str]:
    space_id, created_ns, _flags = _SPACE.unpack_from(payload)
    return space_id, created_ns, payload[_SPACE.size:].decode("utf-8")


def encode_file(space_id: int, path: str, version: FileVersion) -> bytes:
    crcs = np.ascontiguousarray(version.block_crc, "<u4")
    return (_FILE.pack(space_id, version.version_id, version.length, version.crc, version.mode,
                       version.mtime_ns, version.block_bytes, crcs.size)
            + crcs.tobytes() + path.encode("utf-8"))


def decode_file(payload: bytes) -> tuple[int, str, FileVersion]:
    (space_id, version_id, length, crc, mode, mtime_ns, block_bytes,
     count) = _FILE.unpack_from(payload)
    end = _FILE.size + 4 * count
    if len(payload) < end or block_bytes == 0:
        raise ValueError(f"FILE record of {len(payload)} bytes announces {count} block CRCs")
    crcs = np.frombuffer(payload, "<u4", count, _FILE.size).copy()
    path = payload[end:].decode("utf-8")
    return space_id, path, FileVersion(version_id, length, crc, mode, mtime_ns, block_bytes,
                                       crcs)


def encode_mkdir(space_id: int, path: str, mode: int, mtime_ns: int) -> bytes:
    return _MKDIR.pack(space_id, mode, mtime_ns) + path.encode("utf-8")


def decode_mkdir(payload: bytes) -> tuple[int, str, int, int]:
    space_id, mode, mtime_ns = _MKDIR.unpack_from(payload)
    return space_id, payload[_MKDIR.size:].decode("utf-8"), mode, mtime_ns


def encode_remove(space_id: int, path: str, is_dir: bool, mtime_ns: int) -> bytes:
    return (_REMOVE.pack(space_id, REMOVE_DIRECTORY if is_dir else 0, mtime_ns)
            + path.encode("utf-8"))


def decode_remove(payload: bytes) -> tuple[int, str, bool, int]:
    space_id, flags, mtime_ns = _REMOVE.unpack_from(payload)
    return (space_id, payload[_REMOVE.size:].decode("utf-8"), bool(flags & REMOVE_DIRECTORY),
            mtime_ns)


def encode_rename(space_id: int, source: str, target: str, mtime_ns: int) -> bytes:
    return _RENAME.pack(space_id, 0, mtime_ns) + f"{source}\0{target}".encode("utf-8")


def decode_rename(payload: bytes) -> tuple[int, str, str, int]:
    space_id, _flags, mtime_ns = _RENAME.unpack_from(payload)
    source, sep, target = payload[_RENAME.size:].decode("utf-8").partition("\0")
    if not sep:
        raise ValueError("RENAME record without its target path")
    return space_id, source, target, mtime_ns
