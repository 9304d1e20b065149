"""The vocabulary of staging: what a source file is, what the rules skip, what a reader
gets from the pool.

Every source (`dlfs.staging.tree_walk.TreeSource`, `dlfs.staging.tar_archive.TarSource`)
describes its samples as `SourceFile`s, counts what it leaves out in `Counters`, and
is read in `Unit`s that push chunks through a `ReadContext`
(`dlfs.staging.read_pool`).  Plain data, no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from dlfs.errors import DlfsError, InvalidArgument, NotFound, PermissionDenied
from dlfs.units import counted

@dataclasses.dataclass(frozen=True)
class SourceFile:
    """One sample to ingest: its dataset path and where its bytes come from."""

    path: str  # dataset path
    source: str  # file to read, or "ARCHIVE:MEMBER" (for messages)
    size: int
    mode: int
    mtime_ns: int


@dataclasses.dataclass(frozen=True)
class Skipped:
    """An entry the rules leave out: `kind` is one of SKIP_KINDS."""

    kind: str
    where: str
    detail: str = ""


# Kinds of skipped entries, and how a summary names one and several of them.
SKIP_KINDS = {"hidden": ("hidden", "hidden"), "symlink": ("symlink", "symlinks"),
              "special": ("special file", "special files"),
              "loop": ("symlink loop", "symlink loops"),
              "unreadable": ("unreadable", "unreadable")}


def skipped_text(kind: str, n: int) -> str:
    """"1 symlink", "0 symlink loops": `n` entries of `kind` (one of SKIP_KINDS)."""
    return counted(n, *SKIP_KINDS[kind])

# What an error that a permission caused advises (the CLI's option; `skip_unreadable`
# of `Client.ingest`).
UNREADABLE_ADVICE = ("fix its permissions, or pass --skip-unreadable to leave out what "
                     "cannot be read")


class Counters:
    """Skipped entries by kind, with the first few of each kept for `--dry-run`."""

    KEEP = 100_000

    def __init__(self):
        self.counts = {kind: 0 for kind in SKIP_KINDS}
        self.entries: list[Skipped] = []

    def add(self, kind: str, where: str, detail: str = "") -> None:
        self.counts[kind] += 1
        if len(self.entries) < self.KEEP:
            self.entries.append(Skipped(kind, where, detail))

    def merge(self, other: "Counters") -> None:
        for kind, n in other.counts.items():
            self.counts[kind] += n
        self.entries.extend(other.entries[:max(0, self.KEEP - len(self.entries))])

    def summary(self) -> str:
        """'3 hidden, 1 symlink' (empty when nothing was skipped)."""
        return ", ".join(skipped_text(kind, n) for kind, n in self.counts.items() if n)


class ReadContext:
    """What a unit's reader gets from the pool (see `dlfs.staging.read_pool`).

    `reserve(n)` waits until `n` more bytes may be held in memory; `push`
    hands one chunk of a file on (`file` on its first chunk only, `last` on
    its last; `source_bytes`: how far the source advanced, for progress);
    `chunk_bytes` is the largest chunk to read at once.
    """

    chunk_bytes: int

    def reserve(self, n: int) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def push(self, file: SourceFile | None, data: bytes, last: bool, source_bytes: int,
             reserved: int) -> None:  # pragma: no cover - interface
        raise NotImplementedError


# A unit of reading: a callable the pool runs on one of its threads.
Unit = Callable[[ReadContext], None]


def source_error(exc: OSError, doing: str | None = None) -> DlfsError:
    """The typed error for `exc`, raised while `doing` ("cannot list directory 'a/b'";
    by default "cannot read 'FILE'") to a source: PermissionDenied (with
    `UNREADABLE_ADVICE`), NotFound (removed since it was named), else InvalidArgument."""
    if doing is None:
        doing = f"cannot read {exc.filename!r}" if exc.filename else "cannot read the source"
    reason = exc.strerror or str(exc)
    if isinstance(exc, PermissionError):
        return PermissionDenied(f"{doing}: {reason.lower()}; {UNREADABLE_ADVICE}")
    if isinstance(exc, FileNotFoundError):
        return NotFound(f"{doing}: {reason.lower()} (removed while it was ingested?)")
    return InvalidArgument(f"{doing}: {reason}")


def has_surrogates(name: str) -> bool:
    """Whether `name` holds bytes that were not valid UTF-8 (surrogate escapes)."""
    try:
        name.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True
