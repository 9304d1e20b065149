"""What the kernel is told about a node: the keys of dataset versions, `struct
stat` and entry replies.  Pure functions, O(1) each."""

from __future__ import annotations

import stat

from dlfs import limits as fuse_limits
from dlfs.types import DatasetInfo, Entry
from dlfs.fuse import lowlevel as ll
from dlfs.fuse.inodes import Attrs, Key, Node

DIR_MODE = stat.S_IFDIR | 0o555
_NS = 1_000_000_000


def dataset_attrs(info: DatasetInfo) -> Attrs:
    return Attrs(True, 0, DIR_MODE, info.created_ns)


def dataset_key(info: DatasetInfo) -> Key:
    """The key of a dataset's root: its name and version.  The version is its
    generation, or, for a striped dataset from before generations (0), minus
    its creation time: a replaced dataset gets new nodes either way."""
    return (info.name, info.generation or -info.created_ns, "")


def read_generation(node: Node) -> int:
    """The generation reads of `node` name (0, "any", when its dataset has none)."""
    return max(node.key[1], 0)


def entry_attrs(entry: Entry) -> Attrs:
    return Attrs(entry.is_dir, entry.size, entry.mode, entry.mtime_ns,
                 -1 if entry.is_dir else entry.id)


def stat_of(node: Node, uid: int, gid: int) -> ll.Stat:
    """The attributes of `node`, owned by `uid`:`gid`, with every time its mtime."""
    attr = ll.Stat()
    attr.st_ino = node.inode
    attr.st_mode = node.mode
    attr.st_nlink = 1  # directories too: "count unknown", so find never prunes
    attr.st_uid = uid
    attr.st_gid = gid
    attr.st_size = node.size
    attr.st_blksize = fuse_limits.mount_block_bytes
    attr.st_blocks = -(-node.size // 512)
    seconds, nanoseconds = divmod(node.mtime_ns, _NS)
    for field in (attr.st_atim, attr.st_mtim, attr.st_ctim):
        field.tv_sec, field.tv_nsec = seconds, nanoseconds
    return attr


def entry_of(node: Node, uid: int, gid: int, attr_timeout_s: float,
             entry_timeout_s: float) -> ll.EntryParam:
    """The reply to a lookup (or a READDIRPLUS entry) that found `node`."""
    entry = ll.EntryParam()
    entry.ino = node.inode
    entry.attr = stat_of(node, uid, gid)
    entry.attr_timeout = attr_timeout_s
    entry.entry_timeout = entry_timeout_s
    return entry
