"""Reads of the daemon's extents by a mount on its host: whole small files, checked parts.

Why (docs/DESIGN.md, "Small files from the extents", has the figures): a
cold small file read through the daemon costs CPU on both sides (its
request through the data path, the reply, trio and thread hand-offs),
several times what ext4 takes, and in DLIO's first epoch over a dataset
larger than the warm-up budget that CPU is taken from the readers' own
decoding.  A mount on the daemon's host gets
the extents' read-only descriptors as `Client(direct=True)` does (passed
over the daemon's Unix socket, the data dir stays 0700), maps them, checks
a file's CRC32C on the mapping and answers from it: no round trip, nothing
for the daemon to do.  Opening a dataset's extents counts as its first read
at the daemon (its warm-up starts, when it warms on first read).

Generations: every read names its node's version; a replaced dataset is
reloaded or StaleGeneration, never the new version's bytes under an old
name.  Integrity: a whole file is checked against its CRC32C, a part
(the splice path of large files) against the CRC32Cs of the blocks around
it; a mismatch raises DataCorruption naming the file, as reads through the
daemon do.

A dataset whose extents this process cannot have (another host, TLS, a
foreign user without a token, a striped dataset's sample on another daemon)
is read through the daemon, said once in the log.  Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from dlfs import errors
from dlfs.client import named_checksum_error
from dlfs.fuse.attributes import read_generation
from dlfs.fuse.inodes import Node

log = logging.getLogger(__name__)

# Maps a dataset's extents: (dataset) -> its reader (a `dlfs.client.DirectReader`, as
# `Client.extent_reader` makes it); raises DlfsError when this process cannot have them.
OpenReader = Callable[[str], object]


class ExtentReaders:
    """One extent reader per dataset, opened at its first use; None where unavailable."""

    def __init__(self, open_reader: OpenReader):
        self._open_reader = open_reader
        self._readers: dict[str, object | None] = {}
        self._lock = threading.Lock()
        self.files = 0  # whole files read from the extents, one at a time (READs)
        self.bytes = 0
        self.batched_files = 0  # ... and in batches (the page push)
        self.batched_bytes = 0
        self.range_bytes = 0  # parts of large files (when they are not spliced)
        # Reads that may have touched a mapping (`PagesRelease` asks whether it grew;
        # unlocked: a lost increment among several still changes it).
        self.uses = 0

    def whole(self, node: Node) -> memoryview | None:
        """All bytes of file `node`, CRC32C verified, as a view of the mapped extent; None
        when its dataset's extents are not to be had here, or it is a sample of a
        striped dataset that other daemons store (read it through the daemon).
        Raises DataCorruption naming the file, StaleGeneration, NotFound (the dataset was
        deleted); Unavailable or DeadlineExceeded when the daemon does not answer the
        first read of a dataset (which opens its extents) or a reload of a replaced one."""
        reader = self._usable(node)
        if reader is None:
            return None
        data = _checked(lambda: reader.sample(node.sample_id, generation=read_generation(node)),
                        [node])
        if data is not None:
            with self._lock:
                self.files += 1
                self.bytes += len(data)
        return data

    def batch(self, nodes: list[Node]) -> list[memoryview] | None:
        """Whole files `nodes` (one dataset and version), verified, as `whole` reads one;
        None when their extents are not to be had here."""
        reader = self._usable(nodes[0]) if nodes else None
        if reader is None or any(n.sample_id < 0 for n in nodes):
            return None
        datas = _checked(lambda: reader.get_batch([n.sample_id for n in nodes],
                                                  generation=read_generation(nodes[0])), nodes)
        if datas is not None:
            with self._lock:
                self.batched_files += len(datas)
                self.batched_bytes += sum(len(d) for d in datas)
        return datas

    def range(self, node: Node, offset: int, length: int) -> memoryview | None:
        """`length` bytes of file `node` at `offset` (clipped to the file) as a view of the
        mapped extent, checked against the CRC32Cs of the blocks around them
        (`DirectReader.read_range`); None when it cannot be read from the extents here
        (as `whole`; also a daemon without block CRCs).  Raises what `whole` raises."""
        reader = self._usable(node)
        if reader is None:
            return None
        data = _checked(lambda: reader.read_range(node.sample_id, offset, length,
                                                  generation=read_generation(node)), [node])
        if data is not None:
            with self._lock:
                self.range_bytes += len(data)
        return data

    def part(self, node: Node, offset: int, length: int) -> tuple[int, int, int] | None:
        """(descriptor, offset in the extent, bytes) of a checked part of file `node`
        (`DirectReader.extent_part`: the descriptor is the caller's to close), or None
        when it cannot be served from the extents.  Raises what `whole` raises."""
        reader = self._usable(node)
        if reader is None:
            return None
        return _checked(lambda: reader.extent_part(node.sample_id, offset, length,
                                                   generation=read_generation(node)), [node])

    def release_mapped_pages(self) -> int:
        """Let go of the extent pages this process mapped, in every dataset opened
        (`DirectReader.release_mapped_pages`: they stay in the page cache); returns the
        bytes of the mappings released.  The mount calls it when `PagesRelease`
        says so: once it read nothing from the extents for `--extent-pages-release`
        seconds, and now and then while it reads on."""
        with self._lock:
            readers = [r for r in self._readers.values() if r is not None]
        return sum(reader.release_mapped_pages() for reader in readers)

    def counts(self) -> dict[str, int]:
        """What was read from the extents so far (the mount logs it on SIGUSR1)."""
        with self._lock:
            return {"files": self.files, "bytes": self.bytes,
                    "batched_files": self.batched_files, "batched_bytes": self.batched_bytes,
                    "range_bytes": self.range_bytes}

    def _usable(self, node: Node):
        if node.sample_id < 0:  # a directory, or a file known by path only
            return None
        if node.space:
            # A checkpoint file: each version is a dataset of its own, and readers are
            # kept per dataset for the mount's life (never closed under a read): read
            # through the daemon rather than hold one per version ever read.
            return None
        self.uses += 1
        return self._reader(node.dataset)

    def _reader(self, dataset: str):
        with self._lock:
            if dataset in self._readers:
                return self._readers[dataset]
        try:
            reader = self._open_reader(dataset)
        except (errors.Unavailable, errors.DeadlineExceeded):
            # The daemon away or frozen: this read fails as one through it would (it
            # would wait as long again), and the next one asks again.
            raise
        except errors.DlfsError as exc:
            log.info("files of dataset %r are read through the daemon, not from its "
                     "extents: %s", dataset, exc)
            reader = None
        with self._lock:
            return self._readers.setdefault(dataset, reader)


def _checked(read, nodes: list[Node]):
    """`read()`, whose DataCorruption names its file's path (one of `nodes`), as reads
    through the daemon do; None when the daemon must serve it: a sample stored on
    other daemons (striped)."""
    try:
        return read()
    except errors.DataCorruption as exc:
        damaged = next((n for n in nodes if n.sample_id == exc.sample_id), None)
        raise (exc if damaged is None else _named(exc, damaged)) from None
    except errors.StoredElsewhere:  # striped, and stored by other daemons
        return None


def _named(exc: errors.DataCorruption, node: Node) -> errors.DataCorruption:
    """The checksum error naming `node`'s path, as reads through the daemon name it."""
    return named_checksum_error(exc, lambda sample_id: f"sample {sample_id} {node.path!r} of "
                                f"dataset {node.dataset!r}")


class PagesRelease:
    """When a mount lets go of the extent pages it mapped (`release_mapped_pages`).

    Asked every `idle_s / 2` seconds with the clock and `ExtentReaders.uses`:
    due once a read happened since the last release and none for `idle_s`
    (the pages then leave the page cache by drop_caches, as the daemon's do),
    or `busy_s` after the last release while reads go on.  Plain state, no
    clock of its own (tests give the times).
    """

    def __init__(self, idle_s: float, busy_s: float):
        assert 0 < idle_s <= busy_s
        self.idle_s = idle_s
        self.busy_s = busy_s
        self._uses = 0
        self._used_at = self._released_at = 0.0
        self._mapped = False  # a read since the last release

    def due(self, now: float, uses: int) -> bool:
        """Whether to release now (then it counts as done at `now`)."""
        if uses != self._uses:
            self._uses, self._used_at, self._mapped = uses, now, True
        if not self._mapped:
            self._released_at = now
            return False
        if now - self._used_at < self.idle_s and now - self._released_at < self.busy_s:
            return False
        self._released_at, self._mapped = now, False
        return True
