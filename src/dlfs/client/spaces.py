"""Checkpoint spaces from Python: trees of files that programs write and read back.

`Client.space(name)` gives a `Space`.  Its files are written through
`Space.open(path, "wb")`, a binary file object (`SpaceFile`) whose bytes go
over the daemon's data path; `close()` (and `sync()`, the fsync) returns
once the file is durable on the daemon's disk and visible whole to every
reader; until then readers see the file's previous version, or nothing.
Closed files are read with `Space.open(path, "rb")` (a buffered, seekable
reader), `read` and `read_ranges` (many ranges at once, sorted, in
parallel: what a checkpoint restore asks for).  The tree changes with
`mkdir`, `remove`, `rmdir` and `rename` (atomic, replacing its target),
each durable when it returns.

    space = client.create_space("ckpt")          # or client.space("ckpt")
    with space.open("step100/model.pt", "wb") as f:
        torch.save(model.state_dict(), f)
    state = torch.load(space.open("step100/model.pt", "rb"))
"""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator

from dlfs import limits
from dlfs.client.transport.datapath_writer import FileState, FileWriter
from dlfs.errors import (AlreadyExists, Busy, FailedPrecondition, InvalidArgument, IsADirectory,
                         Unavailable)
from dlfs.formats import datapath_writes as writes
from dlfs.paths import check_dataset_name, check_sample_path, file_version_name
from dlfs.types import DatasetInfo, Entry

# open() modes and what they mean to the daemon (flags) and here (readable, at end).
_MODES = {
    "wb": (writes.OPEN_CREATE | writes.OPEN_TRUNCATE, False, False),
    "xb": (writes.OPEN_CREATE | writes.OPEN_EXCLUSIVE, False, False),
    "ab": (writes.OPEN_CREATE, False, True),
    "r+b": (0, True, False),
    "w+b": (writes.OPEN_CREATE | writes.OPEN_TRUNCATE, True, False),
}
READ_BUFFER_BYTES = 8 * limits.MiB  # a reader's buffer: few round trips per file
RANGE_READS_MAX = 8  # ranges `read_ranges` has in flight at once


class Space:
    """Checkpoint space `name` of `client`'s daemon (see the module)."""

    def __init__(self, client, name: str):
        self._client = client
        self.name = check_dataset_name(name)

    def __repr__(self) -> str:
        return f"Space({self.name!r})"

    def info(self) -> DatasetInfo:
        """Its summary: files (`samples`), bytes."""
        return self._daemon().control.get_dataset(self.name)

    def stat(self, path: str) -> Entry:
        return self._daemon().control.stat(self.name, path, 0)

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except KeyError:  # NotFound
            return False

    def listdir(self, path: str = "") -> Iterator[Entry]:
        """Entries of a directory in name order, page by page."""
        control, after = self._daemon().control, ""
        while True:
            entries, more = control.list_page(self.name, path, after,
                                              limits.space_list_page_entries_max, 0)
            yield from entries
            if not more or not entries:
                return
            after = entries[-1].name

    def mkdir(self, path: str, *, parents: bool = False, exist_ok: bool = False,
              mode: int = 0o755) -> None:
        """Create directory `path` (with `parents`, the missing ones above it too)."""
        path = check_sample_path(path.strip("/"))
        parts = path.split("/")
        todo = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)] if parents else [path]
        control = self._daemon().control
        for at in todo:
            try:
                control.make_dir(self.name, at, mode)
            except AlreadyExists:
                if at == path and not exist_ok:
                    raise
                if not self.stat(at).is_dir:
                    raise

    def remove(self, path: str) -> None:
        """Remove file `path` (a writer of it fails at its close)."""
        self._daemon().control.remove(self.name, path)

    def rmdir(self, path: str) -> None:
        """Remove the empty directory `path`."""
        self._daemon().control.remove(self.name, path, directory=True)

    def rename(self, path: str, target: str) -> None:
        """Move `path` to `target` atomically, replacing a file there."""
        self._daemon().control.rename(self.name, path, target)

    def open(self, path: str, mode: str = "rb", *, permissions: int = 0o644):
        """A binary file object: "rb" reads the closed file (buffered, seekable);
        "wb", "xb", "ab", "r+b", "w+b" write it as open(2) would (SpaceFile)."""
        check_sample_path(path)
        if mode == "rb":
            return io.BufferedReader(SpaceReader(self, path), READ_BUFFER_BYTES)
        if mode not in _MODES:
            raise InvalidArgument(f"mode {mode!r} is not one of 'rb', "
                                  f"{', '.join(map(repr, _MODES))} (binary only)")
        flags, readable, at_end = _MODES[mode]
        writer = open_writer(self._daemon(), self.name, path, flags, permissions)
        return SpaceFile(writer, readable=readable, at_end=at_end)

    def read(self, path: str, offset: int = 0, length: int = 0, *,
             entry: Entry | None = None) -> memoryview:
        """`length` bytes (0: to the end) at `offset` of closed file `path`, checked
        against its CRC32Cs.  One round trip (with `entry`, the file's `stat`)."""
        entry = entry or self.stat(path)
        version = _readable_version(self, path, entry)
        if offset >= entry.size:
            return memoryview(b"")
        length = min(length or entry.size - offset, entry.size - offset)
        return self._client.read(file_version_name(self.name, version), 0, offset, length,
                                 generation=version)

    def read_ranges(self, ranges: Iterable[tuple[str, int, int]]) -> list[memoryview]:
        """The bytes of many (path, offset, length) ranges of closed files, in request
        order: each file's `stat` once, the ranges read sorted by file and offset,
        `RANGE_READS_MAX` at a time over the data path."""
        ranges = list(ranges)
        entries = {path: self.stat(path) for path in {r[0] for r in ranges}}
        order = sorted(range(len(ranges)), key=lambda i: (ranges[i][0], ranges[i][1]))
        out: list = [None] * len(ranges)

        def one(i: int) -> None:
            path, offset, length = ranges[i]
            out[i] = self.read(path, offset, length, entry=entries[path]) if length else \
                memoryview(b"")

        with ThreadPoolExecutor(min(RANGE_READS_MAX, max(1, len(ranges)))) as pool:
            list(pool.map(one, order))
        return out

    def _daemon(self):
        transport = self._client.transport
        if not hasattr(transport, "data_path") or not hasattr(transport, "control"):
            raise FailedPrecondition("checkpoint spaces live on one daemon: make the client "
                                     "with that daemon's address (Client(HOST:PORT))")
        return transport


def open_writer(transport, space: str, path: str, flags: int, mode: int) -> FileWriter:
    """A FileWriter on `transport`'s data path (a one-daemon transport); a data path that
    proved unreachable on the way (the daemon restarted since: another port or
    instance) is asked for again, once."""
    data = transport.data_path()
    try:
        return FileWriter(data, space, path, flags, mode)
    except Unavailable:
        if data is None or not data.unreachable:
            raise
        transport.forget_data_path(data)
        return FileWriter(transport.data_path(), space, path, flags, mode)


class SpaceFile(io.RawIOBase):
    """A file of a space open for writing (see the module).  `write` streams; `sync`
    is the fsync; `close` commits; `discard` closes keeping the last commit."""

    def __init__(self, writer: FileWriter, *, readable: bool, at_end: bool):
        super().__init__()
        self._writer = writer
        self._readable = readable
        self._at_end = at_end
        self._pos = writer.size if at_end else 0
        self.name = f"{writer.space}/{writer.path}"
        self.state: FileState | None = None  # what the close committed

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return self._readable

    def seekable(self) -> bool:
        return True

    def write(self, data) -> int:
        if self._at_end:
            self._pos = self._writer.size
        n = memoryview(data).nbytes
        self._writer.write(self._pos, data)
        self._pos += n
        return n

    def readinto(self, buffer) -> int:
        if not self._readable:
            raise io.UnsupportedOperation("not readable (open it with 'r+b' or 'w+b')")
        view = memoryview(buffer).cast("B")
        data = self._writer.read(self._pos, len(view))
        view[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._writer.size}[whence]
        if base + offset < 0:
            raise InvalidArgument(f"seek to {base + offset}, before the start of {self.name}")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def truncate(self, size: int | None = None) -> int:
        size = self._pos if size is None else size
        self._writer.truncate(size)
        return size

    def sync(self) -> FileState:
        """Make everything written durable and visible (what fsync(2) does here)."""
        return self._writer.sync()

    def discard(self) -> None:
        """Close keeping the file as its last commit left it (a new file: none)."""
        if not self.closed:
            self.state = self._writer.close(discard=True)
            super().close()

    def close(self) -> None:
        if not self.closed:
            try:
                self.state = self._writer.close()
            finally:
                super().close()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and not self.closed:
            self.discard()  # a failed save leaves the previous version in place
        else:
            self.close()


class SpaceReader(io.RawIOBase):
    """A closed file of a space, read by ranges over the data path (seekable).  The
    version is the one `stat` named at open: a later close of the path does not
    change what this reader sees (StaleGeneration once the daemon freed it)."""

    def __init__(self, space: Space, path: str):
        super().__init__()
        self._space = space
        self._entry = space.stat(path)
        _readable_version(space, path, self._entry)
        self._pos = 0
        self.name = f"{space.name}/{path}"

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        left = self._entry.size - self._pos
        if left <= 0 or not len(view):
            return 0
        data = self._space.read(self._entry.path, self._pos, min(len(view), left),
                                entry=self._entry)
        view[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._entry.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    @property
    def size(self) -> int:
        return self._entry.size


def _readable_version(space: Space, path: str, entry: Entry) -> int:
    if entry.is_dir:
        raise IsADirectory(f"'{space.name}/{path}' is a directory")
    if not entry.version:
        raise Busy(f"'{space.name}/{path}' is being written and was never closed: it can be "
                   "read once its writer closes it")
    return entry.version
