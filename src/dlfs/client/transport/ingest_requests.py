"""An ingest stream as the transports take it: where it starts, and its pieces.

Plain values (the gRPC transport alone turns them into IngestMessages,
`grpc_ingest`): an `IngestStart` says what the stream builds, then
`IngestPiece`s carry the files one after the other, each file's first piece
naming it and its last carrying the CRC32C of all its bytes.  Staging hands
out chunks (`dlfs.staging.ordered_files`); `file_pieces` makes pieces of
them, one per chunk, nothing copied.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator, NamedTuple

from dlfs import limits
from dlfs.crc import crc32c


@dataclasses.dataclass(frozen=True)
class IngestStart:
    """What an ingest stream builds (the fields of dlfs.proto's IngestStart).

    `resume_from`: continue a parked resumable ingest after that many files
    (None: a new ingest).  Striped datasets: `members` in placement order,
    `replicas`, this daemon's `member_index`, the version's `generation`
    chosen by the client (0: the daemon's own), and `prepare_only` (two-phase:
    durable but unpublished until a commit).
    """

    dataset: str
    replace: bool = False
    resumable: bool = False
    resume_from: int | None = None
    members: tuple[str, ...] = ()
    replicas: int = 0
    member_index: int = 0
    prepare_only: bool = False
    generation: int = 0


class IngestPiece(NamedTuple):
    """One piece of an ingest stream (the fields of dlfs.proto's IngestPiece).

    A file's first piece names it (`path`, `size`, `mode`, `mtime_ns`); its
    last carries `crc32c` (None on the others).  `holders`: striped, the
    members storing the sample; `remote`/`kept`: metadata only (stored
    elsewhere / already held by this member); `directory`: an empty
    directory of the dataset.  A tuple: cheap to make, one per chunk.
    """

    path: str = ""
    size: int = 0
    mode: int = 0
    mtime_ns: int = 0
    data: bytes | memoryview = b""
    crc32c: int | None = None
    holders: tuple[int, ...] | list[int] = ()
    remote: bool = False
    kept: bool = False
    directory: bool = False


def dir_pieces(dirs: Iterable[str]) -> Iterator[IngestPiece]:
    """One piece per empty directory of the dataset (no data)."""
    for path in dirs:
        yield IngestPiece(path=path, directory=True)


def file_pieces(chunks) -> Iterator[IngestPiece]:
    """One piece per staged chunk (file, data, last, crc) (`dlfs.staging.ordered_files`)."""
    for file, data, last, crc in chunks:
        if file is not None:
            yield IngestPiece(file.path, file.size, file.mode, file.mtime_ns, data,
                              crc if last else None)
        else:
            yield IngestPiece(data=data, crc32c=crc if last else None)


def buffer_pieces(head: IngestPiece, data) -> Iterator[IngestPiece]:
    """A sample already in memory as pieces of at most `limits.ingest_message_bytes`:
    `head` (naming it) with the first, the CRC32C of all of them on the last.  An
    empty sample is one empty piece."""
    step = limits.ingest_message_bytes
    size = len(data)
    crc = 0
    piece = head
    for offset in range(0, max(size, 1), step):
        chunk = bytes(data[offset:offset + step])
        crc = crc32c(chunk, crc)
        last = offset + step >= size
        yield piece._replace(data=chunk, crc32c=crc if last else None)
        piece = IngestPiece()
