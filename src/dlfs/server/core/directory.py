"""The in-memory sample directory.

`DatasetIndex` is one sealed dataset: a tree with one `DirNode` per
directory (children in a `SortedDict`, name -> child node or FILE, with the
sample ids in a parallel array) plus
numpy arrays indexed by sample id (extent, offset, length, crc32c, mode,
mtime).  Sample ids are the positions of the paths in sorted order, so a
batch of ids resolves to locations with one fancy index per array.

A sealed dataset never changes, so readers need no locks; `SampleDirectory`
(sealed_datasets.py) maps names to datasets and swaps whole datasets in
and out under a lock.

Memory per sample: 36 bytes of arrays, 4 of `file_ids`, 12 of the
id -> (parent, name) maps, plus the name string and its SortedDict slot (no
Python int per sample; see DirNode).  `python -m bench.memory` measures it.
"""

from __future__ import annotations

import array
import dataclasses
import stat as stat_module
from typing import Iterable, Sequence

import numpy as np
from sortedcontainers import SortedDict

from dlfs import limits
from dlfs.errors import FailedPrecondition, InvalidArgument, NotFound
from dlfs.formats.disk_layout import NO_EXTENT
from dlfs.paths import check_sample_path, normalize_dir_path
from dlfs.server.core.block_index import BlockIndex
from dlfs.server.core.catalog_records import SampleBlock
from dlfs.types import DatasetInfo, Entry

DIR_MODE = stat_module.S_IFDIR | 0o555


@dataclasses.dataclass(frozen=True)
class Cluster:
    """How a striped dataset is spread: member daemons (placement order),
    copies per sample, and this daemon's index among the members."""

    members: tuple
    replicas: int
    member_index: int
    # The version id the striped ingest named, the same on every member; 0 in
    # catalogs written before generations (the dataset id stands in then).
    generation: int = 0


class _FileMarker:
    """The value of a sample in its directory's children (its id is in `file_ids`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "FILE"


FILE = _FileMarker()
NO_ID = np.uint32(0xFFFFFFFF)  # file_ids entry of a subdirectory


class DirNode:
    """One directory.

    `children` maps each name to a DirNode or to FILE; `file_ids[i]` is the
    sample id of the i-th child in name order (NO_ID for a directory).  A
    file's id is not kept as a Python int: 28 bytes per sample saved, at the
    price of one bisect (`children.index`) per lookup.
    """

    __slots__ = ("path", "index", "children", "file_ids")

    def __init__(self, path: str, index: int):
        self.path = path
        self.index = index
        self.children: SortedDict | dict = {}
        self.file_ids = array.array("Q")  # while building: ids of files in arrival order

    def sample_id(self, name: str) -> int:
        """Id of the file child `name`.  O(log children)."""
        return int(self.file_ids[self.children.index(name)])


def generation_of(cluster: "Cluster | None", dataset_id: int) -> int:
    """The version number of a dataset with this `cluster` (None: one daemon's) and
    id: the striped ingest's generation, or the dataset id (see DatasetIndex.generation)."""
    return cluster.generation if cluster is not None else dataset_id


class DatasetIndex:
    """A sealed dataset's directory tree and per-id arrays.  Immutable.

    Built from the samples in any order, and `dirs`: directories that hold
    no sample (empty ones of the ingest source), so the tree is exactly the
    one ingested.  Raises InvalidArgument for a duplicate path or a path
    that is both a file and a directory.  Build cost: O(n log n) for the
    sort, O(n) for the tree.
    """

    def __init__(self, name: str, dataset_id: int, created_ns: int, block: SampleBlock,
                 cluster: Cluster | None = None, dirs: Sequence[str] = ()):
        self.name = name
        self.dataset_id = dataset_id
        self.created_ns = created_ns
        self.cluster = cluster  # striped datasets: the member daemons, else None
        n = len(block)
        if n >= NO_ID:
            raise InvalidArgument(f"dataset {name!r} has {n} samples; at most {int(NO_ID) - 1} fit")
        paths = block.paths
        order = sorted(range(n), key=paths.__getitem__)
        perm = np.asarray(order, dtype=np.int64)
        self.extent = block.extent[perm]
        self.offset = block.offset[perm]
        self.length = block.length[perm]
        self.crc = block.crc[perm]
        self.mode = block.mode[perm]
        self.mtime_ns = block.mtime_ns[perm]
        self.holders = block.holders[perm] if block.holders is not None else None
        self.blocks = BlockIndex(block, perm)
        if cluster is not None and self.holders is None and n == 0:
            self.holders = np.empty((0, cluster.replicas), dtype=np.uint16)
        for column in (self.extent, self.offset, self.length, self.crc, self.mode, self.mtime_ns):
            column.flags.writeable = False
        if (self.holders is None) != (cluster is None):
            raise InvalidArgument(f"dataset {name!r}: sample holders and cluster members must "
                                  "come together")
        self.total_bytes = int(self.length.sum())
        self.extents = int(np.unique(self.extent[self.extent != NO_EXTENT]).size)
        self.names: list[str] = [""] * n
        self.parent = np.zeros(n, dtype=np.uint32)
        self.dirs: list[DirNode] = [DirNode("", 0)]
        self.empty_dirs = sorted(set(dirs))
        self._build_tree((paths[i] for i in order), self.empty_dirs)

    def __len__(self) -> int:
        return len(self.names)

    @property
    def root(self) -> DirNode:
        return self.dirs[0]

    @property
    def generation(self) -> int:
        """This sealed version's number, never reused (a replace gets a new one): the
        id a striped ingest named on all its members, else the dataset id.

        0 for a striped dataset ingested before generations existed: its
        members' dataset ids differ, so there is no common number; reads of
        it cannot tell versions apart (ingest it again to get one).
        """
        return generation_of(self.cluster, self.dataset_id)

    def summary(self) -> DatasetInfo:
        cluster = self.cluster
        return DatasetInfo(self.name, len(self), self.total_bytes, True, self.created_ns,
                           self.extents, tuple(cluster.members) if cluster else (),
                           cluster.replicas if cluster else 0,
                           cluster.member_index if cluster else 0, self.generation)

    def check_local(self, ids: np.ndarray) -> None:
        """Raise FailedPrecondition if any of `ids` is stored on other daemons only."""
        if self.cluster is None or ids.size == 0:
            return
        remote = self.extent[ids] == NO_EXTENT
        if remote.any():
            sample_id = int(ids[np.argmax(remote)])
            holders = ", ".join(self.cluster.members[h] for h in self.holders[sample_id])
            raise FailedPrecondition(
                f"sample {sample_id} of dataset {self.name!r} is stored on {holders}, not on "
                "this daemon; a client given every member address routes reads itself")

    # --- building ---------------------------------------------------------------

    def _build_tree(self, sorted_paths: Iterable[str], empty_dirs: Sequence[str]) -> None:
        dirs_by_path = {"": self.root}
        last_dir_path, node = "", self.root
        for sample_id, path in enumerate(sorted_paths):
            dir_path, _, name = path.rpartition("/")
            if dir_path != last_dir_path:
                node = dirs_by_path.get(dir_path) or self._make_dirs(dir_path, dirs_by_path)
                last_dir_path = dir_path
            if name in node.children:
                kind = "twice" if node.children[name] is FILE else "as a file and a directory"
                raise InvalidArgument(f"dataset {self.name!r}: path {path!r} occurs {kind}")
            node.children[name] = FILE
            node.file_ids.append(sample_id)
            self.parent[sample_id] = node.index
            self.names[sample_id] = name
        for dir_path in empty_dirs:
            check_sample_path(dir_path)
            if dir_path not in dirs_by_path:
                self._make_dirs(dir_path, dirs_by_path)
        for directory in self.dirs:
            children = SortedDict(directory.children)
            # Within one directory, name order is id order (the paths share
            # their prefix), so the ids fill the FILE slots in sequence.
            is_file = np.fromiter((v is FILE for v in children.values()), dtype=bool,
                                  count=len(children))
            file_ids = np.full(len(children), NO_ID, dtype=np.uint32)
            file_ids[is_file] = np.frombuffer(directory.file_ids, dtype=np.uint64)
            file_ids.flags.writeable = False
            directory.children, directory.file_ids = children, file_ids

    def _make_dirs(self, dir_path: str, dirs_by_path: dict[str, DirNode]) -> DirNode:
        parent_path, _, name = dir_path.rpartition("/")
        parent = dirs_by_path.get(parent_path) or self._make_dirs(parent_path, dirs_by_path)
        if name in parent.children:
            raise InvalidArgument(
                f"dataset {self.name!r}: path {dir_path!r} occurs as a file and a directory"
            )
        node = DirNode(dir_path, len(self.dirs))
        self.dirs.append(node)
        parent.children[name] = node
        dirs_by_path[dir_path] = node
        return node

    # --- lookups ----------------------------------------------------------------

    def path(self, sample_id: int) -> str:
        """Path of sample `sample_id`.  O(1).  Raises InvalidArgument when out of range."""
        self._check_id(sample_id)
        parent = self.dirs[self.parent[sample_id]].path
        name = self.names[sample_id]
        return f"{parent}/{name}" if parent else name

    def describe(self, sample_id: int) -> str:
        """The sample named for error messages: sample ID 'PATH' of dataset 'NAME'.  O(1)."""
        return f"sample {sample_id} {self.path(sample_id)!r} of dataset {self.name!r}"

    def describe_extent(self, extent_no: int) -> str:
        """An extent named for error messages.  O(1)."""
        return f"extent {extent_no} of dataset {self.name!r}"

    def block_crcs(self, sample_id: int) -> np.ndarray | None:
        """CRC32C of each block of sample `sample_id` (dlfs.formats.block_crcs), or None when
        its blocks have none (ingested before block CRCs).  O(log n)."""
        return self.blocks.crcs(sample_id, int(self.length[sample_id]),
                                int(self.crc[sample_id]))

    def size_and_crc(self, sample_id: int) -> tuple[int, int]:
        """(bytes, CRC32C) of sample `sample_id` as stored.  O(1).  Raises InvalidArgument."""
        self._check_id(sample_id)
        return int(self.length[sample_id]), int(self.crc[sample_id])

    def id_of(self, path: str) -> int:
        """Sample id of `path`.  O(depth) dict lookups.  Raises NotFound, InvalidArgument."""
        check_sample_path(path)
        dir_path, _, name = path.rpartition("/")
        node = self._find_dir(dir_path, path) if dir_path else self.root
        child = node.children.get(name)
        if child is FILE:
            return node.sample_id(name)
        if child is None:
            raise NotFound(f"dataset {self.name!r} has no sample {path!r}")
        raise InvalidArgument(f"dataset {self.name!r}: {path!r} is a directory, not a sample")

    def ids_of(self, paths: Sequence[str]) -> np.ndarray:
        """Sample ids of `paths`, in order.  O(len(paths) * depth)."""
        return np.fromiter((self.id_of(p) for p in paths), dtype=np.int64, count=len(paths))

    def check_ids(self, ids) -> np.ndarray:
        """Validate `ids` (any integer sequence) and return them as int64.

        Vectorized: O(len(ids)).  Raises InvalidArgument naming the first id
        outside 0..N-1.
        """
        values = np.asarray(ids)
        if values.size == 0:
            return np.empty(0, dtype=np.int64)
        if values.ndim != 1 or values.dtype.kind not in "iu":
            raise InvalidArgument("sample ids must be a flat sequence of integers")
        if values.dtype.kind == "u" and values.dtype.itemsize == 8:
            bad = values >= len(self)
        else:
            values = values.astype(np.int64, copy=False)
            bad = (values < 0) | (values >= len(self))
        if bad.any():
            first = int(np.asarray(ids)[np.argmax(bad)])
            raise InvalidArgument(self._range_message(first))
        return values.astype(np.int64, copy=False)

    def _check_id(self, sample_id: int) -> None:
        if not 0 <= sample_id < len(self):
            raise InvalidArgument(self._range_message(sample_id))

    def _range_message(self, sample_id: int) -> str:
        if len(self) == 0:
            return f"sample id {sample_id} is out of range: dataset {self.name!r} is empty"
        return (
            f"sample id {sample_id} is out of range for dataset {self.name!r}: "
            f"valid ids are 0..{len(self) - 1}"
        )

    def _find_dir(self, dir_path: str, asked: str) -> DirNode:
        node = self.root
        for component in dir_path.split("/"):
            child = node.children.get(component)
            if isinstance(child, DirNode):
                node = child
            elif child is None:
                raise NotFound(f"dataset {self.name!r} has no path {asked!r}")
            else:
                raise NotFound(
                    f"dataset {self.name!r} has no path {asked!r}: "
                    f"{child_path(node.path, component)!r} is a file"
                )
        return node

    # --- metadata ----------------------------------------------------------------

    def stat(self, path: str) -> Entry:
        """Entry of a file or directory ("" is the root).  O(depth)."""
        path = normalize_dir_path(path)
        if path == "":
            return self._dir_entry(self.root, "")
        dir_path, _, name = path.rpartition("/")
        node = self._find_dir(dir_path, path) if dir_path else self.root
        child = node.children.get(name)
        if child is None:
            raise NotFound(f"dataset {self.name!r} has no path {path!r}")
        if child is FILE:
            return self._file_entry(node.sample_id(name), name)
        return self._dir_entry(child, name)

    def listdir(self, path: str, start_after: str = "", limit: int = limits.list_page_entries_default
                ) -> tuple[list[Entry], bool]:
        """One page of a directory's entries in name order, after `start_after`.

        Returns (entries, more).  O(log n + limit) for a directory of n entries.
        Raises NotFound, InvalidArgument (not a directory, limit out of range).
        """
        if not 1 <= limit <= limits.list_page_entries_max:
            raise InvalidArgument(
                f"page size {limit} is out of range 1..{limits.list_page_entries_max}"
            )
        node = self.dir_node(path)
        children = node.children
        first = children.bisect_right(start_after) if start_after else 0
        names = list(children.islice(first, first + limit + 1))
        more = len(names) > limit
        entries = []
        for position, name in enumerate(names[:limit], start=first):
            child = children[name]
            entries.append(self._dir_entry(child, name) if child is not FILE
                           else self._file_entry(int(node.file_ids[position]), name))
        return entries, more

    def dir_node(self, path: str) -> DirNode:
        """The directory at `path` ("" is the root).  O(depth).

        Raises NotFound, or InvalidArgument when `path` is a sample.
        """
        path = normalize_dir_path(path)
        if not path:
            return self.root
        parent_path, _, name = path.rpartition("/")
        parent = self._find_dir(parent_path, path) if parent_path else self.root
        child = parent.children.get(name)
        if isinstance(child, DirNode):
            return child
        if child is None:
            raise NotFound(f"dataset {self.name!r} has no directory {path!r}")
        raise InvalidArgument(f"dataset {self.name!r}: {path!r} is a sample, not a directory")

    def _file_entry(self, i: int, name: str) -> Entry:
        return Entry(name, self.path(i), False, int(self.length[i]), int(self.mode[i]),
                         int(self.mtime_ns[i]), i, int(self.crc[i]), 0)

    def _dir_entry(self, node: DirNode, name: str) -> Entry:
        return Entry(name, node.path, True, 0, DIR_MODE, self.created_ns, -1, 0,
                         len(node.children))

    # --- invariants ---------------------------------------------------------------

    def check_invariants(self) -> None:
        """Assert the structure is consistent.  O(n); for tests."""
        n = len(self)
        for column in (self.extent, self.offset, self.length, self.crc, self.mode, self.mtime_ns,
                       self.parent):
            assert column.shape == (n,)
        paths = [self.path(i) for i in range(n)]
        assert paths == sorted(paths), "ids are not in sorted path order"
        assert len(set(paths)) == n
        seen_ids = []
        for index, node in enumerate(self.dirs):
            assert node.index == index
            assert isinstance(node.children, SortedDict)
            assert node.file_ids.shape == (len(node.children),)
            for position, (name, child) in enumerate(node.children.items()):
                assert name and "/" not in name
                sample_id = int(node.file_ids[position])
                if isinstance(child, DirNode):
                    assert child.path == child_path(node.path, name)
                    assert self.dirs[child.index] is child
                    assert sample_id == NO_ID
                else:
                    assert child is FILE
                    assert self.parent[sample_id] == index and self.names[sample_id] == name
                    assert node.sample_id(name) == sample_id
                    seen_ids.append(sample_id)
        assert sorted(seen_ids) == list(range(n)), "tree and id arrays disagree"
        for dir_path in self.empty_dirs:
            assert isinstance(self.dir_node(dir_path), DirNode)
        self.blocks.check_invariants(self.length, self.extent)


def child_path(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name
