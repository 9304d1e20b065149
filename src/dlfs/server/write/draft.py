"""The bytes of one file being written to a checkpoint space (a *draft*).

A draft owns one new extent directory, DATA_DIR/extents/<version id>/, with
one extent (`000000.ext`: the usual header, then the file's bytes), which
becomes a file version when it is committed (space_records.py).  Where the
bytes are, when:

- `write` at the file's end (the common case: torch.save, DCP, DLIO write
  in order): copied into an aligned buffer and written with O_DIRECT a
  whole buffer at a time, on a thread of its own while the next fills
  (directio.DirectAppender, as the ingest does), with the file's CRC32C
  and block CRC32Cs computed as the bytes pass.  Nothing is durable.
- `write` anywhere else, or `truncate`: the draft turns *random*: the
  buffer is flushed, and from then on bytes go with `pwrite` through the
  page cache; the CRCs are computed at commit by reading the file back.
- `commit`: the last buffer written, the extent fsynced, then its directory
  and the extents root; only then does it return the version's length and
  CRCs, for the FILE record that makes it a file (space_machine.py).

A committed draft takes no more writes: a file written on after an fsync
is continued in a new draft that starts as a copy of the committed one
(`copy_from`), so a recorded version's bytes never change.  Not
thread-safe: one connection owns a draft.  Nothing here imports grpc.
"""

from __future__ import annotations

import errno
import os

from dlfs import limits
from dlfs.crc import crc32c
from dlfs.errors import DlfsError, InvalidArgument
from dlfs.formats import block_crcs
from dlfs.formats.disk_layout import HEADER_BYTES, encode_header
from dlfs.server.core import faults
from dlfs.server.core.directio import is_direct, open_appender
from dlfs.server.core.extents import ExtentStore, disk_error, fsync_dir

# The aligned buffers of a draft written in order (two: one fills while one is written).
DRAFT_BUFFER_BYTES = 4 * limits.MiB
_READ_BACK_BYTES = 8 * limits.MiB  # a random draft's CRCs are computed this much at a time


class DraftFile:
    """One file's bytes on their way to becoming a version (see the module).

    `version_id` names its extent directory (which must not exist);
    `label` names the file in error messages.  Every method raises
    StorageFull or StorageFailed for a disk error; the draft is broken then
    (every later call raises it again) and can only be discarded.
    """

    def __init__(self, extents: ExtentStore, version_id: int, created_ns: int, label: str):
        self.version_id = version_id
        self.label = label
        self.size = 0
        self.committed = False
        self._extents = extents
        self._path = extents.extent_path(version_id, 0)
        self._appender = None  # in order: a DirectAppender (or BufferedWriter on tmpfs)
        self._fd = -1  # random: a read-write descriptor through the page cache
        self._read_fd = -1
        self._hasher = block_crcs.BlockHasher()
        self._crc = 0
        self._failed: DlfsError | None = None
        directory = extents.dataset_dir(version_id)
        try:
            faults.point("mkdir", directory)
            os.makedirs(directory, mode=0o700, exist_ok=False)
            faults.point("create", self._path)
            self._appender = open_appender(self._path, DRAFT_BUFFER_BYTES)
            self._appender.write(encode_header(version_id, 0, created_ns))
        except OSError as exc:
            self._close_files()
            raise self._broken(exc) from exc

    @property
    def direct(self) -> bool:
        """Whether the bytes go with O_DIRECT (written in order so far)."""
        return self._appender is not None and is_direct(self._appender)

    def copy_from(self, source_path: str, length: int) -> None:
        """Start as a copy of `length` bytes of data of the extent at `source_path`
        (a committed version's).  In-kernel copy (a clone where the file system has
        them); the draft is random from then on."""
        self._check()
        self._to_random()
        try:
            with open(source_path, "rb") as source:
                done = 0
                while done < length:
                    faults.point("write", self.label)
                    n = os.copy_file_range(source.fileno(), self._fd, length - done,
                                           HEADER_BYTES + done, HEADER_BYTES + done)
                    if n == 0:
                        raise OSError(errno.EIO, f"{source_path} ended before {length} bytes")
                    done += n
        except OSError as exc:
            raise self._broken(exc) from exc
        self.size = length

    def write(self, offset: int, data) -> None:
        """Put `data` at byte `offset` of the file.  Raises InvalidArgument (past the
        file size limit), StorageFull, StorageFailed."""
        self._check()
        n = len(data)
        if offset + n > limits.space_file_bytes_max:
            raise InvalidArgument(f"a write to {self.label} at {offset} of {n} bytes goes past "
                                  f"the file size limit of {limits.space_file_bytes_max} bytes")
        try:
            if self._appender is not None and offset == self.size:
                faults.point("write", self.label)
                self._appender.write(data)
                self._hasher.update(data)
                self._crc = crc32c(data, self._crc)
            else:
                self._to_random()
                faults.point("write", self.label)
                if os.pwrite(self._fd, data, HEADER_BYTES + offset) != n:
                    raise OSError(errno.ENOSPC, "short write")
        except OSError as exc:
            raise self._broken(exc) from exc
        self.size = max(self.size, offset + n)

    def truncate(self, size: int) -> None:
        """Cut or extend (with zeros) the file to `size` bytes."""
        self._check()
        if size == self.size:
            return
        if size > limits.space_file_bytes_max:
            raise InvalidArgument(f"{self.label} cannot grow to {size} bytes, over the file "
                                  f"size limit of {limits.space_file_bytes_max}")
        try:
            self._to_random()
            faults.point("truncate", self.label)
            os.ftruncate(self._fd, HEADER_BYTES + size)
        except OSError as exc:
            raise self._broken(exc) from exc
        self.size = size

    def read(self, offset: int, length: int) -> bytes:
        """Bytes [offset, offset + length) of what was written (short at the end)."""
        self._check()
        length = max(0, min(length, self.size - offset))
        try:
            if self._appender is not None:
                self._appender.flush()
            if self._read_fd < 0:
                self._read_fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
            return os.pread(self._read_fd, length, HEADER_BYTES + offset)
        except OSError as exc:
            raise self._broken(exc) from exc

    def commit(self) -> tuple[int, int, list[int]]:
        """Make the bytes durable (extent, its directory, the extents root); return
        (length, CRC32C, block CRC32Cs).  The draft takes no more writes then."""
        self._check()
        try:
            if self._appender is not None:
                faults.point("write", self.label)
                self._appender.flush()
                fd = self._appender.fileno()
                crc, blocks = self._crc, self._hasher.finish(self.size)
            else:
                fd = self._fd
                crc, blocks = self._read_back_crcs()
            faults.point("fsync", self.label)
            os.fsync(fd)
            fsync_dir(self._extents.dataset_dir(self.version_id))
            fsync_dir(self._extents.root)
        except OSError as exc:
            raise self._broken(exc) from exc
        self.committed = True
        self._close_files()
        return self.size, crc, blocks

    def discard(self) -> None:
        """Close and remove the draft's extent directory.  Never raises (what is left
        is removed at the next start: no record names it)."""
        self._close_files()
        try:
            self._extents.remove_dataset(self.version_id)
        except OSError:
            pass

    def close(self) -> None:
        """Let go of the descriptors (after `commit`, or before `discard`)."""
        self._close_files()

    # --- inside ----------------------------------------------------------------------

    def _to_random(self) -> None:
        if self._fd >= 0:
            return
        if self._appender is not None:
            appender, self._appender = self._appender, None
            try:
                appender.flush()
            finally:
                appender.close()
        self._fd = os.open(self._path, os.O_RDWR | os.O_CLOEXEC)

    def _read_back_crcs(self) -> tuple[int, list[int]]:
        hasher, crc, done = block_crcs.BlockHasher(), 0, 0
        while done < self.size:
            chunk = os.pread(self._fd, min(_READ_BACK_BYTES, self.size - done),
                             HEADER_BYTES + done)
            if not chunk:
                raise OSError(errno.EIO, f"the extent of {self.label} ended early")
            hasher.update(chunk)
            crc = crc32c(chunk, crc)
            done += len(chunk)
        return crc, hasher.finish(self.size)

    def _check(self) -> None:
        if self._failed is not None:
            raise type(self._failed)(f"{self._failed.message} (an earlier write of this file "
                                     "failed; close it and write it again)")
        if self.committed:
            raise AssertionError("a committed draft takes no more writes")

    def _broken(self, exc: OSError) -> DlfsError:
        self._failed = disk_error(exc, self.label)
        return self._failed

    def _close_files(self) -> None:
        if self._appender is not None:
            appender, self._appender = self._appender, None
            appender.close()
        for name in ("_fd", "_read_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                setattr(self, name, -1)
                try:
                    os.close(fd)
                except OSError:
                    pass
