"""Reading a tar archive to its declared end: Python's `tarfile` stops quietly short of it.

`tarfile` ends its iteration without an error at the first header after
the first member that it cannot read: a bad checksum, a file cut inside a
header, or a file that ends without the end-of-archive block.  An archive
whose 4th header of 6 is damaged reads as an archive of 3 members, and an
ingest of it would seal (or, with --replace, publish over a good dataset) a
shorter dataset.  GNU tar says "Skipping to next header" and exits 2.

`open_archive` opens an archive whose headers record why the iteration
stopped; once `next()` returns None, `check_end` accepts only the
end-of-archive marker (a zero block; one is enough, as for GNU tar) and
otherwise raises InvalidArgument naming the archive, the byte offset of
the header that broke (in the uncompressed tar stream) and the member it
followed.  For a compressed archive it then reads the compressed stream to
its end, which is where gzip, bzip2 and xz check their CRCs: a flipped bit
in member data is refused there, not ingested.  A plain archive's bytes
after the marker (record padding) are not read, as GNU tar does not.
Nothing here imports the client or the server.
"""

from __future__ import annotations

import lzma
import tarfile
import zlib

from dlfs.errors import InvalidArgument

# Read size when a compressed archive is read to its end after the marker.
_DRAIN_BYTES = 1 << 20


class _RecordingTarInfo(tarfile.TarInfo):
    """A TarInfo whose failure to parse a header is kept on its TarFile (`stopped_by`),
    where `tarfile.TarFile.next` would drop it."""

    @classmethod
    def fromtarfile(cls, archive):
        try:
            return super().fromtarfile(archive)
        except tarfile.HeaderError as exc:
            archive.stopped_by = exc
            raise


class CheckedTarFile(tarfile.TarFile):
    """A TarFile that remembers why its iteration ended (see `check_end`)."""

    tarinfo = _RecordingTarInfo
    stopped_by: tarfile.HeaderError | None = None


def open_archive(raw, path: str) -> CheckedTarFile:
    """`raw` (the archive file, open for reading) as a CheckedTarFile of any compression
    tarfile reads.  Raises tarfile.TarError (not a tar archive)."""
    return CheckedTarFile.open(fileobj=raw, mode="r:*", encoding="utf-8",
                               errors="surrogateescape")


def check_end(archive: CheckedTarFile, raw, path: str, last_member: str | None) -> None:
    """Raise unless `archive`, whose `next()` just returned None, ended at its
    end-of-archive marker and, when compressed, its compressed stream is whole.

    `raw` is the file `archive` reads from (compressed or not), `path` names
    the archive in messages, `last_member` is the name of the last member
    read (None: none).  Cost: nothing for a plain archive; for a compressed
    one, decompressing what follows the marker (a record's padding, usually).
    Raises InvalidArgument with the byte offset and the member it followed.
    """
    stop = archive.stopped_by
    after = f"after member {last_member!r}" if last_member is not None else "before any member"
    compressed = archive.fileobj is not raw
    where = "of its uncompressed tar stream" if compressed else ""
    offset = f"byte {archive.offset:,}{' ' + where if where else ''}"
    if isinstance(stop, tarfile.EOFHeaderError):
        if compressed:
            _read_to_end(archive, path)
        return
    if isinstance(stop, tarfile.EmptyHeaderError):
        raise InvalidArgument(
            f"archive {path!r} is truncated: it ends at {offset}, {after}, without its "
            "end-of-archive block: download or create it again")
    if isinstance(stop, tarfile.TruncatedHeaderError):
        raise InvalidArgument(
            f"archive {path!r} is truncated inside the header at {offset}, {after}: download "
            "or create it again")
    reason = str(stop) if stop is not None else "tarfile stopped reading there"
    raise InvalidArgument(
        f"archive {path!r} is damaged: the header at {offset}, {after}, is not a valid tar "
        f"header ({reason}); GNU tar would skip to the next header, DLFS seals nothing from "
        "a damaged archive: repair it or create it again")


def _read_to_end(archive: CheckedTarFile, path: str) -> None:
    """Decompress what follows the marker, so that the format checks its CRCs."""
    try:
        while archive.fileobj.read(_DRAIN_BYTES):
            pass
    except (OSError, EOFError, zlib.error, lzma.LZMAError) as exc:
        raise InvalidArgument(
            f"archive {path!r} is damaged: reading its compressed stream to its end failed "
            f"({type(exc).__name__}: {exc}): download or create it again") from None
