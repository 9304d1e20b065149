"""Inode table: the mount's inode numbers and what the kernel holds of them.

A node is one file or directory of a dataset, named by its key
``(dataset, generation, path)``: `generation` is the dataset's creation time,
so a dataset replaced under the same name gets new nodes (and new inode
numbers) instead of silently aliasing the old ones.  The root of a mount
that shows several datasets has the key ``ROOT_KEY``.  Nodes of checkpoint
spaces, which change, have keys of their own (space_names.py); this mount's
own changes move them to new keys (`rekey`, `rename_paths`) or retire them
(`retire`: a dead key no lookup makes, so a path created again gets a new
inode).

Every node carries the attributes the kernel asks for (size, mode, mtime),
so getattr never needs the daemon.  Lookup counts follow the FUSE protocol:
each successful lookup (and each entry a readdir hands out) adds one,
`forget` subtracts.  A node whose count drops to zero is *idle*: the kernel no
longer knows it, but the node is kept, least recently used first out, up to
`idle_inodes_max`, so a re-lookup after the kernel evicted its caches needs no
daemon call and gets the same inode number.  Live nodes (count > 0) are never
dropped, so the table holds at most what the kernel holds plus the idle bound.

Thread-safe (one lock): the trio loop makes, evicts and forgets nodes;
libfuse's worker threads look nodes up (`get`, `lookup`), which never
removes one.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Callable

from dlfs.fuse.lowlevel import ROOT_INODE

Key = tuple[str, int, str]
ROOT_KEY: Key = ("", 0, "")


@dataclasses.dataclass(slots=True, eq=False)
class Node:
    inode: int
    key: Key
    is_dir: bool
    size: int
    mode: int
    mtime_ns: int
    lookups: int = 0
    sample_id: int = -1  # files: the sample's id in its dataset version; -1: none known
    # Bytes of this file the mount fetched whole and intact from the daemon
    # for readers (a re-fetch after eviction counts again): the page push skips a file
    # readers fetched whole, which the kernel's page cache then holds.
    fetched_bytes: int = 0
    # Nodes of a checkpoint space: its name, and the path in it where the node was
    # last seen (a closed file's key names its version, not its path); "" otherwise.
    space: str = ""
    space_path: str = ""

    @property
    def read_key(self) -> int | str:
        """How reads name this file: its sample id when known and the reads name the
        dataset version (generation > 0), so an id can never reach another
        version's sample; else its path.  By id the client sends no Lookup
        first: one round trip per read instead of two."""
        return self.sample_id if self.sample_id >= 0 and self.key[1] > 0 else self.key[2]

    @property
    def identity(self) -> tuple[int, int]:
        """What caches of its bytes are keyed by: its inode and version.  A node this
        mount moved to another version (a space's file closed again) is another
        file to them, whose bytes were never fetched."""
        return (self.inode, self.key[1])

    @property
    def dataset(self) -> str:
        return self.key[0]

    @property
    def path(self) -> str:
        return self.key[2]

    def child_key(self, name: str) -> Key:
        dataset, generation, path = self.key
        return (dataset, generation, f"{path}/{name}" if path else name)


@dataclasses.dataclass(frozen=True, slots=True)
class Attrs:
    """What a node is made from (an `Entry` of the daemon, or the mount root)."""

    is_dir: bool
    size: int
    mode: int
    mtime_ns: int
    sample_id: int = -1  # files: the sample id (valid within the dataset version); else -1
    space: str = ""  # a checkpoint space's node: the space's name, and its path there
    space_path: str = ""


class InodeTable:
    """Inode number <-> node, with lookup counts and a bounded set of idle nodes.

    All operations are O(1).  The root node (inode `ROOT_INODE`) is
    pinned: never idle, never forgotten.
    """

    def __init__(self, root_key: Key, root_attrs: Attrs, *, idle_max: int):
        assert idle_max >= 0
        self.idle_max = idle_max
        self._by_inode: dict[int, Node] = {}
        self._by_key: dict[Key, Node] = {}
        # Idle nodes in least-recently-used order (oldest first).
        self._idle: collections.OrderedDict[int, Node] = collections.OrderedDict()
        self._next_inode = ROOT_INODE + 1
        self._lock = threading.Lock()
        self.root = self._add(ROOT_INODE, root_key, root_attrs)
        self.root.lookups = 1  # pinned

    def __len__(self) -> int:
        return len(self._by_inode)

    @property
    def idle_count(self) -> int:
        return len(self._idle)

    def get(self, inode: int) -> Node:
        """The node of `inode`.  Raises KeyError for an inode this table never
        handed out or already dropped (the kernel would be at fault)."""
        return self._by_inode[inode]

    def nodes(self) -> list[Node]:
        """Every node (live and idle), in no particular order.  O(nodes)."""
        return list(self._by_inode.values())

    def find(self, key: Key) -> Node | None:
        """The node of `key` if the table has it (live or idle), else None."""
        with self._lock:
            return self._find(key)

    def lookup(self, key: Key) -> Node | None:
        """The node of `key` with one more kernel reference, if the table has it
        (`find` and `ref` at once: no eviction can come between)."""
        with self._lock:
            node = self._find(key)
            if node is not None:
                self._ref(node)
            return node

    def node_for(self, key: Key, attrs: Callable[[], Attrs]) -> Node:
        """The node of `key`, made from `attrs()` if the table does not have it.

        Does not change the lookup count; a new node starts idle.  `attrs`
        runs with the table's lock held: it must not use the table.
        """
        with self._lock:
            node = self._find(key)
            if node is None:
                inode = self._next_inode
                self._next_inode += 1
                node = self._add(inode, key, attrs())
                self._idle[inode] = node
                self._evict()
            return node

    def ref(self, node: Node) -> None:
        """Count one more kernel reference (a lookup or readdirplus entry)."""
        with self._lock:
            self._ref(node)

    def forget(self, inode: int, count: int) -> None:
        """The kernel dropped `count` references to `inode`.  Unknown inodes
        and over-large counts are ignored (forget must not fail)."""
        with self._lock:
            node = self._by_inode.get(inode)
            if node is None or node is self.root or node.lookups == 0:
                return
            node.lookups = max(0, node.lookups - count)
            if node.lookups == 0:
                self._idle[inode] = node
                self._evict()

    def rekey_root(self, key: Key, attrs: Attrs) -> list[Node]:
        """Make the root the root of another dataset version: `key`, `attrs`.

        Returns the nodes that were the root's children (the kernel may have
        cached their names under the root).  They stay in the table as nodes
        of the old version (reads of them name it).  O(nodes).
        """
        with self._lock:
            root = self.root
            assert key not in self._by_key, key
            old_dataset, old_generation, _ = root.key
            children = [n for n in self._by_inode.values() if n is not root and
                        n.key[:2] == (old_dataset, old_generation) and n.path and
                        "/" not in n.path]
            del self._by_key[root.key]
            root.key = key
            self._by_key[key] = root
            root.is_dir, root.size, root.mode, root.mtime_ns = (attrs.is_dir, attrs.size,
                                                                attrs.mode, attrs.mtime_ns)
            return children

    def refresh(self, node: Node, attrs: Attrs) -> None:
        """Take `attrs` as `node`'s attributes now (a space's node, seen again)."""
        with self._lock:
            assert node.is_dir == attrs.is_dir, (node.key, attrs)
            node.size, node.mode, node.mtime_ns = attrs.size, attrs.mode, attrs.mtime_ns
            node.space_path = attrs.space_path

    def rekey(self, node: Node, key: Key) -> None:
        """Give `node` key `key` (its inode number stays).  A node that had `key`
        is retired first (`retire`).  O(1)."""
        with self._lock:
            self._rekey(node, key)

    def retire(self, node: Node) -> None:
        """Give `node` a dead key, which no lookup makes: the kernel's references
        stay valid, and the next node made for its old key gets a new inode.  O(1)."""
        with self._lock:
            self._retire(node)

    def rename_paths(self, spaces: tuple[Key, ...], old: str, new: str) -> list[Node]:
        """Move every node of `spaces` (key prefixes (name, generation)) at path `old`
        or below it to `new`; nodes that were at `new` or below it are retired.
        Also moves `space_path` of nodes whose key does not name their path (a
        closed file's).  Returns the nodes moved.  O(nodes)."""
        def moved(path: str) -> str | None:
            if path == old:
                return new
            if path.startswith(old + "/"):
                return new + path[len(old):]
            return None

        with self._lock:
            nodes = list(self._by_inode.values())
            space = spaces[0][0]
            for node in nodes:  # the targets first: their keys are taken next
                if node.key[:2] in spaces and moved(node.path) is None and \
                        (node.path == new or node.path.startswith(new + "/")):
                    self._retire(node)
            done = []
            for node in nodes:
                if node.space != space:
                    continue
                if node.key[:2] in spaces:
                    target = moved(node.path)
                    if target is not None:
                        self._rekey(node, (node.key[0], node.key[1], target))
                        node.space_path = target
                        done.append(node)
                elif (new_path := moved(node.space_path)) is not None:
                    node.space_path = new_path
                    done.append(node)
            return done

    def drop_idle(self) -> None:
        """Drop every idle node (e.g. after the daemon's datasets changed)."""
        with self._lock:
            while self._idle:
                self._remove(self._idle.popitem(last=False)[1])

    # --- with the lock held ----------------------------------------------------------------

    def _find(self, key: Key) -> Node | None:
        node = self._by_key.get(key)
        if node is not None and node.lookups == 0:
            self._idle.move_to_end(node.inode)
        return node

    def _ref(self, node: Node) -> None:
        assert self._by_inode.get(node.inode) is node
        if node.lookups == 0:
            del self._idle[node.inode]
        node.lookups += 1

    def _add(self, inode: int, key: Key, attrs: Attrs) -> Node:
        assert key not in self._by_key, key
        node = Node(inode, key, attrs.is_dir, attrs.size, attrs.mode, attrs.mtime_ns,
                    sample_id=attrs.sample_id, space=attrs.space, space_path=attrs.space_path)
        self._by_inode[inode] = node
        self._by_key[key] = node
        return node

    def _rekey(self, node: Node, key: Key) -> None:
        assert self._by_inode.get(node.inode) is node and node is not self.root
        if node.key == key:
            return
        occupant = self._by_key.get(key)
        if occupant is not None:
            self._retire(occupant)
        del self._by_key[node.key]
        node.key = key
        self._by_key[key] = node

    def _retire(self, node: Node) -> None:
        dead = (node.key[0], node.key[1], f"\0retired {node.inode}")
        if node.key != dead:
            del self._by_key[node.key]
            node.key = dead
            self._by_key[dead] = node

    def _evict(self) -> None:
        while len(self._idle) > self.idle_max:
            self._remove(self._idle.popitem(last=False)[1])

    def _remove(self, node: Node) -> None:
        del self._by_inode[node.inode]
        del self._by_key[node.key]

    def check_invariants(self) -> None:
        """Assert the structure is consistent.  O(n); for tests."""
        with self._lock:
            self._check_invariants()

    def _check_invariants(self) -> None:
        assert self._by_inode[ROOT_INODE] is self.root and self.root.lookups >= 1
        assert len(self._by_inode) == len(self._by_key)
        for inode, node in self._by_inode.items():
            assert node.inode == inode and self._by_key[node.key] is node
            assert node.lookups >= 0
            assert (node.lookups == 0) == (inode in self._idle), inode
            assert inode < self._next_inode
        for inode, node in self._idle.items():
            assert self._by_inode[inode] is node
        assert len(self._idle) <= self.idle_max
