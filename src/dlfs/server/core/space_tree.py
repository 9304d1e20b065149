"""The namespace of one checkpoint space: directories, and paths naming file versions.

`SpaceTree` holds what the catalog's space records say (space_records.py):
every directory (with its mode and mtime) and, per directory, its children
in name order (a `SortedDict`: name -> `FileVersion`, or None for a
subdirectory), so listings page in order.  Pure and in memory: the space
machine (server/write/space_machine.py) checks a change here, makes it
durable, then applies it; replay applies the records the same way.  Not
thread-safe: its owner's lock guards it.

Costs: lookups O(depth), listing pages O(log children + page), rename of a
directory O(entries under it).
"""

from __future__ import annotations

import stat as stat_module
from typing import Iterator

from sortedcontainers import SortedDict

from dlfs.errors import (AlreadyExists, DirectoryNotEmpty, InvalidArgument, IsADirectory,
                         NotADirectory, NotFound)
from dlfs.paths import check_sample_path
from dlfs.server.core.space_records import FileVersion

DIR_MODE_DEFAULT = stat_module.S_IFDIR | 0o755


def parent_of(path: str) -> tuple[str, str]:
    """(parent directory path, last component) of a non-root path."""
    parent, _, name = path.rpartition("/")
    return parent, name


class SpaceTree:
    """One space's directories and files.  `name` is the space's, `space_id` its id."""

    def __init__(self, space_id: int, name: str, created_ns: int):
        self.space_id = space_id
        self.name = name
        self.created_ns = created_ns
        # Directory path -> (mode, mtime ns); "" is the space's root.
        self.dir_meta: dict[str, tuple[int, int]] = {"": (DIR_MODE_DEFAULT, created_ns)}
        self.children: dict[str, SortedDict] = {"": SortedDict()}
        self.bytes = 0
        self.files = 0

    # --- lookups ------------------------------------------------------------------

    def file(self, path: str) -> FileVersion | None:
        """The version `path` names, or None (no such path, or a directory)."""
        parent, name = parent_of(path)
        children = self.children.get(parent)
        return None if children is None else children.get(name)

    def is_dir(self, path: str) -> bool:
        return path in self.children

    def exists(self, path: str) -> bool:
        return self.is_dir(path) or self.file(path) is not None

    def check_parent(self, path: str) -> str:
        """The parent directory of `path`, which must exist.  Raises InvalidArgument
        (a bad path), NotFound, NotADirectory."""
        check_sample_path(path)
        parent, _ = parent_of(path)
        if parent in self.children:
            return parent
        # Name the first component that is missing or a file.
        at = ""
        for part in parent.split("/"):
            at = f"{at}/{part}" if at else part
            if self.file(at) is not None:
                raise NotADirectory(f"{self.describe(at)} is a file, not a directory")
            if at not in self.children:
                raise NotFound(f"no directory {self.describe(at)}")
        raise AssertionError("unreachable")

    def describe(self, path: str) -> str:
        return f"'{self.name}/{path}'" if path else f"space '{self.name}'"

    def listdir(self, path: str, start_after: str = "", limit: int = 1000
                ) -> tuple[list[tuple[str, FileVersion | None]], bool]:
        """Up to `limit` children of directory `path` after name `start_after`, in name
        order (a child's value: its FileVersion, or None for a directory), and
        whether more follow.  Raises NotFound, NotADirectory."""
        children = self.children.get(path)
        if children is None:
            if self.file(path) is not None:
                raise NotADirectory(f"{self.describe(path)} is a file, not a directory")
            raise NotFound(f"no directory {self.describe(path)}")
        start = children.bisect_right(start_after) if start_after else 0
        keys = children.keys()[start:start + limit + 1]
        page = [(name, children[name]) for name in keys[:limit]]
        return page, len(keys) > limit

    def versions(self) -> Iterator[tuple[str, FileVersion]]:
        """Every (path, version), in no particular order."""
        for directory, children in self.children.items():
            for name, version in children.items():
                if version is not None:
                    yield (f"{directory}/{name}" if directory else name), version

    # --- changes: checked by `check_*` before they are made durable, applied after (each
    # apply checks again: replay applies records with no check before) ---------------

    def check_mkdir(self, path: str) -> None:
        """Raise what `mkdir(path)` would: InvalidArgument, NotFound, NotADirectory,
        AlreadyExists."""
        self.check_parent(path)
        if self.exists(path):
            raise AlreadyExists(f"{self.describe(path)} exists already")

    def mkdir(self, path: str, mode: int, mtime_ns: int) -> None:
        self.check_mkdir(path)
        parent, name = parent_of(path)
        self.children[parent][name] = None
        self.children[path] = SortedDict()
        self.dir_meta[path] = (stat_module.S_IFDIR | (mode & 0o7777), mtime_ns)
        self._touch(parent, mtime_ns)

    def check_link(self, path: str) -> FileVersion | None:
        """Raise what `link(path, ...)` would (InvalidArgument, NotFound, NotADirectory,
        IsADirectory); return the version `path` names now (None: none)."""
        self.check_parent(path)
        if self.is_dir(path):
            raise IsADirectory(f"{self.describe(path)} is a directory")
        return self.file(path)

    def link(self, path: str, version: FileVersion) -> FileVersion | None:
        """Let `path` name `version`; return the version it named before (now dead)."""
        previous = self.check_link(path)
        parent, name = parent_of(path)
        self.children[parent][name] = version
        self._count(previous, -1)
        self._count(version, +1)
        self._touch(parent, version.mtime_ns)
        return previous

    def check_remove(self, path: str, is_dir: bool) -> None:
        """Raise what `remove(path, is_dir)` would: InvalidArgument (the root),
        NotFound, NotADirectory, IsADirectory, DirectoryNotEmpty."""
        check_sample_path(path)
        if is_dir:
            if path not in self.children:
                if self.file(path) is not None:
                    raise NotADirectory(f"{self.describe(path)} is a file, not a directory")
                raise NotFound(f"no directory {self.describe(path)}")
            if self.children[path]:
                raise DirectoryNotEmpty(f"directory {self.describe(path)} is not empty")
        elif self.file(path) is None:
            if self.is_dir(path):
                raise IsADirectory(f"{self.describe(path)} is a directory (remove it as one)")
            raise NotFound(f"no file {self.describe(path)}")

    def remove(self, path: str, is_dir: bool, mtime_ns: int) -> FileVersion | None:
        """Remove file or empty directory `path`; return the file's version (dead now)."""
        self.check_remove(path, is_dir)
        parent, name = parent_of(path)
        removed = self.children[parent].pop(name)
        if is_dir:
            del self.children[path], self.dir_meta[path]
        self._count(removed, -1)
        self._touch(parent, mtime_ns)
        return removed

    def check_rename(self, source: str, target: str) -> None:
        """Raise what `rename(source, target)` would: InvalidArgument (a directory into
        itself), NotFound, NotADirectory, IsADirectory, DirectoryNotEmpty."""
        check_sample_path(source)
        self.check_parent(target)
        if not self.exists(source):
            raise NotFound(f"no file or directory {self.describe(source)}")
        if source == target:
            return
        if self.is_dir(source):
            if target.startswith(source + "/"):
                raise InvalidArgument(f"cannot move directory {self.describe(source)} into "
                                      "itself")
            if self.file(target) is not None:
                raise NotADirectory(f"{self.describe(target)} is a file; a directory cannot "
                                    "replace it")
            if self.is_dir(target) and self.children[target]:
                raise DirectoryNotEmpty(f"directory {self.describe(target)} is not empty")
        elif self.is_dir(target):
            raise IsADirectory(f"{self.describe(target)} is a directory; a file cannot "
                               "replace it")

    def rename(self, source: str, target: str, mtime_ns: int) -> FileVersion | None:
        """Move `source` to `target`, replacing a file or an empty directory there;
        return the file version replaced (dead now)."""
        self.check_rename(source, target)
        if source == target:
            return None
        (sparent, sname), (tparent, tname) = parent_of(source), parent_of(target)
        replaced = self.children[tparent].pop(tname, None)
        if self.is_dir(target):
            del self.children[target], self.dir_meta[target]
        moved = self.children[sparent].pop(sname)
        self.children[tparent][tname] = moved
        if moved is None:  # a directory: every path under it moves
            prefix = source + "/"
            for old in [p for p in self.children if p == source or p.startswith(prefix)]:
                new = target + old[len(source):]
                self.children[new] = self.children.pop(old)
                self.dir_meta[new] = self.dir_meta.pop(old)
        self._count(replaced, -1)
        self._touch(sparent, mtime_ns)
        self._touch(tparent, mtime_ns)
        return replaced

    def _count(self, version: FileVersion | None, sign: int) -> None:
        if version is not None:
            self.files += sign
            self.bytes += sign * version.length

    def _touch(self, directory: str, mtime_ns: int) -> None:
        mode, _ = self.dir_meta[directory]
        self.dir_meta[directory] = (mode, mtime_ns)

    def check_invariants(self) -> None:
        """Assert the tree's maps agree.  O(entries); for tests."""
        assert set(self.children) == set(self.dir_meta)
        files = total = 0
        for directory, children in self.children.items():
            if directory:
                parent, name = parent_of(directory)
                assert parent in self.children and self.children[parent].get(name, 1) is None
            for name, version in children.items():
                path = f"{directory}/{name}" if directory else name
                if version is None:
                    assert path in self.children, path
                else:
                    assert path not in self.children, path
                    files += 1
                    total += version.length
        assert (files, total) == (self.files, self.bytes)
