"""One file of a checkpoint space written over a daemon's data path.

The client's half of the write conversation (`dlfs/proto/datapath.md`,
"Writes"; frames in `dlfs.formats.datapath_writes`): `FileWriter` opens a
connection of its own (outside the pool: the conversation holds it until
`close`), sends FILE_OPEN, streams FILE_WRITE frames without waiting for
answers (the socket's buffer is the only back-pressure), and waits only at
`sync`, `read` and `close`, whose answers say the file is durable and
visible.  A write the daemon failed (a full disk) is raised at the next
call, as the daemon's typed error (StorageFull, StorageFailed), and again
by `sync` and `close`; the file keeps the version of its last commit.
Not thread-safe: one writer per open file.
"""

from __future__ import annotations

from typing import NamedTuple

from dlfs import limits
from dlfs.errors import FailedPrecondition, Unavailable
from dlfs.formats import datapath_writes as writes
from dlfs.formats.datapath_frames import Kind

# A commit waits for the last buffer and an fsync (or, opening a closed file to
# change it, for its copy): far longer than a read may.
COMMIT_TIMEOUT_S = 600.0
# Bytes in flight to the daemon: a few write frames (capped by net.core.wmem_max).
_SEND_BUFFER_BYTES = 8 * limits.MiB


class FileState(NamedTuple):
    """What a commit made: the version (0: none), its size and CRC32C."""

    version: int
    size: int
    crc32c: int


class FileWriter:
    """File `path` of space `space` open for writing (see the module).

    `flags`: datapath_writes.OPEN_CREATE | OPEN_EXCLUSIVE | OPEN_TRUNCATE, as
    open(2)'s.  Raises NotFound, AlreadyExists, IsADirectory, Overloaded,
    PermissionDenied (no admin token), FailedPrecondition (no data path).
    """

    def __init__(self, data_path, space: str, path: str, flags: int, mode: int = 0o644, *,
                 timeout_s: float = COMMIT_TIMEOUT_S):
        if data_path is None:
            raise FailedPrecondition("writing to a checkpoint space needs the daemon's data "
                                     "path (a daemon without TLS; Client(data_path=True))")
        self.space, self.path = space, path
        self._timeout_s = timeout_s
        self._conn = data_path.dedicated()
        try:
            body = self._conn.file_request([writes.file_open(space, path, flags, mode)],
                                           Kind.FILE_OPENED, writes.FILE_OPENED.size, timeout_s)
            self.size, self.base_version = writes.fixed(body, writes.FILE_OPENED,
                                                        "FILE_OPENED")
        except BaseException:
            self._conn.close()
            raise
        self._conn.widen_send_buffer(_SEND_BUFFER_BYTES)
        self.closed = False

    def write(self, offset: int, data) -> None:
        """Send `data` for byte `offset` (in frames of at most 1 MiB); returns once the
        socket took it.  Raises an earlier write's failure."""
        self._check()
        view = memoryview(data).cast("B")
        step = limits.space_write_data_bytes_max
        for at in range(0, len(view), step):
            piece = view[at:at + step]
            self._conn.send_frames([writes.file_write_header(offset + at, len(piece)), piece])
        self.size = max(self.size, offset + len(view))

    def truncate(self, size: int) -> None:
        self._check()
        self._conn.send_frames([writes.file_truncate(size)])
        self.size = size

    def read(self, offset: int, length: int) -> bytes:
        """What was written at [offset, offset + length) (short at the end)."""
        self._check()
        out = bytearray()
        while length > 0:
            take = min(length, writes.READ_BYTES_MAX)
            body = self._conn.file_request([writes.file_read(offset, take)], Kind.FILE_DATA,
                                           take, self._timeout_s)
            out += body
            if len(body) < take:
                break
            offset, length = offset + take, length - take
        return bytes(out)

    def sync(self) -> FileState:
        """Make what was written durable and visible (fsync); the version it is now."""
        self._check()
        body = self._conn.file_request([writes.file_sync()], Kind.FILE_STATE,
                                       writes.FILE_STATE.size, self._timeout_s)
        return _state(body)

    def close(self, discard: bool = False) -> FileState:
        """Commit (unless `discard`: keep the last commit) and end; idempotent."""
        if self.closed:
            return FileState(0, self.size, 0)
        self.closed = True
        try:
            body = self._conn.file_request([writes.file_close(discard)], Kind.FILE_STATE,
                                           writes.FILE_STATE.size, self._timeout_s)
            return _state(body)
        finally:
            self._conn.close()

    def abandon(self) -> None:
        """Close the connection without a word: the daemon drops what was not synced."""
        if not self.closed:
            self.closed = True
            self._conn.close()

    def _check(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on a closed DLFS file")
        if self._conn.broken:
            raise Unavailable(f"the connection writing {self.space}/{self.path} broke; what "
                              "was written since its last sync is lost")
        failure = self._conn.write_failure()
        if failure is not None:
            raise failure


def _state(body) -> FileState:
    version, size, crc, _ = writes.fixed(body, writes.FILE_STATE, "FILE_STATE")
    return FileState(version, size, crc)
