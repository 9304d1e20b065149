"""Catalog: the durable, append-only log of directory records.

File format (all integers little endian)::

    file header  : magic "DLFSCAT1" (8) | version u32 | CRC32C of the previous 12 bytes u32
    record       : magic u32 | type u32 | payload length u32 | CRC32C u32 | payload
                   (the CRC covers the first 12 header bytes and the payload)

Record types and payloads:

    BEGIN   dataset id u64 | created ns i64 | name (UTF-8, rest of payload)
    SAMPLES dataset id u64 | count u32 | extent u32[n] | offset u64[n] | length u64[n]
            | crc u32[n] | mode u32[n] | mtime ns i64[n] | paths: UTF-8, NUL-separated
    SEAL    dataset id u64 | replaces dataset id u64 (0: none)
    DELETE  dataset id u64 (also ends an ingest that was aborted)
    CLUSTER dataset id u64 | replicas u32 | member index u32 | member addresses
            (UTF-8, NUL-separated): the dataset is striped over these daemons
    HOLDERS dataset id u64 | count u32 | replicas u32 | member indices u16[n x r]
            of the samples of the SAMPLES record just before it
    GENERATION dataset id u64 | generation u64: the version id a striped ingest
            named, the same on every member (without it, the generation is the
            dataset id)
    CHECKPOINT a resumable ingest's durable point (payload and meaning in
            dlfs.server.resumable): the dataset's first N samples recorded so
            far are durable, records of further samples before it are void

A dataset becomes visible only with its SEAL record, which is written after
its extents and SAMPLES records are synced, and the catalog is synced before
the ingest is acknowledged.  Replay stops at the first record that does not
check out.  If no well-formed record follows it, it is a torn tail from a
crash (a partial append, or zeros the file system left): it is reported and
cut.  A bad record followed by a good one is damage in the middle of the
log: replay refuses to guess and raises `CatalogCorrupt`, unless told to
salvage.
Nothing here imports grpc.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import struct
import threading

import crc32c
import numpy as np

from dlfs import limits
from dlfs.errors import DlfsError
from dlfs.server.extents import no_space_error

log = logging.getLogger(__name__)

FILE_MAGIC = b"DLFSCAT1"
FORMAT_VERSION = 1
_FILE_HEADER = struct.Struct("<8sI")
FILE_HEADER_BYTES = _FILE_HEADER.size + 4
RECORD_MAGIC = 0xD1F5CA7A
_RECORD_HEADER = struct.Struct("<IIII")
RECORD_HEADER_BYTES = _RECORD_HEADER.size
_U64 = struct.Struct("<Q")
_BEGIN = struct.Struct("<Qq")
_SAMPLES = struct.Struct("<QI")
_SEAL = struct.Struct("<QQ")
_READ_BLOCK_BYTES = 8 * limits.MiB


class RecordType(enum.IntEnum):
    BEGIN = 1
    SAMPLES = 2
    SEAL = 3
    DELETE = 4
    CLUSTER = 5
    HOLDERS = 6
    GENERATION = 7
    CHECKPOINT = 8


_RECORD_TYPES = frozenset(t.value for t in RecordType)


class CatalogCorrupt(DlfsError):
    """A record in the middle of the catalog fails its checks."""

    status_code_name = "DATA_LOSS"


@dataclasses.dataclass
class SampleBlock:
    """Locations and metadata of samples, in arrival order (one SAMPLES record)."""

    paths: list[str]
    extent: np.ndarray  # uint32
    offset: np.ndarray  # uint64
    length: np.ndarray  # uint64
    crc: np.ndarray  # uint32
    mode: np.ndarray  # uint32
    mtime_ns: np.ndarray  # int64
    # Striped datasets: uint16 (n, replicas) member indices holding each sample.
    holders: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.paths)

    @staticmethod
    def concat(blocks: list["SampleBlock"]) -> "SampleBlock":
        if not blocks:
            return SampleBlock([], *(np.empty(0, dt) for dt in _ARRAY_DTYPES))
        paths: list[str] = []
        for block in blocks:
            paths.extend(block.paths)
        arrays = [np.concatenate([getattr(b, f) for b in blocks]) for f in _ARRAY_FIELDS]
        holders = None
        if any(b.holders is not None for b in blocks):
            holders = np.concatenate([b.holders for b in blocks])
        return SampleBlock(paths, *arrays, holders=holders)


_ARRAY_FIELDS = ("extent", "offset", "length", "crc", "mode", "mtime_ns")
_ARRAY_DTYPES = (np.dtype("<u4"), np.dtype("<u8"), np.dtype("<u8"), np.dtype("<u4"),
                 np.dtype("<u4"), np.dtype("<i8"))


def encode_begin(dataset_id: int, created_ns: int, name: str) -> bytes:
    return _BEGIN.pack(dataset_id, created_ns) + name.encode("utf-8")


def encode_samples(dataset_id: int, block: SampleBlock) -> bytes:
    n = len(block)
    parts = [_SAMPLES.pack(dataset_id, n)]
    for field, dtype in zip(_ARRAY_FIELDS, _ARRAY_DTYPES):
        array = np.ascontiguousarray(getattr(block, field), dtype=dtype)
        assert array.shape == (n,)
        parts.append(array.tobytes())
    parts.append("\0".join(block.paths).encode("utf-8"))
    return b"".join(parts)


_CLUSTER = struct.Struct("<QII")
_GENERATION = struct.Struct("<QQ")
_HOLDERS = struct.Struct("<QII")


def encode_cluster(dataset_id: int, replicas: int, member_index: int, members: list[str]) -> bytes:
    return _CLUSTER.pack(dataset_id, replicas, member_index) + "\0".join(members).encode("utf-8")


def decode_cluster(payload: bytes) -> tuple[int, int, int, list[str]]:
    dataset_id, replicas, member_index = _CLUSTER.unpack_from(payload)
    return dataset_id, replicas, member_index, payload[_CLUSTER.size:].decode("utf-8").split("\0")


def encode_generation(dataset_id: int, generation: int) -> bytes:
    return _GENERATION.pack(dataset_id, generation)


def decode_generation(payload: bytes) -> tuple[int, int]:
    return _GENERATION.unpack_from(payload)


def encode_holders(dataset_id: int, holders: np.ndarray) -> bytes:
    n, replicas = holders.shape
    return _HOLDERS.pack(dataset_id, n, replicas) + np.ascontiguousarray(holders, "<u2").tobytes()


def decode_holders(payload: bytes) -> tuple[int, np.ndarray]:
    dataset_id, n, replicas = _HOLDERS.unpack_from(payload)
    array = np.frombuffer(payload, "<u2", count=n * replicas, offset=_HOLDERS.size)
    return dataset_id, array.reshape(n, replicas).copy()


def encode_seal(dataset_id: int, replaces_dataset_id: int = 0) -> bytes:
    return _SEAL.pack(dataset_id, replaces_dataset_id)


def encode_delete(dataset_id: int) -> bytes:
    return _U64.pack(dataset_id)


def start_records(dataset_id: int, created_ns: int, name: str, cluster=None
                  ) -> list[tuple[RecordType, bytes]]:
    """The records that open a dataset: BEGIN, then CLUSTER for a striped one
    (`cluster`: a `dlfs.server.directory.Cluster`, or None)."""
    records = [(RecordType.BEGIN, encode_begin(dataset_id, created_ns, name))]
    if cluster is not None:
        records.append((RecordType.CLUSTER, encode_cluster(
            dataset_id, cluster.replicas, cluster.member_index, list(cluster.members))))
        if cluster.generation:
            records.append((RecordType.GENERATION,
                            encode_generation(dataset_id, cluster.generation)))
    return records


def block_records(dataset_id: int, block: SampleBlock) -> list[tuple[RecordType, bytes]]:
    """The records of one block of samples: SAMPLES, then HOLDERS for a striped dataset."""
    records = [(RecordType.SAMPLES, encode_samples(dataset_id, block))]
    if block.holders is not None:
        records.append((RecordType.HOLDERS, encode_holders(dataset_id, block.holders)))
    return records


def decode_begin(payload: bytes) -> tuple[int, int, str]:
    dataset_id, created_ns = _BEGIN.unpack_from(payload)
    return dataset_id, created_ns, payload[_BEGIN.size:].decode("utf-8")


def decode_samples(payload: bytes) -> tuple[int, SampleBlock]:
    dataset_id, n = _SAMPLES.unpack_from(payload)
    pos = _SAMPLES.size
    arrays = []
    for dtype in _ARRAY_DTYPES:
        arrays.append(np.frombuffer(payload, dtype=dtype, count=n, offset=pos).copy())
        pos += n * dtype.itemsize
    text = payload[pos:].decode("utf-8")
    paths = text.split("\0") if n else []
    if len(paths) != n:
        raise ValueError(f"SAMPLES record holds {len(paths)} paths for {n} samples")
    return dataset_id, SampleBlock(paths, *arrays)


def decode_seal(payload: bytes) -> tuple[int, int]:
    return _SEAL.unpack_from(payload)


def decode_delete(payload: bytes) -> int:
    return _U64.unpack_from(payload)[0]


def encode_record(record_type: RecordType, payload: bytes) -> bytes:
    if len(payload) > limits.catalog_record_bytes_max:
        raise ValueError(f"catalog record of {len(payload)} bytes exceeds the limit")
    head = struct.pack("<III", RECORD_MAGIC, int(record_type), len(payload))
    crc = crc32c.crc32c(payload, crc32c.crc32c(head))
    return head + struct.pack("<I", crc) + payload


def _file_header() -> bytes:
    body = _FILE_HEADER.pack(FILE_MAGIC, FORMAT_VERSION)
    return body + struct.pack("<I", crc32c.crc32c(body))


@dataclasses.dataclass
class ReplayResult:
    records: list[tuple[RecordType, bytes]]
    valid_bytes: int  # offset just past the last good record
    file_bytes: int
    problem: str = ""  # why replay stopped early, empty when it reached EOF cleanly


def scan(path: str, *, salvage: bool = False) -> ReplayResult:
    """Read every good record of the catalog at `path`.

    Returns the records and the offset where the good prefix ends.  Raises
    CatalogCorrupt for a bad file header, and for a bad record that is
    followed by a good one, unless `salvage` is set (then the good prefix
    is returned and the rest is reported in `problem`).  Cost: one sequential
    read of the file.
    """
    with open(path, "rb") as f:
        data = f.read()
    size = len(data)
    if size < FILE_HEADER_BYTES:
        if not _file_header().startswith(data) and not salvage:
            raise CatalogCorrupt(f"catalog {path} is shorter than its header ({size} bytes)")
        return ReplayResult([], 0, size, "catalog header torn" if size else "")
    if data[:FILE_HEADER_BYTES] != _file_header():
        magic, version = _FILE_HEADER.unpack_from(data)
        if magic == FILE_MAGIC and version != FORMAT_VERSION:
            raise CatalogCorrupt(
                f"catalog {path} has format version {version}; this daemon reads version "
                f"{FORMAT_VERSION}"
            )
        raise CatalogCorrupt(f"catalog {path} has a damaged header; it is not a DLFS catalog")
    records: list[tuple[RecordType, bytes]] = []
    pos = FILE_HEADER_BYTES
    view = memoryview(data)
    while pos < size:
        problem = _check_record(view, pos, size)
        if problem:
            tail_is_torn = not _good_record_after(data, pos + 1, size)
            message = f"catalog {path}: {problem} at offset {pos}; {size - pos} bytes from there on"
            if not tail_is_torn and not salvage:
                raise CatalogCorrupt(
                    message + " hold further good records, so this is not a torn tail. "
                    "Restore the data dir from a backup, or start once with "
                    "--salvage-catalog to keep only the records before this offset."
                )
            return ReplayResult(records, pos, size, message)
        _magic, rtype, length, _crc = _RECORD_HEADER.unpack_from(view, pos)
        start = pos + RECORD_HEADER_BYTES
        records.append((RecordType(rtype), bytes(view[start:start + length])))
        pos = start + length
    return ReplayResult(records, pos, size)


def _good_record_after(data: bytes, pos: int, size: int) -> bool:
    """Whether any well-formed record starts at or after `pos`.  Only run on damage."""
    magic = struct.pack("<I", RECORD_MAGIC)
    view = memoryview(data)
    while (pos := data.find(magic, pos)) >= 0:
        if not _check_record(view, pos, size):
            return True
        pos += 1
    return False


def _check_record(view: memoryview, pos: int, size: int) -> str:
    """Return why the record at `pos` is bad, or "" if it is good."""
    if size - pos < RECORD_HEADER_BYTES:
        return "incomplete record header (torn)"
    magic, rtype, length, crc = _RECORD_HEADER.unpack_from(view, pos)
    if magic != RECORD_MAGIC:
        return "bad record magic"
    if length > limits.catalog_record_bytes_max:
        return f"record length {length} over the limit"
    end = pos + RECORD_HEADER_BYTES + length
    if end > size:
        return "record runs past the end of the file (torn)"
    expected = crc32c.crc32c(view[pos + RECORD_HEADER_BYTES:end],
                             crc32c.crc32c(view[pos:pos + 12]))
    if crc != expected:
        return "record checksum mismatch" + (" (torn)" if end == size else "")
    if rtype not in _RECORD_TYPES:
        return f"unknown record type {rtype}"
    return ""


class Catalog:
    """Appender for the catalog file; open with `Catalog.open`.

    `append` writes a record (buffered by the OS); `sync` makes all appended
    records durable.  Appends are serialized by a lock, so several ingest
    sessions may share one catalog.
    """

    def __init__(self, path: str, fd: int, size: int):
        self.path = path
        self._fd = fd
        self._size = size
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: str, *, salvage: bool = False) -> tuple["Catalog", ReplayResult]:
        """Open (creating if needed) the catalog at `path` and replay it.

        A torn tail is logged and cut so appends continue from the last good
        record.  Raises CatalogCorrupt as `scan` does.
        """
        if not os.path.exists(path):
            tmp = path + ".new"
            with open(tmp, "wb") as f:
                f.write(_file_header())
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, path)
            _fsync_parent(path)
        result = scan(path, salvage=salvage)
        if result.problem:
            log.warning("%s; cutting the catalog to %d bytes", result.problem, result.valid_bytes)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        if result.valid_bytes < FILE_HEADER_BYTES:
            os.ftruncate(fd, 0)
            os.pwrite(fd, _file_header(), 0)
            result.valid_bytes = FILE_HEADER_BYTES
            os.fsync(fd)
        elif result.valid_bytes != result.file_bytes:
            os.ftruncate(fd, result.valid_bytes)
            os.fsync(fd)
        return cls(path, fd, result.valid_bytes), result

    @property
    def size(self) -> int:
        return self._size

    def append(self, record_type: RecordType, payload: bytes, *, sync: bool = False) -> None:
        """Append one record; with `sync`, fsync before returning.

        Raises StorageFull when the disk is full; the partial record is cut
        off again so the log stays well formed.
        """
        record = encode_record(record_type, payload)
        with self._lock:
            try:
                written = os.pwrite(self._fd, record, self._size)
                if written != len(record):
                    raise OSError(28, "short write to catalog")
                if sync:
                    os.fsync(self._fd)
            except OSError as exc:
                try:
                    os.ftruncate(self._fd, self._size)
                except OSError:
                    log.exception("could not cut a failed append off the catalog")
                raise no_space_error(exc, "the catalog") from exc
            self._size += len(record)

    def rewrite(self, records) -> None:
        """Replace the whole log with `records` ((type, payload) pairs), atomically.

        Written to a new file, fsync'ed, renamed over the old one: a crash
        leaves either the old log or the new one.  Used by compaction.
        """
        tmp = self.path + ".compact"
        with self._lock:
            with open(tmp, "wb") as f:
                f.write(_file_header())
                for record_type, payload in records:
                    f.write(encode_record(record_type, payload))
                f.flush()
                os.fsync(f.fileno())
                size = f.tell()
            os.rename(tmp, self.path)
            _fsync_parent(self.path)
            os.close(self._fd)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            self._size = size

    def sync(self) -> None:
        with self._lock:
            os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1


def _fsync_parent(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

