"""Names to nodes: the children of a directory, a node's parent, dataset directories.

`Names` answers the lookups the inode table cannot: a name under the root
of a mount of every dataset is a dataset or a checkpoint space (one
GetDataset RPC, which also notices a replaced version); a name inside a
dataset is found by listing its small directory once (`siblings`) or else
by one Stat RPC; a name inside a space always by one Stat RPC (spaces
change: space_names.py).  It also lists directories for readdirplus
(`children`, `datasets`).

Every Stat and ListDir names the version of the directory it asks about
(its key's generation): an entry's sample id and size are valid only
within their version, so a directory of a version the daemon replaced
gets StaleGeneration (ESTALE), never the new version's entries under the
old version's nodes, whose reads name the old version.

Runs on the trio loop; blocking backend calls go through `thread` (the
mount's bounded worker threads).
"""

from __future__ import annotations

import errno
from typing import Any, Awaitable, Callable

from dlfs import errors
from dlfs import limits as fuse_limits
from dlfs.fuse import errno_map
from dlfs.fuse.attributes import dataset_attrs, dataset_key, entry_attrs, read_generation
from dlfs.fuse.backend import Backend
from dlfs.fuse.dirlist import Child
from dlfs.fuse.errno_map import FuseError
from dlfs.fuse.inodes import ROOT_KEY, InodeTable, Key, Node
from dlfs.fuse.siblings import SiblingNames
from dlfs.fuse.space_names import SpaceNames, child_path, space_root_attrs
from dlfs.paths import check_dataset_name, check_sample_path
from dlfs.types import DatasetInfo

# thread(function, *args): run a blocking call in a bounded worker thread.
Thread = Callable[..., Awaitable[Any]]


class Names:
    """Resolves names against the daemon for `table` (a mount of every dataset
    when `multi`, else of one).  Memory: one key per dataset name seen, and
    what `SiblingNames` keeps."""

    def __init__(self, backend: Backend, table: InodeTable, thread: Thread, *, multi: bool):
        self._backend = backend
        self._table = table
        self._thread = thread
        self._multi = multi
        self._datasets: dict[str, Key] = {}  # name -> key of its latest generation seen
        self.spaces = SpaceNames(table)
        self.siblings = SiblingNames(table, self.children,
                                     page_entries=fuse_limits.mount_dir_page_entries,
                                     dirs_max=fuse_limits.mount_listed_dirs_max)

    @staticmethod
    def decode(name: bytes) -> str:
        """A name the kernel sent, as text; ENOENT if it is not UTF-8."""
        try:
            return name.decode("utf-8")
        except UnicodeDecodeError:  # DLFS paths are UTF-8: such a name cannot exist
            raise FuseError(errno.ENOENT) from None

    async def child(self, parent: Node, name: str) -> Node | None:
        """The node of `name` in directory `parent`; None if it does not exist
        (inside a dataset, where absence is permanent).  Raises FuseError and
        the backend's DlfsError."""
        if not parent.is_dir:
            raise FuseError(errno.ENOTDIR)
        if self._multi and parent is self._table.root:
            return await self._dataset(name)
        if parent.space:
            return await self._space_child(parent, name)
        key = parent.child_key(name)
        node = self._table.find(key)
        if node is not None:
            return node
        try:
            check_sample_path(key[2])
        except errors.InvalidArgument:
            if len(name.encode()) > 255 or len(key[2].encode()) > 4096:
                raise FuseError(errno.ENAMETOOLONG) from None
            return None
        await self.siblings.learn(parent)  # one ListDir may answer this and its siblings
        node = self._table.find(key)
        if node is not None:
            return node
        try:
            entry = await self._thread(self._backend.stat, parent.dataset, key[2],
                                       read_generation(parent))
        except errors.NotFound:
            return None
        return self._table.node_for(key, lambda: entry_attrs(entry))

    async def _dataset(self, name: str) -> Node:
        """The directory of dataset `name` under the root of a mount of every dataset."""
        try:
            check_dataset_name(name)
        except errors.InvalidArgument:
            raise FuseError(errno.ENOENT) from None
        try:
            info = await self._thread(self._backend.dataset, name)  # new or replaced?
        except errno_map.DAEMON_DOWN:
            # Revalidating a dataset while the daemon is away: keep serving
            # what the kernel has cached rather than failing every path.
            node = self._table.find(self._datasets.get(name, ROOT_KEY))
            if node is None or node is self._table.root:
                raise
            return node
        self._datasets[name] = dataset_key(info)
        return self.top(info)

    def top(self, info: DatasetInfo) -> Node:
        """The node of dataset or space `info` under the root of a mount of every dataset."""
        return self._table.node_for(dataset_key(info), lambda: _top_attrs(info))

    async def _space_child(self, parent: Node, name: str) -> Node | None:
        """`name` in a space's directory, as the daemon has it now (one Stat)."""
        path = child_path(parent, name)
        try:
            entry = await self._thread(self._backend.stat, parent.space, path, 0)
        except (errors.NotFound, errors.NotADirectory):
            return None
        return self.spaces.node(parent, entry)

    async def parent(self, node: Node) -> Node:
        """The directory holding `node` (the root for the root)."""
        root = self._table.root
        if node is root:
            return node
        dataset, generation, path = node.key
        if not path:  # a dataset root below the mount root
            return root
        parent_key = (dataset, generation, path.rpartition("/")[0])
        if parent_key == root.key:
            return root
        parent = self._table.find(parent_key)
        if parent is None:
            entry = await self._thread(self._backend.stat, dataset, parent_key[2],
                                       read_generation(node))
            parent = self._table.node_for(parent_key, lambda: entry_attrs(entry))
        return parent

    async def children(self, parent: Node, start_after: str, count: int
                       ) -> tuple[list[Child], bool]:
        """One listing page of directory `parent` (ListDir): children, more follow."""
        entries, more = await self._thread(self._backend.list_page, parent.dataset,
                                           parent.path, start_after, count,
                                           read_generation(parent))
        if parent.space:
            return [self.spaces.child(parent, e) for e in entries], more
        return [Child(e.name, parent.child_key(e.name), entry_attrs(e)) for e in entries], more

    async def datasets(self, start_after: str, count: int) -> tuple[list[Child], bool]:
        """One listing page of the root of a mount of every dataset."""
        infos = [i for i in await self._thread(self._backend.sealed_datasets)
                 if i.name > start_after]
        return ([Child(i.name, dataset_key(i), _top_attrs(i)) for i in infos[:count]],
                len(infos) > count)


def _top_attrs(info: DatasetInfo):
    return space_root_attrs(info) if info.kind == "space" else dataset_attrs(info)
