"""Checkpoint spaces: every change of them, under one lock, in the durability order.

A space is a tree of directories and files that programs create, write,
rename and remove (a checkpoint folder), beside the sealed datasets and in
the same namespace of names.  Its tree is a `SpaceTree` (core/space_tree.py),
made durable by the catalog's space records (core/space_records.py); each
closed file is a *file version*: an extent directory of its own, published
in the sample directory as the one-sample version "SPACE@VERSION", so every
read path (gRPC, the data path's workers, co-located direct reads, the
mount) serves it as it serves a dataset's sample, and retiring it frees its
extent after its last read (read_leases.py), as for datasets.

What is on disk when each call returns (the durability order):

- `create`, `mkdir`, `remove`, `rename`, `delete`: the record is appended
  and the catalog fsynced before the tree changes; a failure changes
  nothing.  A removed or replaced version's extent goes after its last read.
- `open`: nothing durable (a draft's extent directory exists, which replay
  removes if no FILE record ever names it).
- `OpenDraft.write` / `truncate`: nothing durable (draft.py says where the
  bytes are).
- `OpenDraft.sync` and `close` (a *commit*): the draft's extent is fsynced
  with its directory and the extents root, then the FILE record is
  appended and the catalog fsynced, then the version is published (every
  data path worker has it) and the path names it: it is durable, whole and
  visible to every reader before the call returns.  A file committed once
  and written again continues in a new draft that starts as a copy, so a
  version's bytes never change; readers see the previous version until the
  next commit.  A kill -9 of anything at any moment leaves each path naming
  the version of its last commit, or nothing.

Files being written are visible in listings and `stat` (with the size
written so far) when no version of their path is closed yet; their bytes
are readable only through their own handle (`OpenDraft.read`).  Two
writers of one path each write their own draft; the last commit wins.

Lock order: the space machine's lock, then the catalog's and the sample
directory's own locks; the ingest machine's lock only through
`IngestMachine.reserve_name`, never under this one.  Nothing here imports
grpc.
"""

from __future__ import annotations

import dataclasses
import logging
import stat as stat_module
import threading
import time

import numpy as np

from dlfs import limits
from dlfs.errors import (AlreadyExists, Busy, DirectoryNotEmpty, InvalidArgument, NotFound,
                         Overloaded, ReadOnly)
from dlfs.formats import block_crcs
from dlfs.formats.disk_layout import HEADER_BYTES
from dlfs.paths import check_dataset_name, check_sample_path, file_version_name, normalize_dir_path
from dlfs.server.core import catalog as cat
from dlfs.server.core import catalog_records as records
from dlfs.server.core import faults
from dlfs.server.core import space_records as srec
from dlfs.server.core.catalog_records import RecordType, SampleBlock
from dlfs.server.core.directory import DatasetIndex
from dlfs.server.core.extents import ExtentStore
from dlfs.server.core.read_leases import ReadLeases
from dlfs.server.core.sealed_datasets import SampleDirectory
from dlfs.server.core.space_records import FileVersion
from dlfs.server.core.space_tree import SpaceTree, parent_of
from dlfs.server.write.draft import DraftFile
from dlfs.types import DatasetInfo, Entry

log = logging.getLogger(__name__)

# open() flags, as the data path's FILE_OPEN carries them (datapath.md, "Writes").
OPEN_CREATE = 1
OPEN_EXCLUSIVE = 2
OPEN_TRUNCATE = 4
FILE_MODE_DEFAULT = 0o644


@dataclasses.dataclass
class SpaceState:
    """A space and the drafts open in it (path -> its open drafts)."""

    tree: SpaceTree
    drafts: dict[str, list["OpenDraft"]] = dataclasses.field(default_factory=dict)


class SpaceMachine:
    """The daemon's checkpoint spaces (see the module).  Thread-safe.

    `spaces` are the trees replay restored; their file versions are
    published into `directory` here.  `ingests` hands out ids and keeps
    names unique across datasets and spaces.
    """

    def __init__(self, catalog: cat.Catalog, extents: ExtentStore, directory: SampleDirectory,
                 leases: ReadLeases, ingests, spaces: dict[int, SpaceTree], *,
                 files_max: int = limits.space_files_max_default,
                 drafts_max: int = limits.space_drafts_max_default):
        self._catalog = catalog
        self._extents = extents
        self._directory = directory
        self._leases = leases
        self._ingests = ingests
        self._files_max = files_max
        self._drafts_max = drafts_max
        self._lock = threading.Lock()
        self._spaces: dict[str, SpaceState] = {}
        self._drafts = 0
        self._files = 0
        for tree in spaces.values():
            self._spaces[tree.name] = SpaceState(tree)
            for path, version in tree.versions():
                self._directory.publish(_version_index(tree, path, version))
                self._files += 1
        ingests.name_gate = self._refuse_space_name

    # --- spaces --------------------------------------------------------------------

    def create(self, name: str) -> DatasetInfo:
        """Create the empty space `name`, durably.  Raises InvalidArgument,
        AlreadyExists (a dataset, an ingest or a space has the name), Unavailable,
        StorageFull, StorageFailed, CatalogFailed."""
        check_dataset_name(name)

        def claim(space_id: int) -> SpaceTree:
            with self._lock:
                if name in self._spaces:
                    raise AlreadyExists(f"checkpoint space {name!r} exists already")
                tree = SpaceTree(space_id, name, time.time_ns())
                self._catalog.append(RecordType.SPACE,
                                     srec.encode_space(tree.space_id, tree.created_ns, name),
                                     sync=True)
                self._spaces[name] = SpaceState(tree)
                return tree

        tree = self._ingests.reserve_name(name, claim)
        log.info("created checkpoint space %r", name)
        return _summary(tree)

    def delete(self, name: str) -> DatasetInfo:
        """Remove space `name` and every file in it, durably; each version's extent goes
        after its last read.  Files being written in it fail at their next commit."""
        with self._lock:
            state = self._state(name)
            self._catalog.append(RecordType.DELETE, records.encode_delete(state.tree.space_id),
                                 sync=True)
            del self._spaces[name]
            versions = [v for _, v in state.tree.versions()]
            for drafts in state.drafts.values():
                for draft in drafts:
                    draft.detach(f"checkpoint space {name!r} was removed")
            for version in versions:
                self._directory.remove(file_version_name(name, version.version_id))
            self._files -= len(versions)
        for version in versions:
            self._leases.retire(version.version_id)
        log.info("removed checkpoint space %r (%d files)", name, len(versions))
        return _summary(state.tree)

    def has(self, name: str) -> bool:
        return name in self._spaces

    def summaries(self) -> list[DatasetInfo]:
        with self._lock:
            return [_summary(s.tree) for _, s in sorted(self._spaces.items())]

    def summary(self, name: str) -> DatasetInfo:
        with self._lock:
            return _summary(self._state(name).tree)

    def stored(self) -> tuple[int, int]:
        """(files, bytes) of every space."""
        with self._lock:
            return (sum(s.tree.files for s in self._spaces.values()),
                    sum(s.tree.bytes for s in self._spaces.values()))

    # --- the tree ----------------------------------------------------------------------

    def stat(self, name: str, path: str) -> Entry:
        """The file or directory `path` of space `name` (a file being written, with the
        bytes written so far, while its path has no closed version)."""
        path = normalize_dir_path(path)
        with self._lock:
            state = self._state(name)
            tree = state.tree
            if tree.is_dir(path):
                return _dir_entry(tree, path, len(tree.children[path]) +
                                  sum(1 for p in _draft_names(state, path)))
            version = tree.file(path)
            if version is not None:
                return _file_entry(path, version)
            drafts = state.drafts.get(path)
            if drafts:
                return drafts[-1].entry()
            tree.check_parent(path)
            raise NotFound(f"no file or directory {tree.describe(path)}")

    def listdir(self, name: str, path: str, start_after: str = "",
                limit: int = limits.space_list_page_entries_max) -> tuple[list[Entry], bool]:
        """A page of directory `path`'s entries in name order, and whether more follow.
        Raises NotFound, NotADirectory, InvalidArgument."""
        path = normalize_dir_path(path)
        limit = max(1, min(limit, limits.space_list_page_entries_max))
        with self._lock:
            state = self._state(name)
            tree = state.tree
            page, more = tree.listdir(path, start_after, limit)
            entries = []
            for child, version in page:
                child_path = f"{path}/{child}" if path else child
                if version is None:
                    entries.append(_dir_entry(tree, child_path, len(tree.children[child_path])))
                else:
                    entries.append(_file_entry(child_path, version))
            # Files being written that have no closed version yet, merged in order.
            drafts = sorted(n for n in _draft_names(state, path) if n > start_after)
            if drafts:
                last = page[-1][0] if more else None
                extra = [state.drafts[f"{path}/{n}" if path else n][-1].entry()
                         for n in drafts if last is None or n < last]
                entries = sorted(entries + extra, key=lambda e: e.name)
                if len(entries) > limit:
                    entries, more = entries[:limit], True
            return entries, more

    def mkdir(self, name: str, path: str, mode: int = 0o755) -> Entry:
        """Create directory `path` durably.  Raises AlreadyExists, NotFound (its parent),
        NotADirectory, InvalidArgument, and the catalog's errors."""
        check_sample_path(path)
        with self._lock:
            state = self._state(name)
            tree = state.tree
            tree.check_mkdir(path)
            if path in state.drafts:
                raise AlreadyExists(f"{tree.describe(path)} is a file being written")
            now = time.time_ns()
            self._catalog.append(RecordType.MKDIR,
                                 srec.encode_mkdir(tree.space_id, path, mode, now), sync=True)
            tree.mkdir(path, mode, now)
            return _dir_entry(tree, path, 0)

    def remove(self, name: str, path: str, is_dir: bool) -> None:
        """Remove file `path` (unlink: a file being written there is dropped at its
        close) or empty directory `path` (rmdir) durably."""
        check_sample_path(path)
        with self._lock:
            state = self._state(name)
            tree = state.tree
            drafts = state.drafts.get(path, [])
            if is_dir and any(True for _ in _draft_names(state, path)):
                raise DirectoryNotEmpty(f"directory {tree.describe(path)} holds files being "
                                        "written")
            if not is_dir and drafts and tree.file(path) is None:
                tree.check_parent(path)
                for draft in drafts:  # never closed: nothing durable to remove
                    draft.detach(f"{tree.describe(path)} was removed while being written")
                return
            tree.check_remove(path, is_dir)
            now = time.time_ns()
            self._catalog.append(RecordType.REMOVE,
                                 srec.encode_remove(tree.space_id, path, is_dir, now), sync=True)
            removed = tree.remove(path, is_dir, now)
            for draft in drafts:
                draft.detach(f"{tree.describe(path)} was removed while being written")
            self._unpublish(tree, removed)
        self._retire(removed)

    def rename(self, name: str, source: str, target: str) -> None:
        """Move `source` to `target` atomically and durably, replacing a file (or an
        empty directory) there.  Raises Busy when `source` is (or holds) a file
        being written, and what SpaceTree.check_rename raises."""
        check_sample_path(source)
        check_sample_path(target)
        with self._lock:
            state = self._state(name)
            tree = state.tree
            if source in state.drafts or any(p.startswith(source + "/") for p in state.drafts):
                raise Busy(f"{tree.describe(source)} is being written; rename it once it is "
                           "closed")
            tree.check_rename(source, target)
            if tree.is_dir(target) and any(True for _ in _draft_names(state, target)):
                raise DirectoryNotEmpty(f"directory {tree.describe(target)} holds files being "
                                        "written")
            now = time.time_ns()
            self._catalog.append(RecordType.RENAME,
                                 srec.encode_rename(tree.space_id, source, target, now),
                                 sync=True)
            replaced = tree.rename(source, target, now)
            self._unpublish(tree, replaced)
        self._retire(replaced)

    # --- files being written -----------------------------------------------------------

    def open(self, name: str, path: str, flags: int, mode: int = FILE_MODE_DEFAULT
             ) -> "OpenDraft":
        """Open file `path` of space `name` for writing: a new draft, empty with
        OPEN_TRUNCATE or when the path has no closed version, else starting as a
        copy of it.  Raises NotFound (no such file without OPEN_CREATE, or its
        directory), AlreadyExists (OPEN_EXCLUSIVE and it exists), IsADirectory,
        Overloaded (too many files or drafts), the disk's errors."""
        check_sample_path(path)
        with self._lock:
            state = self._state(name)
            tree = state.tree
            current = tree.check_link(path)
            exists = current is not None or bool(state.drafts.get(path))
            if flags & OPEN_EXCLUSIVE and flags & OPEN_CREATE and exists:
                raise AlreadyExists(f"{tree.describe(path)} exists already")
            if not exists and not flags & OPEN_CREATE:
                raise NotFound(f"no file {tree.describe(path)}")
            if self._drafts >= self._drafts_max:
                raise Overloaded(f"{self._drafts} files are being written, the daemon's limit "
                                 "(--space-drafts-max); close some first")
            if current is None and self._files + self._drafts >= self._files_max:
                raise Overloaded(f"the checkpoint spaces hold {self._files} files, the "
                                 "daemon's limit (--space-files-max); remove old checkpoints")
            base = None if flags & OPEN_TRUNCATE else current
            draft = OpenDraft(self, state, path, stat_module.S_IFREG | (mode & 0o7777))
            state.drafts.setdefault(path, []).append(draft)
            self._drafts += 1
        try:
            draft.start(base)
        except BaseException:
            self._forget(draft)
            raise
        return draft

    def new_draft(self, label: str) -> DraftFile:
        return DraftFile(self._extents, self._ingests.allocate_id(), time.time_ns(), label)

    def version_path(self, version: FileVersion) -> str:
        return self._extents.extent_path(version.version_id, 0)

    def commit(self, draft: "OpenDraft", length: int, crc: int, blocks: list[int]
               ) -> FileVersion:
        """Record and publish the committed bytes of `draft` (see the module: its
        extent is durable already).  Raises NotFound (its space, directory or path was
        removed meanwhile), IsADirectory, and the catalog's errors."""
        file = draft.file
        version = FileVersion(file.version_id, length, crc, draft.mode, time.time_ns(),
                              block_crcs.BLOCK_BYTES, np.asarray(blocks, dtype=np.uint32))
        with self._lock:
            draft.check_attached()
            tree = draft.state.tree
            tree.check_link(draft.path)
            index = _version_index(tree, draft.path, version)
        # Outside the lock: the workers' shared copy may take a moment.
        self._directory.prepare(index)
        with self._lock:
            draft.check_attached()
            tree.check_link(draft.path)
            faults.point("seal", draft.path)
            self._catalog.append(RecordType.FILE, srec.encode_file(tree.space_id, draft.path,
                                                                   version), sync=True)
            self._directory.publish(index)
            previous = tree.link(draft.path, version)
            self._files += 1
            self._unpublish(tree, previous)
        self._retire(previous)
        return version

    def _forget(self, draft: "OpenDraft") -> None:
        """A draft's handle is closed: it no longer holds its path."""
        with self._lock:
            drafts = draft.state.drafts.get(draft.path)
            if drafts and draft in drafts:
                drafts.remove(draft)
                if not drafts:
                    del draft.state.drafts[draft.path]
                self._drafts -= 1

    def drafts_open(self) -> int:
        return self._drafts

    # --- inside ---------------------------------------------------------------------------

    def _state(self, name: str) -> SpaceState:
        state = self._spaces.get(name)
        if state is None:
            check_dataset_name(name)
            if self._directory.find(name) is not None:
                raise ReadOnly(f"{name!r} is a dataset, which is read-only (ingest a new "
                               "version to change it); files are written to checkpoint "
                               f"spaces (`dlfs mkspace NAME`)")
            raise NotFound(f"no checkpoint space named {name!r}; `dlfs datasets` lists them, "
                           f"`dlfs mkspace {name}` creates it")
        return state

    def _refuse_space_name(self, name: str) -> None:
        if name in self._spaces:
            raise AlreadyExists(f"{name!r} is a checkpoint space; a dataset needs a name of "
                                "its own")

    def _unpublish(self, tree: SpaceTree, version: FileVersion | None) -> None:
        """Stop serving a dead version (lock held); `_retire` it after the lock."""
        if version is not None:
            self._directory.remove(file_version_name(tree.name, version.version_id))
            self._files -= 1

    def _retire(self, version: FileVersion | None) -> None:
        if version is not None:
            self._leases.retire(version.version_id)


class OpenDraft:
    """A file of a space open for writing: the draft of its next version.

    `write`, `truncate`, `read`, `sync` (a commit) and `close` (a commit, then
    the end) as the module says.  One caller at a time (the data path
    connection that opened it).
    """

    def __init__(self, machine: SpaceMachine, state: SpaceState, path: str, mode: int):
        self.machine = machine
        self.state = state
        self.path = path
        self.mode = mode
        self.file: DraftFile | None = None
        self.mtime_ns = time.time_ns()
        self.dirty = True  # bytes the last commit does not hold (a new file: its entry)
        self._committed: FileVersion | None = None
        self._detached = ""
        self._closed = False

    @property
    def label(self) -> str:
        return self.state.tree.describe(self.path)

    def start(self, base: FileVersion | None) -> None:
        self.file = self.machine.new_draft(self.label)
        if base is not None:
            try:
                self.file.copy_from(self.machine.version_path(base), base.length)
            except BaseException:
                self.file.discard()
                raise
            self.dirty = False
            self._committed = base

    @property
    def size(self) -> int:
        return self.file.size

    @property
    def committed_version(self) -> FileVersion | None:
        """The version its last commit made (or the one it started as a copy of)."""
        return self._committed

    def entry(self) -> Entry:
        name = parent_of(self.path)[1]
        return Entry(name, self.path, False, self.file.size if self.file else 0, self.mode,
                     self.mtime_ns, 0, 0, 0)

    def detach(self, reason: str) -> None:
        """Its path (or space) was removed: its next commit fails with NotFound."""
        self._detached = reason

    def check_attached(self) -> None:
        if self._detached:
            raise NotFound(f"{self.label} cannot be closed into place: {self._detached}")

    def write(self, offset: int, data) -> None:
        self._writable()
        self.file.write(offset, data)
        self.dirty, self.mtime_ns = True, time.time_ns()

    def truncate(self, size: int) -> None:
        self._writable()
        self.file.truncate(size)
        self.dirty, self.mtime_ns = True, time.time_ns()

    def read(self, offset: int, length: int) -> bytes:
        if self.file.committed:
            with open(self.machine.version_path(self._committed), "rb") as f:
                f.seek(HEADER_BYTES + offset)
                return f.read(max(0, min(length, self._committed.length - offset)))
        return self.file.read(offset, length)

    def sync(self) -> FileVersion | None:
        """Commit what was written (see the module); the version it is now.  Raises
        NotFound (removed meanwhile), the disk's and the catalog's errors: the draft
        is dropped then, and the path keeps naming what it named."""
        if not self.dirty:
            return self._committed
        file = self.file
        try:
            self.check_attached()
            length, crc, blocks = file.commit()
            version = self.machine.commit(self, length, crc, blocks)
        except BaseException:
            file.discard()
            self._closed = True
            self.machine._forget(self)
            raise
        self._committed, self.dirty = version, False
        return version

    def close(self, commit: bool = True) -> FileVersion | None:
        """Commit (unless `commit` is False, or it was removed), then let go of the path.
        Idempotent; a close without commit drops what was written since the last."""
        if self._closed:
            return self._committed
        try:
            if commit and not self._detached:
                return self.sync()
            return self._committed
        finally:
            if not self._closed:
                self._closed = True
                if self.file is not None and not self.file.committed:
                    self.file.discard()
                self.machine._forget(self)

    def _writable(self) -> None:
        if self._closed:
            raise InvalidArgument(f"{self.label} was closed")
        if self.file.committed:
            # Written again after a commit: go on in a copy, so the recorded version's
            # bytes never change (its readers keep reading it).
            previous, self.file = self.file, self.machine.new_draft(self.label)
            previous.close()
            try:
                self.file.copy_from(self.machine.version_path(self._committed),
                                    self._committed.length)
            except BaseException:
                self.file.discard()
                self.file = previous
                raise


def _draft_names(state: SpaceState, directory: str):
    """Names in `directory` of files being written that have no closed version."""
    tree = state.tree
    for path in state.drafts:
        parent, name = parent_of(path)
        if parent == directory and tree.file(path) is None:
            yield name


def _version_index(tree: SpaceTree, path: str, version: FileVersion) -> DatasetIndex:
    """The one-sample version that serves `version` to every read path."""
    block = SampleBlock([path], np.array([0], np.uint32), np.array([HEADER_BYTES], np.uint64),
                        np.array([version.length], np.uint64), np.array([version.crc], np.uint32),
                        np.array([version.mode], np.uint32),
                        np.array([version.mtime_ns], np.int64),
                        block_crc=np.asarray(version.block_crc, np.uint32),
                        block_bytes=version.block_bytes)
    return DatasetIndex(file_version_name(tree.name, version.version_id), version.version_id,
                        version.mtime_ns, block)


def _file_entry(path: str, version: FileVersion) -> Entry:
    return Entry(parent_of(path)[1], path, False, version.length, version.mode,
                 version.mtime_ns, 0, version.crc, 0, version.version_id)


def _dir_entry(tree: SpaceTree, path: str, children: int) -> Entry:
    mode, mtime_ns = tree.dir_meta[path]
    return Entry(parent_of(path)[1] if path else "", path, True, 0, mode, mtime_ns, -1, 0,
                 children)


def _summary(tree: SpaceTree) -> DatasetInfo:
    return DatasetInfo(tree.name, tree.files, tree.bytes, True, tree.created_ns, tree.files,
                       generation=tree.space_id, kind="space")
