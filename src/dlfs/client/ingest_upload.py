"""Upload a dataset to one daemon: sources read in parallel, one ordered stream.

Which files become samples, from directory trees and tar archives, is
decided in `dlfs.staging.sources`.  The files are read by a pool of reader
threads (`dlfs.staging.read_pool`: many opens in flight, bounded memory) and
sent in the sources' order (sorted paths of a tree, archive order of an
archive) over one Ingest call; each file's mode and mtime travel with it,
and its CRC32C is computed here while it is sent, so the daemon verifies
what it stored against what was read.

Resumable ingests (`resumable=True`, the CLI's default): when the stream
breaks off, the daemon keeps the files it holds durably and parks the
ingest, still invisible.  `resume=True` asks the daemon how many files it
holds (GetIngestProgress), checks that the source starts with the same
files (a digest of their paths, sizes and mtimes, `dlfs.formats.ingest_digest`,
computed without reading their bytes), and sends the rest.  With nothing to
resume, `resume=True` starts a new resumable ingest.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Iterator

import grpc

from dlfs import limits
from dlfs.formats import ingest_digest
from dlfs.client.transport import datapath_upload, grpc_types
from dlfs.client.transport.grpc_types import DatasetInfo
from dlfs.client.transport.grpc_errors import from_rpc_error
from dlfs.staging.progress import IngestProgress, IngestStats, human_bytes, progress_mode
from dlfs.staging.read_pool import READERS_DEFAULT, ReadPool
from dlfs.staging.sources import SourceFile, SourceSet, TreeSource
from dlfs.crc import crc32c
from dlfs.errors import (AlreadyExists, DlfsError, FailedPrecondition, InvalidArgument, NotFound,
                         ResumeConflict, Unavailable)
from dlfs.paths import check_dataset_name
from dlfs.proto import dlfs_pb2 as pb
from dlfs.formats.grpc_chunks import varint

log = logging.getLogger(__name__)

__all__ = ["SourceFile", "WalkReport", "walk_tree", "upload", "batch_messages",
           "buffer_pieces", "sample_pieces", "as_source_set", "resume_prefix"]


@dataclasses.dataclass
class WalkReport:
    """The files of one directory tree (`walk_tree`), sorted by dataset path."""

    files: list[SourceFile]
    bytes: int = 0
    skipped_hidden: int = 0
    skipped_symlinks: int = 0
    skipped_special: int = 0
    skipped_loops: int = 0
    tree: TreeSource | None = None
    # Dataset paths of the directories that hold nothing, sorted.
    dirs: list[str] = dataclasses.field(default_factory=list)


def walk_tree(source_dir: str, *, include_hidden: bool = False,
              follow_symlinks: bool = False) -> WalkReport:
    """Select the files of `source_dir` by the rules of `dlfs.staging.sources`.

    Raises NotFound (no such directory) and InvalidArgument (bad name).
    """
    tree = TreeSource(source_dir, include_hidden=include_hidden, follow_symlinks=follow_symlinks)
    tree.scan()
    counts = tree.skipped.counts
    return WalkReport(tree.files, tree.total_bytes, counts["hidden"], counts["symlink"],
                      counts["special"], counts["loop"], tree, list(tree.dirs))


def as_source_set(source) -> SourceSet:
    """A SourceSet, a WalkReport or a TreeSource/TarSource as a (scanned) SourceSet."""
    if isinstance(source, WalkReport):
        tree = source.tree
        if tree is None or tree.files is not source.files:
            tree = TreeSource.of_files(source.files)
            tree.dirs = list(source.dirs)
        source = tree
    if not isinstance(source, SourceSet):
        source = SourceSet([source])
    source.scan()
    return source


# --- pieces and messages ---------------------------------------------------------------

def dir_pieces(dirs) -> Iterator[pb.IngestPiece]:
    """One piece per empty directory of the dataset (no data)."""
    for path in dirs:
        yield pb.IngestPiece(path=path, directory=True)


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
        crc = crc32c(data, crc)
        piece.data = data
        if last:
            piece.crc32c = crc
        yield piece
        piece = pb.IngestPiece()


def batch_messages(pieces, message_bytes: int = limits.ingest_message_bytes
                   ) -> Iterator[pb.IngestMessage]:
    """Pack pieces into IngestMessages of about `message_bytes` each.

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
        if size >= message_bytes:
            yield message
            message, size = pb.IngestMessage(), 0
    message.end.files = files
    message.end.bytes = data_bytes
    yield message


# Hand-encoded IngestMessages (standard protobuf on the wire, any parser reads
# them): a piece's small fields are serialized by protobuf, its data is joined
# in after them, so the sample bytes are copied once into the message instead
# of three times (into a piece, into its message, then serialized).
_PIECES_TAG = b"\x12"  # IngestMessage.pieces: field 2, length-delimited
_DATA_TAG = b"\x2a"  # IngestPiece.data: field 5, length-delimited


def raw_messages(start: pb.IngestStart, pieces,
                 message_bytes: int = limits.ingest_message_bytes) -> Iterator[bytes]:
    """The serialized Ingest stream: `start`, then `pieces` ((IngestPiece without
    data, data) pairs) packed into messages of about `message_bytes`, the last
    with `end` (see `batch_messages`)."""
    yield pb.IngestMessage(start=start).SerializeToString()
    parts: list = []
    size = files = data_bytes = 0
    for head, data in pieces:
        header = head.SerializeToString()
        n = len(data)
        length = varint(n)
        parts += (_PIECES_TAG, varint(len(header) + 1 + len(length) + n), header, _DATA_TAG,
                  length, data)
        files += bool(head.path)
        data_bytes += n
        size += n + len(header) + 8
        if size >= message_bytes:
            yield b"".join(parts)
            parts, size = [], 0
    parts.append(pb.IngestMessage(end=pb.IngestEnd(files=files, bytes=data_bytes))
                 .SerializeToString())
    yield b"".join(parts)


class Duplicates:
    """Refuses a second entry for one dataset path (several sources, archives).

    Keeps every path and where it came from: about 200 bytes per file
    (250 MB for ImageNet's 1.28 million), only when duplicates are possible.
    """

    def __init__(self):
        self._seen: dict[str, str] = {}

    def check(self, file: SourceFile) -> None:
        first = self._seen.setdefault(file.path, file.source)
        if first is not file.source:
            raise InvalidArgument(
                f"two entries would both become sample {file.path!r}: {first} and "
                f"{file.source}; paths must be unique across the archives and trees of one "
                "ingest")


def pool_for(sources: SourceSet, skip: int, readers: int) -> ReadPool:
    """The reader pool over `sources` from entry `skip` on."""
    return ReadPool(sources.units(skip), threads=max(1, readers),
                    chunk_bytes=limits.ingest_message_bytes)


def ordered_files(pool, meter: IngestProgress, duplicates: Duplicates | None):
    """(file, data, last, crc) for every chunk of the pool, counted in `meter`:
    `file` on a file's first chunk, `crc` (its CRC32C) on its last."""
    crc = 0
    current = None
    for file, data, last, source_bytes in pool:
        if file is not None:
            if duplicates is not None:
                duplicates.check(file)
            current, crc = file, 0
        elif current is None:  # progress only (the end of an archive)
            meter.advance(source_bytes)
            continue
        crc = crc32c(data, crc)
        if last:
            current = None
        meter.advance(source_bytes, len(data), int(last))
        yield file, data, last, crc


# --- resuming ----------------------------------------------------------------------------

@dataclasses.dataclass
class Prefix:
    """What the first `count` entries of a source add up to."""

    count: int
    digest: bytes
    last_path: str
    bytes: int


def resume_prefix(sources: SourceSet, counts, duplicates: Duplicates | None) -> dict[int, Prefix]:
    """Digest (and sizes) of the first `count` entries for each of `counts`.

    Reads no file data: trees are already walked, archives are scanned.
    The first min(counts) entries are checked into `duplicates` (the reader
    pool starts after them).  Raises ResumeConflict when the source has
    fewer entries than asked for.
    """
    wanted = sorted(set(counts))
    result: dict[int, Prefix] = {}
    digest, last, total = ingest_digest.EMPTY, "", 0
    if wanted and wanted[0] == 0:
        result[0] = Prefix(0, digest, last, 0)
    target = wanted[-1] if wanted else 0
    n = 0
    if target:
        for file in sources.entries():
            if duplicates is not None and n < wanted[0]:
                duplicates.check(file)
            digest = ingest_digest.chain(digest, file.path, file.size, file.mtime_ns)
            last, total, n = file.path, total + file.size, n + 1
            if n in wanted:
                result[n] = Prefix(n, digest, last, total)
            if n == target:
                break
    if n < target:
        raise ResumeConflict(
            f"the daemon holds {target:,} files of the broken-off ingest, but the source has "
            f"only {n:,}: it changed since; ingest again without --resume (remove the partial "
            "ingest with `dlfs rm NAME` first)")
    return result


def check_prefix(progress: pb.IngestProgress, prefix: Prefix, name: str, address: str) -> None:
    if progress.digest != prefix.digest:
        raise ResumeConflict(
            f"cannot resume {name!r} on {address}: the daemon holds the first "
            f"{progress.samples:,} files of the broken-off ingest (the last is "
            f"{progress.last_path!r}), but the source's first {prefix.count:,} files differ "
            f"(the last is {prefix.last_path!r}; names, sizes or mtimes changed).  Ingest "
            f"again without --resume after `dlfs rm {name}`")


def get_progress(member, name: str) -> pb.IngestProgress | None:
    """The daemon's GetIngestProgress for `name`, or None when it has no unsealed ingest."""
    try:
        return member.call("GetIngestProgress", pb.GetIngestProgressRequest(dataset=name))
    except NotFound:
        return None


def check_resumable(progress: pb.IngestProgress, name: str, address: str) -> None:
    if progress.state == "receiving":
        raise ResumeConflict(
            f"the ingest of {name!r} on {address} is still receiving from another client "
            f"({progress.samples:,} files durable so far); stop that client, or wait until "
            "the daemon notices it is gone (its --stream-stall-timeout-s), then resume")


def resume_hint(error: Exception, members, name: str) -> Exception:
    """`error` with a note on what a resume would continue from, when anything is parked."""
    if isinstance(error, (AlreadyExists, ResumeConflict)):
        return error  # refused before anything was sent; the message says what to do
    notes = []
    for member in members:
        try:
            progress = member.call("GetIngestProgress",
                                   pb.GetIngestProgressRequest(dataset=name), timeout_s=5.0,
                                   retry=False)
        except Exception:  # noqa: BLE001 - only a hint
            continue
        notes.append(f"{progress.samples:,} files ({human_bytes(progress.bytes)}) on "
                     f"{member.address}")
    if not isinstance(error, DlfsError):
        return error
    if not notes:
        if not isinstance(error, Unavailable):
            return error
        hinted = type(error)(f"{error.message}; once the daemon is back, run the same command "
                             "with --resume to continue from its last checkpoint")
        hinted.request_id = error.request_id
        return hinted
    hinted = type(error)(f"{error.message}; the ingest is parked with {', '.join(notes)} "
                         "durable: run the same command with --resume to continue, or "
                         f"`dlfs rm {name}` to discard it")
    hinted.request_id = error.request_id
    return hinted


# --- one daemon --------------------------------------------------------------------------

class _Upload:
    """Generates the ingest stream and remembers a local failure to re-raise it."""

    def __init__(self, start: pb.IngestStart, pool: ReadPool, meter: IngestProgress,
                 duplicates: Duplicates | None, dirs=()):
        self.start = start
        self.dirs = dirs
        self.pool = pool
        self.meter = meter
        self.duplicates = duplicates
        self.error: BaseException | None = None

    def messages(self) -> Iterator[bytes]:
        try:
            yield from raw_messages(self.start, self._pieces())
        except BaseException as exc:  # gRPC would only report CANCELLED; keep the cause
            self.error = exc
            raise

    def _pieces(self):
        for piece in dir_pieces(self.dirs):  # first, on a resumed stream too
            yield piece, b""
        for file, data, last, crc in ordered_files(self.pool, self.meter, self.duplicates):
            if file is not None:
                head = pb.IngestPiece(path=file.path, size=file.size, mode=file.mode,
                                      mtime_ns=file.mtime_ns)
            else:
                head = pb.IngestPiece()
            if last:
                head.crc32c = crc
            yield head, data

    def failure(self, exc: grpc.RpcError, address: str) -> Exception:
        """What to raise for the failed call: the local cause if there was one."""
        if isinstance(self.error, DlfsError):
            return self.error
        if isinstance(self.error, OSError):
            return InvalidArgument(f"cannot read the source: {self.error}")
        if self.error is not None:
            return self.error
        return from_rpc_error(exc, address)


VIA_CHOICES = ("auto", "datapath", "grpc")


def upload(transport, name: str, source, *, replace: bool = False,
           progress: bool | str | None = None, readers: int = READERS_DEFAULT,
           resumable: bool = False, resume: bool = False, via: str = "auto",
           stats: IngestStats | None = None) -> DatasetInfo:
    """Stream `source` (a SourceSet, a source, or a `walk_tree` report) to one daemon
    (a `DaemonTransport`) as dataset `name`; one Ingest call.

    `progress`: None shows a bar when stderr is a terminal; "log" prints a
    line every few seconds.  `readers`: files read at once.  `via`: "auto"
    sends over the daemon's data path when it has one (its Unix socket on
    the same host, else TCP; `dlfs.client.transport.datapath_upload`), else over gRPC;
    "datapath" or "grpc" insist on one.  `resumable`:
    if the stream breaks off, the daemon keeps what it holds durably for a
    later `resume=True`.  `stats` (an IngestStats) is filled in.  Raises
    AlreadyExists (name taken, no `replace`; or a parked ingest of that
    name), InvalidArgument (bad or changing source files), ResumeConflict
    (see `dlfs.errors`), and the daemon's errors; a failed non-resumable
    ingest leaves nothing on the daemon.
    """
    check_dataset_name(name)
    if via not in VIA_CHOICES:
        raise InvalidArgument(f"via must be one of {', '.join(VIA_CHOICES)}, not {via!r}")
    data_path = None
    if via != "grpc":
        find = getattr(transport, "data_path", None)
        data_path = find() if find is not None else None
        if data_path is None and via == "datapath":
            raise FailedPrecondition(f"the daemon at {transport.address} has no data path "
                                     "to ingest over (TLS, or --data-port -1)")
    sources = as_source_set(source)
    duplicates = Duplicates() if sources.needs_duplicate_check else None
    start = pb.IngestStart(dataset=name, replace=replace, resumable=resumable or resume)
    skip, skipped = 0, Prefix(0, ingest_digest.EMPTY, "", 0)
    if resume:
        state = get_progress(transport, name)
        if state is None and not replace and name in transport.call_any(
                lambda member: [i.name for i in member.call(
                    "ListDatasets", pb.ListDatasetsRequest()).datasets]):
            raise AlreadyExists(f"dataset {name!r} is already ingested (sealed): nothing to "
                                "resume; pass --replace to ingest it again")
        if state is None:
            log.info("nothing to resume for %r on %s: starting a new ingest", name,
                     transport.address)
        else:
            check_resumable(state, name, transport.address)
            if state.members:
                raise ResumeConflict(
                    f"the broken-off ingest of {name!r} is striped over {', '.join(state.members)}"
                    "; resume it with all of them in --server")
            if state.replace != replace:
                raise ResumeConflict(
                    f"the broken-off ingest of {name!r} was started "
                    f"{'with' if state.replace else 'without'} --replace; resume it the same way")
            skipped = resume_prefix(sources, [state.samples], duplicates)[state.samples]
            check_prefix(state, skipped, name, transport.address)
            skip = state.samples
            start.resume, start.resume_from = True, skip
    meter = IngestProgress(f"ingest {name}", sources.total_bytes, mode=progress_mode(progress),
                           known_files=_remaining(sources, skip))
    meter.skip(skipped.bytes if sources.known_files is not None else 0)
    with pool_for(sources, skip, readers) as pool:
        try:
            info = None
            if data_path is not None:
                try:
                    info = datapath_upload.send(
                        data_path, name, ordered_files(pool, meter, duplicates),
                        replace=replace, resumable=start.resumable,
                        resume_from=skip if start.resume else None, dirs=sources.dirs)
                except datapath_upload.UnsupportedDaemon:
                    if via == "datapath":
                        raise FailedPrecondition(f"the daemon at {transport.address} cannot "
                                                 "ingest over its data path (older version)")
                except DlfsError as exc:
                    raise (resume_hint(exc, [transport], name) if start.resumable
                           else exc) from None
                except OSError as exc:  # the source: socket errors arrive as Unavailable
                    raise InvalidArgument(f"cannot read the source: {exc}") from None
            if info is None:
                stream = _Upload(start, pool, meter, duplicates, sources.dirs)
                try:
                    info = grpc_types.dataset_info(transport.ingest(stream.messages()))
                except grpc.RpcError as exc:
                    error = stream.failure(exc, transport.address)
                    if start.resumable:
                        error = resume_hint(error, [transport], name)
                    raise error from None
        finally:
            elapsed = meter.close()
    if stats is not None:
        stats.files, stats.data_bytes = meter.files, meter.data_bytes
        stats.source_bytes, stats.elapsed_s, stats.readers = meter.source_bytes, elapsed, readers
        stats.resumed_files, stats.resumed_bytes = skip, skipped.bytes
        stats.via = "grpc" if data_path is None else "datapath"
    return info


def _remaining(sources: SourceSet, skip: int) -> int | None:
    known = sources.known_files
    return None if known is None else known - skip
