"""Tar archives as sources: every regular member a sample, streamed in archive order.

`TarSource(path)` reads plain, gzip, bzip2 or xz archives with `tarfile`,
without extracting anything:

- every regular member becomes a sample named by its path inside the
  archive (`dlfs.staging.tar_members.member_path`: a leading './' is dropped,
  `tar -C dir -cf x.tar .` writes it).  WebDataset shards need nothing
  special: `000123.jpg` and `000123.cls` become two samples side by side;
- directory members are implied (skipped, not counted: their files imply
  them); hidden members (any component starting with '.') are skipped
  unless `include_hidden`; FIFOs and devices are skipped (counted as
  special files);
- hard links become a copy of the member they link to; symbolic links are
  skipped (counted) unless `follow_symlinks`, then a link to a regular
  member of the same archive becomes a copy of it (links pointing outside
  the archive, or to nothing, are skipped with a warning).  Links are read
  in a second pass over their archive, after its other members, so they
  come last in the stream order of their archive;
- absolute member names, '..' components and names that are not valid
  UTF-8 stop the ingest with InvalidArgument naming the archive and member;
- mode and mtime come from the member's header (mtime in whole seconds);
- an archive is read to its declared end (`dlfs.staging.tar_end`): a damaged
  or missing header, or a compressed stream that fails its check, stops the
  ingest with InvalidArgument naming the byte offset and the member it
  followed (tarfile would end quietly there, a shorter archive), before the
  stream's end is sent: nothing is sealed or replaced from such an archive.

The whole archive is one reading unit, read front to back
(`dlfs.staging.sequential_reads`).
"""

from __future__ import annotations

import dataclasses
import logging
import lzma
import os
import tarfile
import zlib
from typing import Callable, Iterator

from dlfs.errors import InvalidArgument, NotFound
from dlfs.paths import check_sample_path
from dlfs.staging.sequential_reads import open_sequential
from dlfs.staging.tar_end import check_end, open_archive
from dlfs.staging.source_files import Counters, ReadContext, SourceFile, Unit
from dlfs.staging.tar_members import (
    link_target,
    member_mode,
    member_mtime_ns,
    member_path,
    member_reader,
    normalized_name,
)

log = logging.getLogger(__name__)

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
# Links followed one after the other inside one archive before giving up (a loop).
_LINK_HOPS_MAX = 40
# What a damaged or truncated archive raises while it is decompressed or read.
_DAMAGE = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError)


def is_archive_name(path: str) -> bool:
    """Whether `path` ends in one of ARCHIVE_SUFFIXES (any case)."""
    return path.lower().endswith(ARCHIVE_SUFFIXES)


@dataclasses.dataclass
class _Link:
    """A link member taken for a copy of its target (read in a second pass)."""

    path: str  # dataset path
    name: str  # member name as stored
    target: str  # normalized name of the member it points to
    hard: bool


class TarSource:
    """One tar archive (any compression `tarfile` reads), streamed in archive order."""

    kind = "tar"

    def __init__(self, path: str, *, include_hidden: bool = False, follow_symlinks: bool = False):
        self.path = path
        self.include_hidden = include_hidden
        self.follow_symlinks = follow_symlinks
        self.skipped = Counters()
        self._scanned: list[SourceFile] | None = None
        try:
            self.archive_bytes = os.path.getsize(path)
        except OSError as exc:
            raise NotFound(f"archive {path!r} cannot be read: {exc.strerror}") from None

    def __repr__(self) -> str:
        return f"TarSource({self.path!r})"

    @property
    def total_bytes(self) -> int:
        """Bytes of the archive file (compressed): what progress counts for it."""
        return self.archive_bytes

    def scan(self) -> None:
        """Nothing to do up front: an archive is read as it streams."""

    def entries(self) -> Iterator[SourceFile]:
        """Every taken member, in stream order (reads the archive's headers once;
        member data is skipped over, or decompressed and dropped)."""
        if self._scanned is None:
            self.skipped = Counters()
            try:
                self._scanned = [file for file, _reader in self._members(read=False)]
            except _DAMAGE as exc:
                raise InvalidArgument(f"archive {self.path!r} is damaged or truncated: "
                                      f"{type(exc).__name__}: {exc}") from None
        return iter(self._scanned)

    def units(self, skip: int = 0) -> Iterator[Unit]:
        """The whole archive is one unit (it is read sequentially), from its
        `skip`-th taken member on."""
        yield lambda ctx: self.read(ctx, skip)

    def read(self, ctx: ReadContext, skip: int = 0) -> None:
        """Stream the taken members into the pool.  Raises InvalidArgument (bad
        member, damaged archive), OSError."""
        try:
            self._read(ctx, skip)
        except _DAMAGE as exc:
            raise InvalidArgument(f"archive {self.path!r} is damaged or truncated: "
                                  f"{type(exc).__name__}: {exc}") from None

    def _read(self, ctx: ReadContext, skip: int) -> None:
        self.skipped = Counters()
        step = ctx.chunk_bytes
        position = 0
        for index, (file, reader) in enumerate(self._members(read=True)):
            if index < skip:
                continue
            size = file.size
            head = file
            sent = 0
            with reader() as stream:
                while True:
                    n = min(step, size - sent)
                    ctx.reserve(n)
                    data = stream.read(n) if n else b""
                    if len(data) < n:
                        raise InvalidArgument(
                            f"archive {self.path!r} ends inside member {file.source!r} "
                            f"({sent + len(data)} of {size} bytes); it is truncated")
                    sent += n
                    last = sent == size
                    now = self._position()
                    ctx.push(head, data, last, max(0, now - position), n)
                    position = max(position, now)
                    head = None
                    if last:
                        break
        ctx.push(None, b"", False, max(0, self.archive_bytes - position), 0)

    # ---------------------------------------------------------------------------------

    def _position(self) -> int:
        raw = self._raw
        try:
            return raw.tell() if raw is not None else 0
        except (OSError, ValueError):
            return 0

    def _open(self, direct: bool = False):
        self._raw = open_sequential(self.path) if direct else open(self.path, "rb")
        try:
            return open_archive(self._raw, self.path)
        except tarfile.TarError as exc:
            self._raw.close()
            raise InvalidArgument(f"{self.path!r} is not a tar archive tarfile can read "
                                  f"(plain, gzip, bzip2 or xz): {exc}") from None

    def _members(self, read: bool) -> Iterator[tuple[SourceFile, Callable]]:
        """(file, opener of its bytes) for every taken member, links last."""
        self._raw = None
        tf = self._open(direct=read)
        links: list[_Link] = []
        last = None  # the last member's name, for messages
        try:
            while True:
                try:
                    member = tf.next()
                except tarfile.TarError as exc:
                    raise InvalidArgument(f"archive {self.path!r} is damaged after "
                                          f"{self._position()} bytes: {exc}") from None
                if member is None:  # its end, or a header tarfile could not read
                    check_end(tf, self._raw, self.path, last)
                    break
                last = member.name
                tf.members = []  # tarfile keeps every header otherwise: memory per member
                taken = self._take(member, links)
                if taken is None:
                    continue
                yield taken, member_reader(tf, member) if read else None
        finally:
            tf.close()
            self._raw.close()
        if links:
            yield from self._resolve_links(links, read)

    def _take(self, member: tarfile.TarInfo, links: list[_Link]) -> SourceFile | None:
        """The sample a member becomes, None when the rules skip it."""
        where = f"{self.path}:{member.name}"
        path = member_path(self.path, member.name)
        if not path:  # the archive's root directory ("." or "./")
            return None
        if not self.include_hidden and any(part.startswith(".") for part in path.split("/")):
            if not member.isdir():
                self.skipped.add("hidden", where)
            return None
        if member.isdir():
            return None
        try:
            check_sample_path(path)
        except InvalidArgument as exc:
            raise InvalidArgument(f"archive {self.path!r}, member {member.name!r}: "
                                  f"{exc.message}") from None
        if member.islnk() or member.issym():
            if member.issym() and not self.follow_symlinks:
                self.skipped.add("symlink", where, "-> " + member.linkname)
                return None
            target = link_target(member)
            if target is None:
                log.warning("skipping %s: its link target %r is outside the archive", where,
                            member.linkname)
                self.skipped.add("symlink", where, "-> " + member.linkname + " (outside)")
                return None
            links.append(_Link(path, member.name, target, member.islnk()))
            return None
        if not member.isreg():  # FIFOs, devices
            self.skipped.add("special", where)
            return None
        return SourceFile(path, where, member.size, member_mode(member), member_mtime_ns(member))

    def _resolve_links(self, links: list[_Link], read: bool):
        """Links as copies of their regular targets: a second, random-access pass."""
        raw = open(self.path, "rb")
        tf = tarfile.open(fileobj=raw, mode="r:*", encoding="utf-8", errors="surrogateescape")
        try:
            by_name: dict[str, tarfile.TarInfo] = {}
            wanted = {link.target for link in links}
            for member in tf:
                name = normalized_name(member.name)
                if name in wanted or member.islnk() or member.issym():
                    by_name[name] = member
            for link in links:
                target = self._follow(link, by_name)
                where = f"{self.path}:{link.name}"
                if target is None:
                    self.skipped.add("symlink", where, f"-> {link.target} (not a regular member)")
                    continue
                file = SourceFile(link.path, where, target.size, member_mode(target),
                                  member_mtime_ns(target))
                yield file, member_reader(tf, target) if read else None
        finally:
            tf.close()
            raw.close()

    def _follow(self, link: _Link, by_name: dict) -> tarfile.TarInfo | None:
        name = link.target
        for _ in range(_LINK_HOPS_MAX):
            member = by_name.get(name)
            if member is None:
                log.warning("skipping link %s:%s: %r is not in the archive", self.path,
                            link.name, name)
                return None
            if member.isreg():
                return member
            if not (member.islnk() or member.issym()):
                return None
            name = link_target(member)
            if name is None:
                return None
        log.warning("skipping link %s:%s: a loop of links", self.path, link.name)
        return None
