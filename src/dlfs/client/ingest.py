"""Upload a directory tree as a dataset.

Which files become samples (`walk_tree`):

- every regular file below the source directory, as one sample whose path
  is its path relative to the source, with '/' separators;
- hidden entries (name starting with '.') are skipped, files and whole
  directories, unless `include_hidden`;
- symbolic links are skipped unless `follow_symlinks`; then links to files
  and to directories are followed, and a link back into a directory already
  on the current walk path (a loop) is skipped with a warning;
- FIFOs, sockets and devices are skipped;
- a directory that ends up holding nothing (empty in the source, or only
  skipped entries) is kept as an empty directory of the dataset, so the
  dataset's tree is the one walked (DLIO, for one, creates an empty
  `valid/` folder and fails without it);
- a name that is not valid UTF-8 stops the ingest before anything is sent.

Files are sent in sorted path order; each file's mode and mtime travel with
it, and its CRC32C is computed while reading, so the daemon verifies what it
stored against what was read here.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import stat as stat_module
import sys
from typing import Iterator, Sequence

import crc32c
import grpc

from dlfs import limits
from dlfs.client import convert
from dlfs.client.convert import DatasetInfo
from dlfs.client.errors import from_rpc_error
from dlfs.errors import DlfsError, InvalidArgument, NotFound
from dlfs.paths import check_dataset_name, check_sample_path
from dlfs.proto import dlfs_pb2 as pb

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SourceFile:
    path: str  # dataset path
    source: str  # file to read
    size: int
    mode: int
    mtime_ns: int


@dataclasses.dataclass
class WalkReport:
    files: list[SourceFile]
    # Dataset paths of the directories that hold nothing, sorted.
    dirs: list[str] = dataclasses.field(default_factory=list)
    bytes: int = 0
    skipped_hidden: int = 0
    skipped_symlinks: int = 0
    skipped_special: int = 0
    skipped_loops: int = 0


def walk_tree(source_dir: str, *, include_hidden: bool = False,
              follow_symlinks: bool = False) -> WalkReport:
    """Select the files of `source_dir` by the rules above, sorted by dataset path.

    Raises NotFound (no such directory) and InvalidArgument (bad name).
    """
    if not os.path.isdir(source_dir):
        raise NotFound(f"source directory {source_dir!r} does not exist or is not a directory")
    report = WalkReport(files=[])
    root_stat = os.stat(source_dir)
    _walk(source_dir, "", report, include_hidden, follow_symlinks,
          {(root_stat.st_dev, root_stat.st_ino)})
    report.files.sort(key=lambda f: f.path)
    report.dirs.sort()
    report.bytes = sum(f.size for f in report.files)
    return report


def _walk(directory: str, prefix: str, report: WalkReport, include_hidden: bool,
          follow_symlinks: bool, ancestors: set[tuple[int, int]]) -> bool:
    """Add what `directory` holds to `report`; whether it held anything kept."""
    kept = False
    with os.scandir(directory) as entries:
        for entry in entries:
            if isinstance(entry.name, bytes) or _has_surrogates(entry.name):
                raise InvalidArgument(
                    f"file name {os.path.join(directory, entry.name)!r} is not valid UTF-8; "
                    "rename it (dataset paths are UTF-8)")
            if entry.name.startswith(".") and not include_hidden:
                report.skipped_hidden += 1
                continue
            path = f"{prefix}{entry.name}"
            if entry.is_symlink():
                if not follow_symlinks:
                    report.skipped_symlinks += 1
                    continue
                try:
                    st = os.stat(entry.path)
                except OSError:
                    log.warning("skipping dangling symlink %s", entry.path)
                    report.skipped_symlinks += 1
                    continue
            else:
                st = entry.stat(follow_symlinks=False)
            if stat_module.S_ISDIR(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if key in ancestors:
                    log.warning("skipping symlink loop at %s", entry.path)
                    report.skipped_loops += 1
                    continue
                if not _walk(entry.path, path + "/", report, include_hidden, follow_symlinks,
                             ancestors | {key}):
                    check_sample_path(path)
                    report.dirs.append(path)  # empty: kept as such
                kept = True
            elif stat_module.S_ISREG(st.st_mode):
                check_sample_path(path)
                report.files.append(SourceFile(path, entry.path, st.st_size,
                                               stat_module.S_IFREG | stat_module.S_IMODE(st.st_mode),
                                               st.st_mtime_ns))
                kept = True
            else:
                report.skipped_special += 1
    return kept


def _has_surrogates(name: str) -> bool:
    try:
        name.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


class _Upload:
    """Generates the ingest stream and remembers a local failure to re-raise it."""

    def __init__(self, name: str, replace: bool, files: list[SourceFile], progress,
                 dirs: Sequence[str] = ()):
        self.name = name
        self.replace = replace
        self.files = files
        self.dirs = dirs
        self.progress = progress
        self.error: BaseException | None = None

    def messages(self) -> Iterator[pb.IngestMessage]:
        try:
            yield pb.IngestMessage(start=pb.IngestStart(dataset=self.name, replace=self.replace))
            yield from batch_messages(self._pieces())
        except BaseException as exc:  # gRPC would only report CANCELLED; keep the cause
            self.error = exc
            raise

    def _pieces(self) -> Iterator[pb.IngestPiece]:
        yield from dir_pieces(self.dirs)
        for file in self.files:
            yield from file_pieces(file)
            if self.progress is not None:
                self.progress.update(file.size)


def dir_pieces(dirs: Sequence[str]) -> Iterator[pb.IngestPiece]:
    """One piece per empty directory of the dataset (no data)."""
    for path in dirs:
        yield pb.IngestPiece(path=path, directory=True)


def file_pieces(file: SourceFile, holders: Sequence[int] = ()) -> Iterator[pb.IngestPiece]:
    """The pieces of one file (see `sample_pieces`).  Reads the file once, in
    ingest_message_bytes steps.

    Raises InvalidArgument when the file shrinks or grows while it is read.
    """
    head = pb.IngestPiece(path=file.path, size=file.size, mode=file.mode,
                          mtime_ns=file.mtime_ns, holders=holders)
    return sample_pieces(head, _file_chunks(file))


def buffer_pieces(head: pb.IngestPiece, data) -> Iterator[pb.IngestPiece]:
    """The pieces of a sample already in memory (see `sample_pieces`)."""
    step = limits.ingest_message_bytes
    size = len(data)
    return sample_pieces(head, ((bytes(data[offset:offset + step]), offset + step >= size)
                                for offset in range(0, max(size, 1), step)))


def sample_pieces(head: pb.IngestPiece, chunks) -> Iterator[pb.IngestPiece]:
    """One sample as IngestPieces: `head` (naming the sample) carries the first
    chunk, the last piece carries the CRC32C of all of them.

    `chunks` yields (bytes, is_last) and ends with is_last true; an empty
    sample is one empty last chunk.
    """
    crc = 0
    piece = head
    for data, last in chunks:
        crc = crc32c.crc32c(data, crc)
        piece.data = data
        if last:
            piece.crc32c = crc
        yield piece
        piece = pb.IngestPiece()


def _file_chunks(file: SourceFile) -> Iterator[tuple[bytes, bool]]:
    step = limits.ingest_message_bytes
    sent = 0
    with open(file.source, "rb") as f:
        while True:
            data = f.read(min(step, file.size - sent)) if sent < file.size else b""
            if sent < file.size and not data:
                raise InvalidArgument(
                    f"{file.source} shrank while being ingested ({sent} of {file.size} "
                    "bytes); ingest again once the source is stable")
            sent += len(data)
            last = sent == file.size
            if last and f.read(1):
                raise InvalidArgument(
                    f"{file.source} grew while being ingested; ingest again once "
                    "the source is stable")
            yield data, last
            if last:
                return


def batch_messages(pieces) -> Iterator[pb.IngestMessage]:
    """Pack pieces into IngestMessages of about ingest_message_bytes each.

    The last message carries `end` with the files and data bytes sent, which
    tells the daemon the stream is complete rather than cut off.
    """
    message, size = pb.IngestMessage(), 0
    files = data_bytes = 0
    for piece in pieces:
        message.pieces.append(piece)
        files += bool(piece.path)
        data_bytes += len(piece.data)
        size += len(piece.data) + len(piece.path) + 32
        if size >= limits.ingest_message_bytes:
            yield message
            message, size = pb.IngestMessage(), 0
    message.end.files = files
    message.end.bytes = data_bytes
    yield message


def upload(transport, name: str, report: WalkReport, *, replace: bool = False,
           progress: bool | None = None) -> DatasetInfo:
    """Stream the walked files to one daemon (a `DaemonTransport`) as dataset `name`;
    one Ingest call.

    `progress=None` shows a progress bar when stderr is a terminal.  Raises
    AlreadyExists (name taken, no `replace`), InvalidArgument (bad or
    changing source files), and the daemon's errors; on any failure the
    daemon keeps nothing of the dataset.
    """
    check_dataset_name(name)
    if progress is None:
        progress = sys.stderr.isatty()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=report.bytes, unit="B", unit_scale=True, unit_divisor=1024,
                   desc=f"ingest {name}", file=sys.stderr)
    stream = _Upload(name, replace, report.files, bar, report.dirs)
    try:
        reply = transport.ingest(stream.messages())
    except grpc.RpcError as exc:
        if isinstance(stream.error, DlfsError):
            raise stream.error from None
        if isinstance(stream.error, OSError):
            raise InvalidArgument(f"cannot read the source: {stream.error}") from None
        if stream.error is not None:
            raise stream.error
        raise from_rpc_error(exc, transport.address) from None
    finally:
        if bar is not None:
            bar.close()
    return convert.dataset_info(reply)
