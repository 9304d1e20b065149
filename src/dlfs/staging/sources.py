"""Where ingested files come from: directory trees and tar archives.

`open_sources(paths)` turns what the user named (directories, archives,
globs of archives, directories of archives) into one `SourceSet`: its
entries, in the order the ingest stream sends them, and the units the
reader pool (`dlfs.staging.read_pool`) reads in parallel.

Directory trees (`TreeSource`): every regular file below the directory, as
a sample named by its path relative to the directory, '/'-separated.

- hidden entries (name starting with '.') are skipped, files and whole
  directories, unless `include_hidden`;
- symbolic links are skipped unless `follow_symlinks`; then links to files
  and to directories are followed, and a link back into a directory already
  on the current walk path (a loop) is skipped with a warning;
- FIFOs, sockets and devices are skipped;
- a directory that ends up holding nothing (empty in the source, or only
  skipped entries) is kept as an empty directory of the dataset, so the
  dataset's tree is the one walked (DLIO, for one, creates an empty
  `valid/` folder and fails without it); archives' directory entries are
  not kept (their files imply their directories);
- a name that is not valid UTF-8 stops the ingest before anything is sent.

Entries are sorted by path.  Directories are listed and files stat'ed on a
pool of threads (a parallel file system answers one stat per millisecond or
so per client thread, so a one-at-a-time walk of ImageNet takes minutes).

Tar archives (`TarSource`; plain, gzip, bzip2 or xz, read by `tarfile`,
streamed in archive order without extracting anything):

- every regular member becomes a sample named by its path inside the
  archive; a leading './' is dropped (`tar -C dir -cf x.tar .` writes it).
  WebDataset shards need nothing special: `000123.jpg` and `000123.cls`
  become two samples side by side;
- directory members are implied (skipped, not counted); hidden members
  (any component starting with '.') are skipped unless `include_hidden`;
  FIFOs and devices are skipped (counted as special files);
- hard links become a copy of the member they link to; symbolic links are
  skipped (counted) unless `follow_symlinks`, then a link to a regular
  member of the same archive becomes a copy of it (links pointing outside
  the archive, or to nothing, are skipped with a warning).  Links are read
  in a second pass over their archive, after its other members, so they
  come last in the stream order of their archive;
- absolute member names ('/etc/passwd'), '..' components and names that are
  not valid UTF-8 stop the ingest with InvalidArgument naming the archive
  and the member: extracting such an archive would write outside its
  directory, and DLFS refuses to guess what was meant;
- mode and mtime come from the member's header (mtime in whole seconds);
- an archive is read to its declared end (`dlfs.staging.tar_end`): a damaged
  or missing header, or a compressed stream that fails its check, stops the
  ingest with InvalidArgument naming the byte offset and the member it
  followed (tarfile would end quietly there, a shorter archive), before the
  stream's end is sent: nothing is sealed or replaced from such an archive.

Several sources make one dataset: their entries share one namespace, in the
order the sources were given (archives of a glob or a directory in sorted
name order).  A path that two entries share stops the ingest with
InvalidArgument naming both places.
"""

from __future__ import annotations

import dataclasses
import fcntl
import glob
import io
import logging
import lzma
import mmap
import os
import posixpath
import stat as stat_module
import tarfile
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Sequence

from dlfs.errors import InvalidArgument, NotFound
from dlfs.paths import check_sample_path
from dlfs.staging.tar_end import check_end, open_archive

log = logging.getLogger(__name__)

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
# Threads that list directories and stat files during a walk.
WALK_THREADS_DEFAULT = 16
# Links followed one after the other inside one archive before giving up (a loop).
_LINK_HOPS_MAX = 40


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


# Kinds of skipped entries, and how a summary names them.
SKIP_KINDS = {"hidden": "hidden", "symlink": "symlinks", "special": "special files",
              "loop": "symlink loops"}


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
        """'3 hidden, 1 symlinks' (empty when nothing was skipped)."""
        return ", ".join(f"{n} {SKIP_KINDS[kind]}" for kind, n in self.counts.items() if n)


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


# --- directory trees -------------------------------------------------------------------

class TreeSource:
    """A directory tree; `scan()` walks it (once) and sorts its files by path."""

    kind = "tree"

    def __init__(self, root: str, *, include_hidden: bool = False,
                 follow_symlinks: bool = False, threads: int = WALK_THREADS_DEFAULT):
        self.root = root
        self.include_hidden = include_hidden
        self.follow_symlinks = follow_symlinks
        self.threads = max(1, threads)
        self.files: list[SourceFile] | None = None
        # Dataset paths of the directories that hold nothing kept (empty in the
        # source, or only skipped entries), sorted: kept as empty directories.
        self.dirs: list[str] = []
        self.skipped = Counters()
        self.hints = ReadHints()

    def __repr__(self) -> str:
        return f"TreeSource({self.root!r})"

    @classmethod
    def of_files(cls, files: Sequence[SourceFile]) -> "TreeSource":
        """A tree already walked: exactly `files`, in this order."""
        tree = cls("<files>")
        tree.files = list(files)
        tree._bytes = sum(f.size for f in tree.files)
        return tree

    @property
    def total_bytes(self) -> int:
        self.scan()
        return self._bytes

    def scan(self) -> None:
        """Walk the tree by the rules above.  Raises NotFound, InvalidArgument."""
        if self.files is not None:
            return
        if not os.path.isdir(self.root):
            raise NotFound(f"source directory {self.root!r} does not exist or is not a directory")
        root_stat = os.stat(self.root)
        self.files = []
        with ThreadPoolExecutor(self.threads, thread_name_prefix="dlfs-walk") as pool:
            pending = [pool.submit(self._list, self.root, "",
                                   frozenset({(root_stat.st_dev, root_stat.st_ino)}))]
            while pending:
                files, subdirs, skipped, prefix = pending.pop().result()
                if prefix and not files and not subdirs:
                    self.dirs.append(prefix[:-1])
                self.files.extend(files)
                self.skipped.merge(skipped)
                pending.extend(pool.submit(self._list, *sub) for sub in subdirs)
        self.files.sort(key=lambda f: f.path)
        self.dirs.sort()
        self._bytes = sum(f.size for f in self.files)

    def _list(self, directory: str, prefix: str, ancestors: frozenset):
        """One directory: (files, subdirectories to walk, skipped, `prefix`).  Runs on
        the pool."""
        files, subdirs, skipped = [], [], Counters()
        with os.scandir(directory) as entries:
            for entry in entries:
                if isinstance(entry.name, bytes) or has_surrogates(entry.name):
                    raise InvalidArgument(
                        f"file name {os.path.join(directory, entry.name)!r} is not valid UTF-8; "
                        "rename it (dataset paths are UTF-8)")
                if entry.name.startswith(".") and not self.include_hidden:
                    skipped.add("hidden", entry.path)
                    continue
                path = f"{prefix}{entry.name}"
                if entry.is_symlink():
                    if not self.follow_symlinks:
                        skipped.add("symlink", entry.path, _readlink(entry.path))
                        continue
                    try:
                        st = os.stat(entry.path)
                    except OSError:
                        log.warning("skipping dangling symlink %s", entry.path)
                        skipped.add("symlink", entry.path, "dangling")
                        continue
                else:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:  # removed since it was listed
                        continue
                is_dir = stat_module.S_ISDIR(st.st_mode)
                is_file = stat_module.S_ISREG(st.st_mode)
                if is_dir:
                    key = (st.st_dev, st.st_ino)
                    if key in ancestors:
                        log.warning("skipping symlink loop at %s", entry.path)
                        skipped.add("loop", entry.path)
                        continue
                    subdirs.append((entry.path, path + "/", ancestors | {key}))
                elif is_file:
                    try:
                        check_sample_path(path)
                    except InvalidArgument as exc:
                        raise InvalidArgument(f"{entry.path}: {exc.message}") from None
                    files.append(SourceFile(path, entry.path, st.st_size,
                                            stat_module.S_IFREG | stat_module.S_IMODE(st.st_mode),
                                            st.st_mtime_ns))
                else:
                    skipped.add("special", entry.path)
        if prefix:
            check_sample_path(prefix[:-1])  # it may become an empty directory of the dataset
        return files, subdirs, skipped, prefix

    def entries(self) -> Iterator[SourceFile]:
        self.scan()
        return iter(self.files)

    def units(self, skip: int = 0) -> Iterator[Unit]:
        """One unit per file, from the `skip`-th file on."""
        self.scan()
        for file in self.files[skip:]:
            yield _FileUnit(file, self.hints)


class ReadHints:
    """What reading one source learnt about its file system, so that no file pays
    for a refusal twice (on a parallel file system a refused open costs a round trip)."""

    def __init__(self):
        self.noatime = bool(_O_NOATIME)  # O_NOATIME is allowed (we own the files)
        self.nowait = bool(_RWF_NOWAIT and _O_DIRECT)  # RWF_NOWAIT and O_DIRECT work


class _FileUnit:
    __slots__ = ("file", "hints")

    def __init__(self, file: SourceFile, hints: ReadHints):
        self.file = file
        self.hints = hints

    def __call__(self, ctx: ReadContext) -> None:
        read_file(self.file, ctx, self.hints)


def _readlink(path: str) -> str:
    try:
        return "-> " + os.readlink(path)
    except OSError:
        return ""


_O_NOATIME = getattr(os, "O_NOATIME", 0)


def _open_for_reading(path: str, hints: ReadHints) -> int:
    """A read-only descriptor, without updating the access time where allowed."""
    flags = os.O_RDONLY | os.O_CLOEXEC
    if hints.noatime:
        try:
            return os.open(path, flags | _O_NOATIME)
        except PermissionError:  # O_NOATIME needs the file's owner (or CAP_FOWNER)
            hints.noatime = False
    return os.open(path, flags)


def _read_up_to(fd: int, n: int) -> bytes:
    """Read `n` bytes, fewer only at end of file (a network file system may
    return short reads before it)."""
    data = os.read(fd, n)
    if len(data) >= n or not data:
        return data
    parts = [data]
    got = len(data)
    while got < n:
        more = os.read(fd, n - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


_O_DIRECT = getattr(os, "O_DIRECT", 0)
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
_ALIGN = 4096
_local = threading.local()


def _aligned_buffer(size: int) -> memoryview:
    """This thread's page-aligned buffer of at least `size` bytes (O_DIRECT reads)."""
    buffer = getattr(_local, "buffer", None)
    if buffer is None or len(buffer) < size:
        buffer = mmap.mmap(-1, -(-size // _ALIGN) * _ALIGN)
        _local.buffer = buffer
    return memoryview(buffer)


def _read_small(fd: int, size: int, hints: ReadHints) -> bytes:
    """The whole of a small file (`size` + 1 bytes asked for, to see growth).

    Cached pages are copied (preadv with RWF_NOWAIT); a file that is not
    wholly in the page cache is read with O_DIRECT into an aligned buffer:
    on the development VM, cold reads through the page cache cost 1.5
    CPU-seconds per GB of kernel time to fill it, O_DIRECT a third of that
    (the copy out of the buffer included), at least as fast.  File systems
    without RWF_NOWAIT or O_DIRECT are read the plain way.
    """
    want = size + 1
    if hints.nowait and size:
        view = _aligned_buffer(want + _ALIGN)
        try:
            got = os.preadv(fd, [view[:want]], 0, _RWF_NOWAIT)
            if got == size or got == want:
                return bytes(view[:got])
        except BlockingIOError:
            pass  # not (wholly) cached
        except OSError:
            hints.nowait = False  # no RWF_NOWAIT on this file system
            return _read_up_to(fd, want)
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | _O_DIRECT)
        except OSError:
            hints.nowait = False
            return _read_up_to(fd, want)
        try:
            padded = -(-want // _ALIGN) * _ALIGN
            got = total = 0
            while total < want:
                got = os.preadv(fd, [view[total:padded]], total)
                if got <= 0:
                    break
                total += got
                if total % _ALIGN:  # a short read: end of file
                    break
            return bytes(view[:min(total, want)])
        except OSError:  # O_DIRECT refused after all (alignment rules of this device)
            hints.nowait = False
            fcntl.fcntl(fd, fcntl.F_SETFL, flags)
            return _read_up_to(fd, want)
    return _read_up_to(fd, want)


def _uncached(fd: int) -> bool:
    """Whether the file's first page is not in the page cache; then reads switch the
    descriptor to O_DIRECT (see `_read_small`).  False where that cannot be told."""
    try:
        os.preadv(fd, [bytearray(1)], 0, _RWF_NOWAIT)
        return False
    except BlockingIOError:
        pass
    except OSError:
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | _O_DIRECT)
        return True
    except OSError:
        return False


def _read_direct(fd: int, offset: int, n: int, hints: ReadHints) -> bytes:
    """`n` bytes at aligned `offset` of an O_DIRECT descriptor (fewer at end of file)."""
    view = _aligned_buffer(n + _ALIGN)
    padded = -(-n // _ALIGN) * _ALIGN
    got = 0
    while got < n:
        done = os.preadv(fd, [view[got:padded]], offset + got)
        if done <= 0:
            break
        got += done
        if got % _ALIGN:
            break
    return bytes(view[:min(got, n)])


def read_file(file: SourceFile, ctx: ReadContext, hints: ReadHints | None = None) -> None:
    """Read one file of a tree into the pool, in chunks of at most ctx.chunk_bytes.

    Raises InvalidArgument when it shrank or grew since the walk, OSError
    when it cannot be read.
    """
    hints = hints or ReadHints()
    fd = _open_for_reading(file.source, hints)
    try:
        size, step = file.size, ctx.chunk_bytes
        if size <= step:
            ctx.reserve(size)
            data = _read_small(fd, size, hints)
            _check_size(file, len(data))
            ctx.push(file, data, True, size, size)
            return
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        direct = hints.nowait and step % _ALIGN == 0 and _uncached(fd)
        sent, head = 0, file
        while sent < size:
            n = min(step, size - sent)
            ctx.reserve(n)
            data = _read_direct(fd, sent, n, hints) if direct else _read_up_to(fd, n)
            if len(data) < n:
                _check_size(file, sent + len(data))
            sent += n
            last = sent == size
            if last and (os.fstat(fd).st_size > size if direct else os.read(fd, 1)):
                _check_size(file, size + 1)
            ctx.push(head, data, last, n, n)
            head = None
    finally:
        os.close(fd)


def _check_size(file: SourceFile, got: int) -> None:
    if got < file.size:
        raise InvalidArgument(
            f"{file.source} shrank while being ingested ({got} of {file.size} bytes); "
            "ingest again once the source is stable")
    if got > file.size:
        raise InvalidArgument(f"{file.source} grew while being ingested; ingest again once "
                              "the source is stable")


def has_surrogates(name: str) -> bool:
    """Whether `name` holds bytes that were not valid UTF-8 (surrogate escapes)."""
    try:
        name.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


# --- tar archives ------------------------------------------------------------------------

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
                yield taken, _member_reader(tf, member) if read else None
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
            target = _link_target(member)
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
        return SourceFile(path, where, member.size, _member_mode(member), _member_mtime(member))

    def _resolve_links(self, links: list[_Link], read: bool):
        """Links as copies of their regular targets: a second, random-access pass."""
        raw = open(self.path, "rb")
        tf = tarfile.open(fileobj=raw, mode="r:*", encoding="utf-8", errors="surrogateescape")
        try:
            by_name: dict[str, tarfile.TarInfo] = {}
            wanted = {link.target for link in links}
            for member in tf:
                name = _normalized(member.name)
                if name in wanted or member.islnk() or member.issym():
                    by_name[name] = member
            for link in links:
                target = self._follow(link, by_name)
                where = f"{self.path}:{link.name}"
                if target is None:
                    self.skipped.add("symlink", where, f"-> {link.target} (not a regular member)")
                    continue
                file = SourceFile(link.path, where, target.size, _member_mode(target),
                                  _member_mtime(target))
                yield file, _member_reader(tf, target) if read else None
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
            name = _link_target(member)
            if name is None:
                return None
        log.warning("skipping link %s:%s: a loop of links", self.path, link.name)
        return None


class SequentialReader(io.RawIOBase):
    """A file read front to back with O_DIRECT in large aligned chunks, the next one
    read on a thread while this one is used (an archive: the disk sees one large
    read after another, the page cache is neither filled nor needed).

    Seeks inside the chunk in hand, or forward, are cheap; others restart the
    read-ahead there.  `open_sequential` falls back to a plain file where
    O_DIRECT does not work or the file is already in the page cache.
    """

    CHUNK = 8 * 1024 * 1024

    def __init__(self, fd: int, size: int):
        super().__init__()
        self._fd = fd
        self._size = size
        self._buffers = [mmap.mmap(-1, self.CHUNK) for _ in range(2)]
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dlfs-archive-read")
        self._pos = 0  # the reader's position
        self._start = 0  # file offset of the chunk in hand (aligned)
        self._have = 0  # valid bytes of the chunk in hand
        self._current = 0  # index of the buffer holding it
        self._ahead = None  # Future: (offset, bytes) read into the other buffer
        self._load(0)

    def _read_chunk(self, index: int, offset: int) -> int:
        view = memoryview(self._buffers[index])
        got = 0
        while got < self.CHUNK and offset + got < self._size:
            n = os.preadv(self._fd, [view[got:]], offset + got)
            if n <= 0:
                break
            got += n
        return got

    def _load(self, offset: int) -> None:
        """Make the chunk at `offset` (aligned) the one in hand; start reading the next."""
        if self._ahead is not None:
            ahead_offset, future = self._ahead
            self._ahead = None
            got = future.result()
            if ahead_offset == offset:
                self._current ^= 1
                self._start, self._have = offset, got
                self._prefetch()
                return
        self._start, self._have = offset, self._read_chunk(self._current, offset)
        self._prefetch()

    def _prefetch(self) -> None:
        following = self._start + self.CHUNK
        if following < self._size:
            self._ahead = (following, self._pool.submit(self._read_chunk, self._current ^ 1,
                                                        following))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, target) -> int:
        target = memoryview(target).cast("B")
        if self._pos >= self._size:
            return 0
        if not self._start <= self._pos < self._start + self._have:
            self._load(self._pos - self._pos % self.CHUNK)
            if not self._start <= self._pos < self._start + self._have:
                return 0
        at = self._pos - self._start
        n = min(len(target), self._have - at)
        target[:n] = memoryview(self._buffers[self._current])[at:at + n]
        self._pos += n
        return n

    def close(self) -> None:
        if not self.closed:
            if self._ahead is not None:
                self._ahead[1].cancel()
            self._pool.shutdown(wait=True)
            os.close(self._fd)
            for buffer in self._buffers:
                buffer.close()
        super().close()


def open_sequential(path: str):
    """`path` opened for one front-to-back read: a SequentialReader (O_DIRECT) when the
    file system takes it and the file's start is not in the page cache, else a plain
    buffered file."""
    if _O_DIRECT and _RWF_NOWAIT:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            probe = bytearray(_ALIGN)
            try:
                os.preadv(fd, [probe], 0, _RWF_NOWAIT)
                cached = True
            except BlockingIOError:
                cached = False
            if not cached:
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | _O_DIRECT)
                reader = SequentialReader(fd, os.fstat(fd).st_size)
                fd = -1
                return io.BufferedReader(reader, buffer_size=64 * 1024)
        except OSError:
            pass
        finally:
            if fd >= 0:
                os.close(fd)
    return open(path, "rb")


# What a damaged or truncated archive raises while it is decompressed or read.
_DAMAGE = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError)


class _MemberStream:
    def __init__(self, tf: tarfile.TarFile, member: tarfile.TarInfo):
        self._file = tf.extractfile(member)

    def __enter__(self):
        return self._file

    def __exit__(self, *exc):
        self._file.close()


def _member_reader(tf: tarfile.TarFile, member: tarfile.TarInfo):
    return lambda: _MemberStream(tf, member)


def _normalized(name: str) -> str:
    return "/".join(part for part in name.split("/") if part not in ("", "."))


def member_path(archive: str, name: str) -> str:
    """The dataset path of archive member `name` ("" for the archive's root).

    Raises InvalidArgument for absolute names, '..' components and names
    that are not valid UTF-8.
    """
    if has_surrogates(name):
        raise InvalidArgument(
            f"archive {archive!r} has member {name!r} whose name is not valid UTF-8; "
            "dataset paths are UTF-8 (re-create the archive with UTF-8 names)")
    if name.startswith("/"):
        raise InvalidArgument(
            f"archive {archive!r} has member {name!r} with an absolute name; DLFS takes only "
            "relative names (re-create the archive without the leading '/')")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise InvalidArgument(
            f"archive {archive!r} has member {name!r} with a '..' component, which would "
            "point outside the archive; DLFS refuses such archives")
    return "/".join(parts)


def _link_target(member: tarfile.TarInfo) -> str | None:
    """Normalized member name a link points to; None if it leaves the archive."""
    if member.islnk():
        target = member.linkname  # hard links name a member of the archive
    else:
        if member.linkname.startswith("/"):
            return None
        target = posixpath.join(posixpath.dirname(member.name), member.linkname)
    if target.startswith("/"):
        return None
    parts: list[str] = []
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts) or None


def _member_mode(member: tarfile.TarInfo) -> int:
    return stat_module.S_IFREG | (member.mode & 0o7777)


def _member_mtime(member: tarfile.TarInfo) -> int:
    return int(member.mtime) * 1_000_000_000


def is_archive_name(path: str) -> bool:
    return path.lower().endswith(ARCHIVE_SUFFIXES)


# --- several sources ------------------------------------------------------------------

class SourceSet:
    """The sources of one ingest, in order; their entries make one namespace."""

    def __init__(self, sources: Sequence):
        if not sources:
            raise InvalidArgument("no source to ingest")
        self.sources = list(sources)

    def __repr__(self) -> str:
        return f"SourceSet({self.sources!r})"

    @property
    def needs_duplicate_check(self) -> bool:
        """Whether two entries could share a path (a tree's paths are unique)."""
        return len(self.sources) > 1 or any(s.kind != "tree" for s in self.sources)

    def scan(self) -> None:
        """Walk every tree (archives are read as they stream)."""
        for source in self.sources:
            source.scan()

    @property
    def total_bytes(self) -> int:
        """What progress counts up to: file bytes of trees, archive bytes of archives."""
        return sum(source.total_bytes for source in self.sources)

    @property
    def known_files(self) -> int | None:
        """Files to send, when known before reading (trees only), else None."""
        if any(source.kind != "tree" for source in self.sources):
            return None
        return sum(len(source.files) for source in self.sources)

    @property
    def dirs(self) -> list[str]:
        """The empty directories of the dataset (trees' only: an archive's directory
        entries are not kept), sorted."""
        return sorted({d for source in self.sources for d in getattr(source, "dirs", ())})

    def skipped(self) -> Counters:
        total = Counters()
        for source in self.sources:
            total.merge(source.skipped)
        return total

    def entries(self) -> Iterator[SourceFile]:
        """Every entry in stream order (archives: a pass over their headers)."""
        for source in self.sources:
            yield from source.entries()

    def units(self, skip: int = 0) -> Iterator[Unit]:
        """The reading units from the `skip`-th entry on (counting every source's
        entries in order; archives before that point are scanned to count)."""
        for source in self.sources:
            if skip:
                if source.kind == "tree":
                    count = len(source.files)
                else:
                    count = sum(1 for _ in source.entries())
                if skip >= count:
                    skip -= count
                    continue
            yield from source.units(skip)
            skip = 0


def open_sources(paths: Sequence[str], *, archives: bool = False, include_hidden: bool = False,
                 follow_symlinks: bool = False, walk_threads: int = WALK_THREADS_DEFAULT
                 ) -> SourceSet:
    """The sources `paths` name, in order.

    A directory is a tree, or with `archives` every archive directly in it
    (names ending in ARCHIVE_SUFFIXES, sorted); a file is an archive; a path
    that does not exist but holds glob characters is expanded (sorted).
    Raises NotFound (nothing there, an empty glob or directory of archives)
    and InvalidArgument (a file that is not an archive).
    """
    options = dict(include_hidden=include_hidden, follow_symlinks=follow_symlinks)
    sources = []
    for path in paths:
        if not os.path.exists(path) and glob.has_magic(path):
            matches = sorted(glob.glob(path))
            if not matches:
                raise NotFound(f"no file matches {path!r}")
        else:
            matches = [path]
        for match in matches:
            sources.extend(_sources_of(match, archives, options, walk_threads))
    return SourceSet(sources)


def _sources_of(path: str, archives: bool, options: dict, walk_threads: int) -> list:
    if os.path.isdir(path):
        if not archives:
            return [TreeSource(path, threads=walk_threads, **options)]
        found = sorted(entry.path for entry in os.scandir(path)
                       if entry.is_file() and is_archive_name(entry.name))
        if not found:
            raise NotFound(f"directory {path!r} holds no archive "
                           f"({', '.join(ARCHIVE_SUFFIXES)})")
        return [TarSource(p, **options) for p in found]
    if not os.path.exists(path):
        raise NotFound(f"source directory or archive {path!r} does not exist")
    if not os.path.isfile(path):
        raise InvalidArgument(f"source {path!r} is neither a directory nor an archive file")
    if not is_archive_name(path) and not tarfile.is_tarfile(path):
        raise InvalidArgument(f"source {path!r} is a file but not a tar archive (plain, gzip, "
                              "bzip2 or xz); give a directory or an archive")
    return [TarSource(path, **options)]
