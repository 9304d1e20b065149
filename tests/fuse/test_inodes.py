"""The inode table against a plain model, with its invariants after every step."""

from __future__ import annotations

import sys
import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dlfs.fuse.inodes import ROOT_KEY, Attrs, InodeTable
from dlfs.fuse.lowlevel import ROOT_INODE

IDLE_MAX = 3
KEYS = [("ds", 1, p) for p in ("", "a", "a/b", "a/c", "d", "e", "f")] + [("other", 2, "")]
ROOT_ATTRS = Attrs(True, 0, 0o40555, 0)


def attrs_of(key) -> Attrs:
    return Attrs(False, len(key[2]), 0o100644, hash(key) & 0xFFFF)


class InodeTableMachine(RuleBasedStateMachine):
    """Model: key -> lookup count of the nodes the kernel knows, and the inode
    each key had when last seen (numbers must be stable while in the table)."""

    def __init__(self):
        super().__init__()
        self.table = InodeTable(ROOT_KEY, ROOT_ATTRS, idle_max=IDLE_MAX)
        self.lookups: dict[tuple, int] = {}
        self.inode_of: dict[tuple, int] = {}
        self.moved: set[tuple] = set()  # keys whose node has another key's attributes

    @rule(key=st.sampled_from(KEYS))
    def lookup(self, key):
        node = self.table.node_for(key, lambda: attrs_of(key))
        self.table.ref(node)
        if key in self.inode_of and self.lookups.get(key, 0) > 0:
            assert node.inode == self.inode_of[key], "a live node changed its inode"
        self.inode_of[key] = node.inode
        self.lookups[key] = self.lookups.get(key, 0) + 1
        if key not in self.moved:
            assert (node.size, node.mode) == (attrs_of(key).size, attrs_of(key).mode)

    @rule(key=st.sampled_from(KEYS))
    def peek(self, key):
        """node_for without a reference (what readdir does before the kernel takes it)."""
        node = self.table.node_for(key, lambda: attrs_of(key))
        if self.lookups.get(key, 0) > 0:
            assert node.inode == self.inode_of[key]
        assert node.lookups == self.lookups.get(key, 0)

    @rule(key=st.sampled_from(KEYS))
    def lookup_known(self, key):
        """What a lookup answered in a libfuse thread does: a reference only if the
        table has the node (live, or idle and not evicted yet)."""
        node = self.table.lookup(key)
        if node is None:
            assert not self.lookups.get(key), "a live node was not found"
            return
        if self.lookups.get(key, 0) > 0:
            assert node.inode == self.inode_of[key]
        self.inode_of[key] = node.inode
        self.lookups[key] = self.lookups.get(key, 0) + 1
        assert node.lookups == self.lookups[key]

    @precondition(lambda self: any(self.lookups.values()))
    @rule(data=st.data())
    def forget(self, data):
        key = data.draw(st.sampled_from(sorted(k for k, n in self.lookups.items() if n)))
        count = data.draw(st.integers(1, self.lookups[key]))
        self.table.forget(self.inode_of[key], count)
        self.lookups[key] -= count

    @rule(inode=st.integers(0, 50), count=st.integers(1, 5))
    def forget_unknown_or_root(self, inode, count):
        """Forgetting what the kernel does not hold (or the root) changes nothing."""
        known = {self.inode_of[k] for k, n in self.lookups.items() if n}
        if inode in known:
            return
        before = {k: self.table.find(k).lookups for k, n in self.lookups.items() if n}
        self.table.forget(inode, count)
        assert {k: self.table.find(k).lookups for k in before} == before
        assert self.table.get(ROOT_INODE) is self.table.root

    def _follow(self, old_key, node) -> None:
        """The model's entry of `old_key` now belongs to `node.key` (same inode)."""
        if old_key in self.lookups:
            self.lookups[node.key] = self.lookups.pop(old_key)
            self.inode_of[node.key] = self.inode_of.pop(old_key)
        self.moved.add(node.key)

    @rule(key=st.sampled_from(KEYS[1:]))
    def retire(self, key):
        """A path removed through the mount: its node stays, under a dead key."""
        node = self.table.find(key)
        if node is None:
            return
        inode = node.inode
        self.table.retire(node)
        assert node.inode == inode and node.key != key and self.table.find(key) is None
        self._follow(key, node)

    @rule(source=st.sampled_from(KEYS[1:]), to=st.sampled_from(KEYS[1:]))
    def rekey(self, source, to):
        """A file closed into a new version: its node moves to the version's key, and a
        node that had that key is retired."""
        node = self.table.find(source)
        if node is None or source == to:
            return
        occupant = self.table.find(to)
        inode = node.inode
        self.table.rekey(node, to)
        if occupant is not None:
            assert occupant.key != to
            self._follow(to, occupant)
        assert node.inode == inode and self.table.find(to) is node
        self._follow(source, node)

    @invariant()
    def consistent(self):
        self.table.check_invariants()
        for key, count in self.lookups.items():
            if count:  # live nodes are never dropped
                node = self.table.get(self.inode_of[key])
                assert node.key == key and node.lookups == count
        live = sum(1 for n in self.lookups.values() if n)
        assert len(self.table) <= 1 + live + IDLE_MAX  # root + live + bounded idle


TestInodeTable = InodeTableMachine.TestCase
TestInodeTable.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_idle_nodes_keep_their_inode_until_evicted():
    table = InodeTable(ROOT_KEY, ROOT_ATTRS, idle_max=2)
    a = table.node_for(KEYS[1], lambda: attrs_of(KEYS[1]))
    table.ref(a)
    table.forget(a.inode, 1)
    assert table.find(KEYS[1]) is a and table.idle_count == 1  # re-lookup: same number
    for key in KEYS[2:4]:  # two newer idle nodes push the oldest out
        table.node_for(key, lambda: attrs_of(key))
    assert table.find(KEYS[1]) is None
    with pytest.raises(KeyError):
        table.get(a.inode)
    b = table.node_for(KEYS[1], lambda: attrs_of(KEYS[1]))
    assert b.inode != a.inode  # numbers are never reused
    table.check_invariants()


def test_lookups_from_other_threads_while_nodes_come_and_go():
    """libfuse's worker threads look names up while the trio thread makes idle
    nodes (evicting older ones) and forgets: no lost or doubled reference."""
    table = InodeTable(ROOT_KEY, ROOT_ATTRS, idle_max=8)
    keys = [("ds", 1, f"f{i}") for i in range(64)]
    stop = threading.Event()
    failures: list[BaseException] = []
    found = [0]

    def worker() -> None:
        try:
            while not stop.is_set():
                for key in keys:
                    node = table.lookup(key)
                    if node is not None:  # the kernel took it, and later forgets it
                        found[0] += 1
                        table.forget(node.inode, 1)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    for thread in threads:
        thread.start()
    try:
        for _ in range(300):
            for key in keys:  # listings make nodes; eight idle ones stay
                table.node_for(key, lambda key=key: attrs_of(key))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        sys.setswitchinterval(interval)
    assert not failures, failures
    assert found[0] > 0
    table.check_invariants()
    assert all(node.lookups == 0 for node in table.nodes() if node is not table.root)


def test_rename_paths_moves_a_subtree_and_retires_what_it_replaces():
    """A space's directory renamed through the mount: its nodes and those below it
    take the new paths (same inodes); closed files (keyed by version) keep their
    keys and follow in space_path; nodes at the target go out of the way."""
    table = InodeTable(ROOT_KEY, ROOT_ATTRS, idle_max=100)
    spaces = (("ck", 7), ("ck", -7))

    def make(key, path, is_dir=False):
        return table.node_for(key, lambda: Attrs(is_dir, 0, 0o40755 if is_dir else 0o100644,
                                                 0, space="ck", space_path=path))

    a = make(("ck", 7, "a"), "a", True)
    draft = make(("ck", -7, "a/being-written"), "a/being-written")
    version = make(("ck@5", 5, ""), "a/b/closed")
    other = make(("ck@6", 6, ""), "ab/closed")  # "ab" is not below "a"
    old_target = make(("ck", 7, "c"), "c", True)
    moved = table.rename_paths(spaces, "a", "c")
    assert set(moved) == {a, draft, version}
    assert (a.key, draft.key, version.key) == (("ck", 7, "c"), ("ck", -7, "c/being-written"),
                                               ("ck@5", 5, ""))
    assert (a.space_path, draft.space_path, version.space_path, other.space_path) == \
        ("c", "c/being-written", "c/b/closed", "ab/closed")
    assert table.find(("ck", 7, "c")) is a and old_target.key != ("ck", 7, "c")
    assert table.find(("ck", 7, "a")) is None
    table.check_invariants()
