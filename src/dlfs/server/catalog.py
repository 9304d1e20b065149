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
    BLOCKS  dataset id u64 | block bytes u32 | count u32 | crc u32[count]: the block
            CRC32Cs (dlfs.blockcrc) of the samples of the SAMPLES record just
            before it that are stored here and longer than block bytes, in
            record order, ceil(length / block bytes) each.  Format version 2;
            a dataset without them (written by version 1) has whole-sample
            CRCs only.
    DIRS    dataset id u64 | paths (UTF-8, NUL-separated): directories of the
            dataset that hold no sample (empty in the ingest source).  Format
            version 2.
    PREPARE dataset id u64 | flags u32 (bit 0: replaces the dataset of its
            name): a two-phase ingest is durable and waits for its decision;
            replay keeps it prepared (not discarded) until a SEAL or DELETE.
            Format version 2.

Version 2 added BLOCKS, DIRS and PREPARE; a version 1 catalog is read as it
is and its header is rewritten to version 2 when opened, so a daemon that
knows only version 1 refuses it by its version rather than by an unknown
record.

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

import contextlib
import dataclasses
import enum
import logging
import os
import struct
import threading

import crc32c
import numpy as np

from dlfs import blockcrc, limits
from dlfs.errors import DlfsError, FailedPrecondition
from dlfs.layout import NO_EXTENT
from dlfs.server import faults
from dlfs.server.extents import fsync_dir, no_space_error

log = logging.getLogger(__name__)

FILE_MAGIC = b"DLFSCAT1"
FORMAT_VERSION = 2
# Versions this daemon reads: 1 lacks the BLOCKS and DIRS records.
READABLE_VERSIONS = (1, 2)
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
    BLOCKS = 8
    DIRS = 9
    PREPARE = 10


_RECORD_TYPES = frozenset(t.value for t in RecordType)


class CatalogCorrupt(DlfsError):
    """A record in the middle of the catalog fails its checks."""

    status_code_name = "DATA_LOSS"


class CatalogFailed(FailedPrecondition):
    """The catalog could not be made durable; it takes no records until a restart.

    FAILED_PRECONDITION, not UNAVAILABLE: retrying cannot help until an
    operator restarts the daemon."""


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
    # Block CRC32Cs of the samples stored here that are longer than
    # `block_bytes` (see the BLOCKS record), or None: none were recorded.
    block_crc: np.ndarray | None = None  # uint32
    block_bytes: int = blockcrc.BLOCK_BYTES

    def __len__(self) -> int:
        return len(self.paths)

    def block_crcs_expected(self, block_bytes: int | None = None) -> int:
        """How many block CRCs this block's samples have.  O(n), vectorized."""
        local = self.extent != NO_EXTENT
        return int(blockcrc.block_counts(self.length[local],
                                         block_bytes or self.block_bytes).sum())

    @staticmethod
    def concat(blocks: list["SampleBlock"]) -> "SampleBlock":
        if not blocks:
            return SampleBlock([], *(np.empty(0, dt) for dt in _ARRAY_DTYPES),
                               block_crc=np.empty(0, np.uint32))
        paths: list[str] = []
        for block in blocks:
            paths.extend(block.paths)
        arrays = [np.concatenate([getattr(b, f) for b in blocks]) for f in _ARRAY_FIELDS]
        holders = None
        if any(b.holders is not None for b in blocks):
            holders = np.concatenate([b.holders for b in blocks])
        block_crc, block_bytes = _concat_block_crcs(blocks)
        return SampleBlock(paths, *arrays, holders=holders, block_crc=block_crc,
                           block_bytes=block_bytes)


def _concat_block_crcs(blocks: list[SampleBlock]) -> tuple[np.ndarray | None, int]:
    """The block CRCs of `blocks` together, or None unless every sample that needs
    them has them (all of one block size)."""
    sizes = {b.block_bytes for b in blocks if b.block_crc is not None}
    if len(sizes) > 1:
        return None, blockcrc.BLOCK_BYTES
    block_bytes = sizes.pop() if sizes else blockcrc.BLOCK_BYTES
    parts = []
    for block in blocks:
        if block.block_crc is not None:
            parts.append(block.block_crc)
        elif block.block_crcs_expected(block_bytes):
            return None, block_bytes  # written before block CRCs: whole-sample CRCs only
    if not parts:
        return np.empty(0, np.uint32), block_bytes
    return np.concatenate(parts).astype(np.uint32, copy=False), block_bytes


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


_PREPARE = struct.Struct("<QI")
PREPARE_REPLACES = 1


def encode_prepare(dataset_id: int, replace: bool) -> bytes:
    return _PREPARE.pack(dataset_id, PREPARE_REPLACES if replace else 0)


def decode_prepare(payload: bytes) -> tuple[int, bool]:
    dataset_id, flags = _PREPARE.unpack_from(payload)
    return dataset_id, bool(flags & PREPARE_REPLACES)


_BLOCKS = struct.Struct("<QII")


def encode_blocks(dataset_id: int, block_bytes: int, crcs: np.ndarray) -> bytes:
    crcs = np.ascontiguousarray(crcs, "<u4")
    return _BLOCKS.pack(dataset_id, block_bytes, crcs.size) + crcs.tobytes()


def decode_blocks(payload: bytes) -> tuple[int, int, np.ndarray]:
    """(dataset id, block bytes, block CRCs) of a BLOCKS record."""
    dataset_id, block_bytes, count = _BLOCKS.unpack_from(payload)
    if len(payload) != _BLOCKS.size + 4 * count or block_bytes == 0:
        raise ValueError(f"BLOCKS record of {len(payload)} bytes announces {count} CRCs of "
                         f"{block_bytes}-byte blocks")
    return dataset_id, block_bytes, np.frombuffer(payload, "<u4", count, _BLOCKS.size).copy()


def encode_dirs(dataset_id: int, paths: list[str]) -> bytes:
    return _U64.pack(dataset_id) + "\0".join(paths).encode("utf-8")


def decode_dirs(payload: bytes) -> tuple[int, list[str]]:
    """(dataset id, directory paths) of a DIRS record."""
    text = payload[_U64.size:].decode("utf-8")
    return _U64.unpack_from(payload)[0], text.split("\0") if text else []


def dirs_records(dataset_id: int, paths: list[str]) -> list[tuple[RecordType, bytes]]:
    """DIRS records naming `paths` (empty directories), split to fit records."""
    records, part, size = [], [], 0
    for path in paths:
        if part and size + len(path) + 1 > limits.catalog_record_bytes_max // 2:
            records.append((RecordType.DIRS, encode_dirs(dataset_id, part)))
            part, size = [], 0
        part.append(path)
        size += len(path.encode("utf-8")) + 1
    if part:
        records.append((RecordType.DIRS, encode_dirs(dataset_id, part)))
    return records


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
    if block.block_crc is not None and block.block_crc.size:
        records.append((RecordType.BLOCKS, encode_blocks(dataset_id, block.block_bytes,
                                                         block.block_crc)))
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


def _file_header(version: int = FORMAT_VERSION) -> bytes:
    body = _FILE_HEADER.pack(FILE_MAGIC, version)
    return body + struct.pack("<I", crc32c.crc32c(body))


@dataclasses.dataclass
class ReplayResult:
    records: list[tuple[RecordType, bytes]]
    valid_bytes: int  # offset just past the last good record
    file_bytes: int
    problem: str = ""  # why replay stopped early, empty when it reached EOF cleanly
    version: int = FORMAT_VERSION  # format version of the file's header


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
        torn = any(_file_header(v).startswith(data) for v in READABLE_VERSIONS)
        if not torn and not salvage:
            raise CatalogCorrupt(f"catalog {path} is shorter than its header ({size} bytes)")
        return ReplayResult([], 0, size, "catalog header torn" if size else "")
    magic, version = _FILE_HEADER.unpack_from(data)
    if version not in READABLE_VERSIONS or data[:FILE_HEADER_BYTES] != _file_header(version):
        if magic == FILE_MAGIC and version not in READABLE_VERSIONS:
            raise CatalogCorrupt(
                f"catalog {path} has format version {version}; this daemon reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}"
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
            return ReplayResult(records, pos, size, message, version)
        _magic, rtype, length, _crc = _RECORD_HEADER.unpack_from(view, pos)
        start = pos + RECORD_HEADER_BYTES
        records.append((RecordType(rtype), bytes(view[start:start + length])))
        pos = start + length
    return ReplayResult(records, pos, size, "", version)


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
        self.failed = ""  # why the catalog takes no more records, once it does not

    @classmethod
    def open(cls, path: str, *, salvage: bool = False) -> tuple["Catalog", ReplayResult]:
        """Open (creating if needed) the catalog at `path` and replay it.

        A torn tail is logged and cut so appends continue from the last good
        record.  Raises CatalogCorrupt as `scan` does.
        """
        if not os.path.exists(path):
            tmp = path + ".new"
            faults.point("create", tmp)
            with open(tmp, "wb") as f:
                f.write(_file_header())
                f.flush()
                faults.point("fsync", tmp)
                os.fsync(f.fileno())
            faults.point("rename", path)
            os.rename(tmp, path)
            fsync_dir(os.path.dirname(os.path.abspath(path)))
        result = scan(path, salvage=salvage)
        if result.problem:
            log.warning("%s; cutting the catalog to %d bytes", result.problem, result.valid_bytes)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            if result.valid_bytes < FILE_HEADER_BYTES:
                faults.point("truncate", path)
                os.ftruncate(fd, 0)
                os.pwrite(fd, _file_header(), 0)
                result.valid_bytes = FILE_HEADER_BYTES
                faults.point("fsync", path)
                os.fsync(fd)
            elif result.valid_bytes != result.file_bytes:
                faults.point("truncate", path)
                os.ftruncate(fd, result.valid_bytes)
                faults.point("fsync", path)
                os.fsync(fd)
            if result.version != FORMAT_VERSION:
                # Records of the new version may follow: an older daemon must refuse the
                # file by its version, not stumble over an unknown record.
                faults.point("write", path)
                os.pwrite(fd, _file_header(), 0)
                faults.point("fsync", path)
                os.fsync(fd)
                log.info("catalog %s upgraded from format version %d to %d", path,
                         result.version, FORMAT_VERSION)
                result.version = FORMAT_VERSION
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, result.valid_bytes), result

    @property
    def size(self) -> int:
        return self._size

    def append(self, record_type: RecordType, payload: bytes, *, sync: bool = False) -> None:
        """Append one record; with `sync`, fsync before returning.

        A write that fails is cut off again so the log stays well formed,
        and raises StorageFull (disk full) or the OSError.  When that cut,
        or an fsync, fails, what the file holds is no longer known (after a
        failed fsync Linux may have dropped dirty pages of earlier records
        too): the catalog then takes no more records (`CatalogFailed`) until
        the daemon restarts and replays what the disk really holds.
        """
        record = encode_record(record_type, payload)
        with self._lock:
            self._check_usable()
            try:
                faults.point("write", self.path)
                written = os.pwrite(self._fd, record, self._size)
                if written != len(record):
                    raise OSError(28, "short write to catalog")
            except OSError as exc:
                self._cut_back(exc)
                raise no_space_error(exc, "the catalog") from exc
            self._size += len(record)
            if sync:
                self._fsync_or_fail()

    def _cut_back(self, exc: OSError) -> None:
        """Undo a failed write (caller holds the lock); a cut that fails makes the catalog failed."""
        try:
            faults.point("truncate", self.path)
            os.ftruncate(self._fd, self._size)
        except OSError as cut_exc:
            self._fail(f"a write failed ({exc}) and cutting it off failed too ({cut_exc})")

    def _fsync_or_fail(self) -> None:
        try:
            faults.point("fsync", self.path)
            os.fsync(self._fd)
        except OSError as exc:
            self._fail(f"fsync failed ({exc})")
            raise CatalogFailed(self.failed) from exc

    def _fail(self, reason: str) -> None:
        self.failed = (f"the catalog {self.path} could not be made durable: {reason}; the "
                       "daemon serves reads but accepts no changes until it is restarted "
                       "(check the disk: dmesg), after which every dataset is served in the "
                       "last version the disk holds whole")
        log.critical("%s", self.failed)

    def _check_usable(self) -> None:
        if self.failed:
            raise CatalogFailed(self.failed)

    def rewrite(self, records) -> None:
        """Replace the whole log with `records` ((type, payload) pairs), atomically.

        Written to a new file, fsync'ed, renamed over the old one: a crash
        leaves either the old log or the new one.  Used by compaction.  A
        failure before the rename leaves the old log in use and raises; after
        the rename the new log is in use, and a failed directory fsync raises
        CatalogFailed (the rename might not survive a power loss, so records
        appended on might vanish with it).
        """
        tmp = self.path + ".compact"
        with self._lock:
            self._check_usable()
            try:
                faults.point("create", tmp)
                with open(tmp, "wb") as f:
                    faults.point("write", tmp)
                    f.write(_file_header())
                    for record_type, payload in records:
                        f.write(encode_record(record_type, payload))
                    f.flush()
                    faults.point("fsync", tmp)
                    os.fsync(f.fileno())
                    size = f.tell()
                faults.point("rename", self.path)
                os.rename(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            os.close(self._fd)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            self._size = size
            try:
                fsync_dir(os.path.dirname(os.path.abspath(self.path)))
            except OSError as exc:
                self._fail(f"the compacted catalog's rename could not be synced ({exc})")
                raise CatalogFailed(self.failed) from exc

    def sync(self) -> None:
        """Make every appended record durable.  Raises CatalogFailed (see `append`)."""
        with self._lock:
            self._check_usable()
            self._fsync_or_fail()

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                if not self.failed:
                    try:
                        self._fsync_or_fail()
                    except CatalogFailed:
                        pass  # logged; the restart replays what the disk holds
                os.close(self._fd)
                self._fd = -1
