"""The files of an ingest as one ordered stream of chunks, read in parallel.

An ingest stream carries its files one after the other: `pool_for` starts
the reader pool (`dlfs.staging.read_pool`) over the sources, `ordered_files`
hands out its chunks in the sources' order, each file's CRC32C computed as
it passes, duplicates refused and progress counted.  What a chunk becomes on
the wire is the transport's business (the client's upload).

A chunk is a tuple (file, data, last, crc): `file` (a `SourceFile`) on a
file's first chunk, else None; `data` its bytes (at most
`limits.ingest_message_bytes`); `last` on a file's last chunk, which carries
`crc`, the CRC32C of the whole file (0 on other chunks).
"""

from __future__ import annotations

from typing import Iterator

from dlfs import limits
from dlfs.crc import crc32c
from dlfs.staging.duplicates import Duplicates
from dlfs.staging.pace import Pace
from dlfs.staging.progress import IngestProgress
from dlfs.staging.read_pool import ReadPool
from dlfs.staging.source_set import SourceSet

# (file or None, data, last, crc): see the module docstring.
FileChunk = tuple


def pool_for(sources: SourceSet, skip: int, readers: int) -> ReadPool:
    """The reader pool over `sources` from entry `skip` on, `readers` files at once."""
    return ReadPool(sources.units(skip), threads=max(1, readers),
                    chunk_bytes=limits.ingest_message_bytes)


def ordered_files(pool, meter: IngestProgress, duplicates: Duplicates | None,
                  pace: Pace | None = None) -> Iterator[FileChunk]:
    """(file, data, last, crc) for every chunk of the pool, in order, counted in `meter`:
    `file` on a file's first chunk, `crc` (its CRC32C) on its last.  With a
    `pace`, a chunk is handed out no sooner than its pace allows.

    Raises InvalidArgument for a duplicate path, and what the pool raises
    (a source that cannot be read).  One CRC32C pass over the bytes.
    """
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
        if pace is not None:
            pace.spend(len(data))
        meter.advance(source_bytes, len(data), int(last))
        yield file, data, last, crc
