"""The sources of one ingest: what the user named, as one ordered namespace of samples.

`open_sources(paths)` turns what the user named (directories, archives,
globs of archives, directories of archives, a single file of any other
kind) into one `SourceSet`: its
entries, in the order the ingest stream sends them, and the units the
reader pool (`dlfs.staging.read_pool`) reads in parallel.  Trees are
`dlfs.staging.tree_walk.TreeSource`, archives `dlfs.staging.tar_archive.TarSource`.

Several sources make one dataset: their entries share one namespace, in the
order the sources were given (archives of a glob or a directory in sorted
name order).  A path that two entries share stops the ingest with
InvalidArgument naming both places (`dlfs.staging.duplicates`).
"""

from __future__ import annotations

import glob
import os
import stat
import tarfile
from typing import Iterator, Sequence

from dlfs.errors import InvalidArgument, NotFound
from dlfs.paths import check_sample_path
from dlfs.staging.source_files import Counters, SourceFile, Unit, source_error
from dlfs.staging.tar_archive import ARCHIVE_SUFFIXES, TarSource, is_archive_name
from dlfs.staging.tree_walk import WALK_THREADS_DEFAULT, TreeSource, WalkReport


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
                 follow_symlinks: bool = False, skip_unreadable: bool = False,
                 walk_threads: int = WALK_THREADS_DEFAULT) -> SourceSet:
    """The sources `paths` name, in order.

    A directory is a tree, or with `archives` every archive directly in it
    (names ending in ARCHIVE_SUFFIXES, sorted); a file is an archive, or, if it
    is none (one big HDF5, Parquet or NPZ file), one sample named by its base
    name; a path that does not exist but holds glob characters is expanded
    (sorted).  `skip_unreadable`: trees leave out what cannot be read
    (`dlfs.staging.tree_walk`).  Raises NotFound (nothing there, an empty glob
    or directory of archives), InvalidArgument (neither a directory nor a
    regular file; a bad name) and PermissionDenied.
    """
    options = dict(include_hidden=include_hidden, follow_symlinks=follow_symlinks)
    tree_options = dict(options, skip_unreadable=skip_unreadable)
    sources = []
    for path in paths:
        if not os.path.exists(path) and glob.has_magic(path):
            matches = sorted(glob.glob(path))
            if not matches:
                raise NotFound(f"no file matches {path!r}")
        else:
            matches = [path]
        for match in matches:
            try:
                sources.extend(_sources_of(match, archives, options, tree_options,
                                           walk_threads))
            except OSError as exc:
                raise source_error(exc, f"cannot read {match!r}") from None
    return SourceSet(sources)


def _sources_of(path: str, archives: bool, options: dict, tree_options: dict,
                walk_threads: int) -> list:
    if os.path.isdir(path):
        if not archives:
            return [TreeSource(path, threads=walk_threads, **tree_options)]
        found = sorted(entry.path for entry in os.scandir(path)
                       if entry.is_file() and is_archive_name(entry.name))
        if not found:
            raise NotFound(f"directory {path!r} holds no archive "
                           f"({', '.join(ARCHIVE_SUFFIXES)})")
        return [TarSource(p, **options) for p in found]
    if not os.path.exists(path):
        raise NotFound(f"source directory or archive {path!r} does not exist")
    if not os.path.isfile(path):
        raise InvalidArgument(f"source {path!r} is neither a directory nor a regular file")
    if not is_archive_name(path) and not tarfile.is_tarfile(path):
        return [_one_file(path)]
    return [TarSource(path, **options)]


def _one_file(path: str) -> TreeSource:
    """A file that is no archive as a one-sample tree, named by its base name."""
    st = os.stat(path)
    name = os.path.basename(path)
    try:
        check_sample_path(name)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{path}: {exc.message}") from None
    tree = TreeSource.of_files([SourceFile(name, path, st.st_size,
                                           stat.S_IFREG | stat.S_IMODE(st.st_mode),
                                           st.st_mtime_ns)])
    tree.root = path
    return tree


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
