"""Names in checkpoint spaces: the daemon's entries as nodes, never trusted for long.

A checkpoint space (dlfs.client.spaces) changes while it is mounted, so
nothing of it is answered from memory as a sealed dataset's names are:
every lookup in a space is one Stat RPC, every listing page one ListDir,
and the kernel keeps a space's names and attributes for
`limits.mount_space_cache_timeout_s` only (this mount's own changes it is
told at once: space_files.py).

Keys (the inode table's, inodes.py) say what a node is:

- a directory of space S (id I): ``(S, I, path)``, as a dataset's;
- a closed file: its version V, ``("S@V", V, "")`` (`file_version_name`):
  the one-sample dataset every read path serves, so reads of it are a
  dataset sample's.  A version's bytes never change: the kernel may keep
  its pages, and a path closed again or replaced by a rename names another
  version, a new inode whose pages start empty.  So a reader that opens a
  file after its writer closed it gets the new bytes, and one that holds
  the old version open keeps reading it (or ESTALE once the daemon freed
  it), never a mix;
- a file being written that was never closed: ``(S, -I, path)``.

A file this mount closes keeps its inode, moved to the key of the version
its close made (space_files.py).
"""

from __future__ import annotations

import errno
import stat

from dlfs import errors
from dlfs import limits as fuse_limits
from dlfs.fuse.dirlist import Child
from dlfs.fuse.errno_map import FuseError
from dlfs.fuse.inodes import Attrs, InodeTable, Key, Node
from dlfs.paths import FILE_VERSION_SEP, check_sample_path, file_version_name
from dlfs.types import DatasetInfo, Entry

SPACE_DIR_MODE = stat.S_IFDIR | 0o755


def space_root_attrs(info: DatasetInfo) -> Attrs:
    """A space's directory at the mount root (writable by the mount's owner)."""
    return Attrs(True, 0, SPACE_DIR_MODE, info.created_ns, space=info.name)


def space_id(directory: Node) -> int:
    """The id of the space a directory node of a space belongs to."""
    assert directory.space and directory.is_dir, directory
    return directory.key[1]


def file_version(node: Node) -> int:
    """The closed version a file node of a space is (0: never closed, a draft)."""
    return node.key[1] if FILE_VERSION_SEP in node.key[0] else 0


def version_key(space: str, version: int) -> Key:
    return (file_version_name(space, version), version, "")


def draft_key(space: str, space_id_: int, path: str) -> Key:
    return (space, -space_id_, path)


def space_key_prefixes(directory: Node) -> tuple[Key, ...]:
    """The (name, generation) prefixes of the keys of directories and drafts of the
    space `directory` belongs to (for `InodeTable.rename_paths`)."""
    sid = space_id(directory)
    return ((directory.space, sid), (directory.space, -sid))


def entry_key(directory: Node, entry: Entry) -> Key:
    """The key of `entry`, an entry of the space `directory` belongs to."""
    if entry.is_dir:
        return (directory.space, space_id(directory), entry.path)
    if entry.version:
        return version_key(directory.space, entry.version)
    return draft_key(directory.space, space_id(directory), entry.path)


def entry_attrs(space: str, entry: Entry) -> Attrs:
    """A node made from `entry` of `space` (a closed file reads as sample 0 of its
    version; a draft has nothing to read)."""
    sample_id = 0 if not entry.is_dir and entry.version else -1
    return Attrs(entry.is_dir, entry.size, entry.mode, entry.mtime_ns, sample_id,
                 space=space, space_path=entry.path)


def child_path(directory: Node, name: str) -> str:
    """The path in its space of `name` in directory `directory`; ENAMETOOLONG, or
    EINVAL for a name no space can hold."""
    path = f"{directory.space_path}/{name}" if directory.space_path else name
    try:
        return check_sample_path(path)
    except errors.InvalidArgument:
        if len(name.encode()) > 255 or len(path.encode()) > 4096:
            raise FuseError(errno.ENAMETOOLONG) from None
        raise FuseError(errno.EINVAL) from None


class SpaceNames:
    """Nodes for the daemon's entries of spaces, in `table` (see the module)."""

    def __init__(self, table: InodeTable):
        self._table = table

    def node(self, directory: Node, entry: Entry) -> Node:
        """The node of `entry` (of `directory`'s space), its attributes taken afresh."""
        attrs = entry_attrs(directory.space, entry)
        node = self._table.node_for(entry_key(directory, entry), lambda: attrs)
        self._table.refresh(node, attrs)
        return node

    def child(self, directory: Node, entry: Entry) -> Child:
        """A listing's entry (dirlist.py) for `entry` of `directory`'s space."""
        return Child(entry.name, entry_key(directory, entry),
                     entry_attrs(directory.space, entry))

    @staticmethod
    def timeout_s() -> float:
        """How long the kernel may keep a space's names and attributes."""
        return fuse_limits.mount_space_cache_timeout_s
