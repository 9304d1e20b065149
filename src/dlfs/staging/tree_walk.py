"""Directory trees as sources: which files become samples, found by a parallel walk.

`TreeSource(root)`: every regular file below the directory, as a sample
named by its path relative to the directory, '/'-separated.

- hidden entries (name starting with '.') are skipped, files and whole
  directories, unless `include_hidden`;
- symbolic links are skipped unless `follow_symlinks`; then links to files
  and to directories are followed, and a link back into a directory already
  on the current walk path (a loop) is skipped with a warning;
- FIFOs, sockets and devices are skipped;
- a directory that cannot be listed, or a file that cannot be read (its
  permissions), stops the walk with PermissionDenied, unless
  `skip_unreadable`: then it is left out and counted ("unreadable"; a file
  is asked with one access(2), so the walk decides it once and a resume
  finds the same files).  The source directory itself must be listable;
- a directory that ends up holding nothing (empty in the source, or only
  skipped entries) is kept as an empty directory of the dataset, so the
  dataset's tree is the one walked (DLIO, for one, creates an empty
  `valid/` folder and fails without it);
- a name that is not valid UTF-8 stops the ingest before anything is sent.

Entries are sorted by path.  Directories are listed and files stat'ed on a
pool of threads (a parallel file system answers one stat per millisecond or
so per client thread, so a one-at-a-time walk of ImageNet takes minutes).
Each file is one reading unit (`dlfs.staging.file_reads.read_file`).

`walk_tree` is the walk as a report (`WalkReport`): the files, their bytes
and what was skipped.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import stat as stat_module
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, Sequence

from dlfs.errors import InvalidArgument, NotFound
from dlfs.paths import check_sample_path
from dlfs.staging.file_reads import ReadHints, read_file
from dlfs.staging.source_files import (
    Counters,
    ReadContext,
    SourceFile,
    Unit,
    has_surrogates,
    source_error,
)

log = logging.getLogger(__name__)

# Threads that list directories and stat files during a walk.
WALK_THREADS_DEFAULT = 16


class TreeSource:
    """A directory tree; `scan()` walks it (once) and sorts its files by path."""

    kind = "tree"

    def __init__(self, root: str, *, include_hidden: bool = False,
                 follow_symlinks: bool = False, skip_unreadable: bool = False,
                 threads: int = WALK_THREADS_DEFAULT):
        self.root = root
        self.include_hidden = include_hidden
        self.follow_symlinks = follow_symlinks
        self.skip_unreadable = skip_unreadable
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
        """Walk the tree by the rules above.  Raises NotFound, InvalidArgument,
        PermissionDenied."""
        if self.files is not None:
            return
        if not os.path.isdir(self.root):
            raise NotFound(f"source directory {self.root!r} does not exist or is not a directory")
        root_stat = os.stat(self.root)
        files_found: list[SourceFile] = []
        with ThreadPoolExecutor(self.threads, thread_name_prefix="dlfs-walk") as pool:
            pending = [pool.submit(self._list, self.root, "",
                                   frozenset({(root_stat.st_dev, root_stat.st_ino)}))]
            while pending:
                files, subdirs, skipped, prefix, listed = pending.pop().result()
                if prefix and not files and not subdirs and listed:
                    self.dirs.append(prefix[:-1])
                files_found.extend(files)
                self.skipped.merge(skipped)
                pending.extend(pool.submit(self._list, *sub) for sub in subdirs)
        self.files = sorted(files_found, key=lambda f: f.path)
        self.dirs.sort()
        self._bytes = sum(f.size for f in self.files)

    def _list(self, directory: str, prefix: str, ancestors: frozenset):
        """One directory: (files, subdirectories to walk, skipped, `prefix`, whether it
        was listed).  Runs on the pool."""
        files, subdirs, skipped = [], [], Counters()
        try:
            listing = os.scandir(directory)
        except OSError as exc:
            if prefix and self.skip_unreadable and isinstance(exc, PermissionError):
                skipped.add("unreadable", directory, "directory")
                return files, subdirs, skipped, prefix, False
            what = "the source directory" if not prefix else "directory"
            raise source_error(exc, f"cannot list {what} {directory!r}") from None
        with listing as entries:
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
                    except PermissionError as exc:  # a directory listable but not searchable
                        if not self.skip_unreadable:
                            raise source_error(exc, f"cannot stat {entry.path!r}") from None
                        skipped.add("unreadable", entry.path)
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
                    if self.skip_unreadable and not os.access(entry.path, os.R_OK):
                        skipped.add("unreadable", entry.path)
                        continue
                    files.append(SourceFile(path, entry.path, st.st_size,
                                            stat_module.S_IFREG | stat_module.S_IMODE(st.st_mode),
                                            st.st_mtime_ns))
                else:
                    skipped.add("special", entry.path)
        if prefix:
            check_sample_path(prefix[:-1])  # it may become an empty directory of the dataset
        return files, subdirs, skipped, prefix, True

    def entries(self) -> Iterator[SourceFile]:
        self.scan()
        return iter(self.files)

    def units(self, skip: int = 0) -> Iterator[Unit]:
        """One unit per file, from the `skip`-th file on."""
        self.scan()
        for file in self.files[skip:]:
            yield _FileUnit(file, self.hints)


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


@dataclasses.dataclass
class WalkReport:
    """The files of one directory tree (`walk_tree`), sorted by dataset path."""

    files: list[SourceFile]
    bytes: int = 0
    skipped_hidden: int = 0
    skipped_symlinks: int = 0
    skipped_special: int = 0
    skipped_loops: int = 0
    skipped_unreadable: int = 0
    tree: TreeSource | None = None
    # Dataset paths of the directories that hold nothing, sorted.
    dirs: list[str] = dataclasses.field(default_factory=list)


def walk_tree(source_dir: str, *, include_hidden: bool = False,
              follow_symlinks: bool = False, skip_unreadable: bool = False) -> WalkReport:
    """Select the files of `source_dir` by the rules above.

    Raises NotFound (no such directory), InvalidArgument (bad name) and
    PermissionDenied (what cannot be read, without `skip_unreadable`).
    """
    tree = TreeSource(source_dir, include_hidden=include_hidden, follow_symlinks=follow_symlinks,
                      skip_unreadable=skip_unreadable)
    tree.scan()
    counts = tree.skipped.counts
    return WalkReport(tree.files, tree.total_bytes, counts["hidden"], counts["symlink"],
                      counts["special"], counts["loop"], counts["unreadable"], tree,
                      list(tree.dirs))
