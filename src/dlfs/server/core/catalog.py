"""Catalog: the durable, append-only log of directory records.

File format (all integers little endian)::

    file header  : magic "DLFSCAT1" (8) | version u32 | CRC32C of the previous 12 bytes u32
    record       : magic u32 | type u32 | payload length u32 | CRC32C u32 | payload
                   (the CRC covers the first 12 header bytes and the payload)

Record types and payloads: see `records`.

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
import logging
import os
import struct
import threading

from dlfs import limits
from dlfs.crc import crc32c
from dlfs.errors import DlfsError, FailedPrecondition
from dlfs.server.core import faults
from dlfs.server.core.extents import disk_error, fsync_dir
from dlfs.server.core.catalog_records import RECORD_TYPES, RecordType

log = logging.getLogger(__name__)

FILE_MAGIC = b"DLFSCAT1"
FORMAT_VERSION = 3
# Versions this daemon reads: 1 lacks the BLOCKS and DIRS records, 2 the space records.
READABLE_VERSIONS = (1, 2, 3)
_FILE_HEADER = struct.Struct("<8sI")
FILE_HEADER_BYTES = _FILE_HEADER.size + 4
RECORD_MAGIC = 0xD1F5CA7A
_RECORD_HEADER = struct.Struct("<IIII")
RECORD_HEADER_BYTES = _RECORD_HEADER.size


class CatalogCorrupt(DlfsError):
    """A record in the middle of the catalog fails its checks."""

    status_code_name = "DATA_LOSS"


class CatalogFailed(FailedPrecondition):
    """The catalog could not be made durable; it takes no records until a restart.

    FAILED_PRECONDITION, not UNAVAILABLE: retrying cannot help until an
    operator restarts the daemon."""


def encode_record(record_type: RecordType, payload: bytes) -> bytes:
    if len(payload) > limits.catalog_record_bytes_max:
        raise ValueError(f"catalog record of {len(payload)} bytes exceeds the limit")
    head = struct.pack("<III", RECORD_MAGIC, int(record_type), len(payload))
    crc = crc32c(payload, crc32c(head))
    return head + struct.pack("<I", crc) + payload


def _file_header(version: int = FORMAT_VERSION) -> bytes:
    body = _FILE_HEADER.pack(FILE_MAGIC, version)
    return body + struct.pack("<I", crc32c(body))


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
    expected = crc32c(view[pos + RECORD_HEADER_BYTES:end], crc32c(view[pos:pos + 12]))
    if crc != expected:
        return "record checksum mismatch" + (" (torn)" if end == size else "")
    if rtype not in RECORD_TYPES:
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
        and raises StorageFull (disk full) or StorageFailed (any other errno).  When that cut,
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
                raise disk_error(exc, "the catalog") from exc
            self._size += len(record)
            if sync:
                self._fsync_or_fail()

    def _cut_back(self, exc: OSError) -> None:
        """Undo a failed write (caller holds the lock); a failed cut fails the catalog."""
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
