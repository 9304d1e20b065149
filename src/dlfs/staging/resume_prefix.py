"""What the first entries of a source add up to, to compare with what a daemon holds.

A resumed ingest sends only the files after those the daemon already holds
durably.  It must first know that the source still starts with the same
files: `resume_prefix` chains a digest of their paths, sizes and mtimes
(`dlfs.formats.ingest_digest`, the digest the daemon keeps) without reading
their bytes; the client compares it with the daemon's.
"""

from __future__ import annotations

import dataclasses

from dlfs.errors import ResumeConflict
from dlfs.formats import ingest_digest
from dlfs.staging.duplicates import Duplicates
from dlfs.staging.source_set import SourceSet


@dataclasses.dataclass(frozen=True)
class Prefix:
    """What the first `count` entries of a source add up to."""

    count: int
    digest: bytes
    last_path: str
    bytes: int


EMPTY_PREFIX = Prefix(0, ingest_digest.EMPTY, "", 0)


def resume_prefix(sources: SourceSet, counts, duplicates: Duplicates | None) -> dict[int, Prefix]:
    """Digest (and sizes) of the first `count` entries for each of `counts`.

    Reads no file data: trees are already walked, archives are scanned
    (one pass over their headers).  The first min(counts) entries are
    checked into `duplicates` (the reader pool starts after them).  Raises
    ResumeConflict when the source has fewer entries than asked for.
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
            f"only {n:,}: it changed since; ingest again without --resume (end the parked "
            "ingest with `dlfs discard NAME` first)")
    return result
