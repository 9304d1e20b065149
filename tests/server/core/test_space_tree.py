"""A space's tree against a plain-dict model, and its catalog records replayed.

A Hypothesis state machine runs mkdir, link (a file closed), remove, rmdir and
rename on a `SpaceTree` and on a model (path -> "dir" or a version id); after
every step the tree's invariants hold, it agrees with the model, and both the
records the steps appended and `records_of` (compaction) replay to the same
tree.  Errors are the model's: the same class for the same refusal.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dlfs.errors import (AlreadyExists, DirectoryNotEmpty, DlfsError, InvalidArgument,
                         IsADirectory, NotADirectory, NotFound)
from dlfs.server.core import catalog_records as records
from dlfs.server.core import space_records as srec
from dlfs.server.core.catalog_records import RecordType
from dlfs.server.core.space_records import FileVersion
from dlfs.server.core.space_replay import records_of, replay_spaces
from dlfs.server.core.space_tree import SpaceTree

NAMES = st.sampled_from(["a", "b", "c"])
PATHS = st.lists(NAMES, min_size=1, max_size=3).map("/".join)


def version(version_id: int, length: int = 10) -> FileVersion:
    return FileVersion(version_id, length, version_id * 7, 0o100644, 1, 1 << 20,
                       np.empty(0, np.uint32))


class Model:
    """What a POSIX directory tree does, in the plainest terms."""

    def __init__(self):
        self.nodes: dict[str, object] = {"": "dir"}

    def parent_ok(self, path: str) -> None:
        parent = path.rpartition("/")[0]
        at = ""
        for part in parent.split("/") if parent else []:
            at = f"{at}/{part}" if at else part
            if at not in self.nodes:
                raise NotFound(at)
            if self.nodes[at] != "dir":
                raise NotADirectory(at)

    def children(self, path: str) -> list[str]:
        prefix = path + "/"
        return [p for p in self.nodes if p.startswith(prefix) and "/" not in p[len(prefix):]]

    def mkdir(self, path):
        self.parent_ok(path)
        if path in self.nodes:
            raise AlreadyExists(path)
        self.nodes[path] = "dir"

    def link(self, path, vid):
        self.parent_ok(path)
        if self.nodes.get(path) == "dir":
            raise IsADirectory(path)
        self.nodes[path] = vid

    def remove(self, path, is_dir):
        if path not in self.nodes:
            raise NotFound(path)
        if is_dir and self.nodes[path] != "dir":
            raise NotADirectory(path)
        if not is_dir and self.nodes[path] == "dir":
            raise IsADirectory(path)
        if is_dir and self.children(path):
            raise DirectoryNotEmpty(path)
        del self.nodes[path]

    def rename(self, source, target):
        self.parent_ok(target)
        if source not in self.nodes:
            raise NotFound(source)
        if source == target:
            return
        kind = self.nodes[source]
        if kind == "dir":
            if target.startswith(source + "/"):
                raise InvalidArgument(target)
            if target in self.nodes and self.nodes[target] != "dir":
                raise NotADirectory(target)
            if target in self.nodes and self.children(target):
                raise DirectoryNotEmpty(target)
        elif self.nodes.get(target) == "dir":
            raise IsADirectory(target)
        moved = {p: v for p, v in self.nodes.items()
                 if p == source or p.startswith(source + "/")}
        for p in moved:
            del self.nodes[p]
        self.nodes.pop(target, None)
        for p, v in moved.items():
            self.nodes[target + p[len(source):]] = v


class SpaceTreeMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tree = SpaceTree(1, "s", 5)
        self.model = Model()
        self.log = [(RecordType.SPACE, srec.encode_space(1, 5, "s"))]
        self.next_id = 2

    def both(self, change, model_change, record):
        try:
            model_change()
        except DlfsError as expected:
            with pytest.raises(type(expected)):
                change()
            return
        change()
        self.log.append(record)

    @rule(path=PATHS)
    def mkdir(self, path):
        self.both(lambda: self.tree.mkdir(path, 0o755, 9), lambda: self.model.mkdir(path),
                  (RecordType.MKDIR, srec.encode_mkdir(1, path, 0o755, 9)))

    @rule(path=PATHS, length=st.integers(0, 5))
    def link(self, path, length):
        v = version(self.next_id, length)
        self.next_id += 1
        self.both(lambda: self.tree.link(path, v), lambda: self.model.link(path, v.version_id),
                  (RecordType.FILE, srec.encode_file(1, path, v)))

    @rule(path=PATHS, is_dir=st.booleans())
    def remove(self, path, is_dir):
        self.both(lambda: self.tree.remove(path, is_dir, 9),
                  lambda: self.model.remove(path, is_dir),
                  (RecordType.REMOVE, srec.encode_remove(1, path, is_dir, 9)))

    @rule(source=PATHS, destination=PATHS)
    def rename(self, source, destination):
        self.both(lambda: self.tree.rename(source, destination, 9),
                  lambda: self.model.rename(source, destination),
                  (RecordType.RENAME, srec.encode_rename(1, source, destination, 9)))

    @invariant()
    def agrees(self):
        self.tree.check_invariants()
        assert _snapshot(self.tree) == {p: v for p, v in self.model.nodes.items() if p}

    @invariant()
    def replays(self):
        spaces, max_id, _ = replay_spaces(self.log)
        assert _snapshot(spaces[1]) == _snapshot(self.tree)
        assert all(v.version_id <= max_id for _, v in self.tree.versions())
        compacted, _, _ = replay_spaces(records_of(self.tree))
        assert _snapshot(compacted[1]) == _snapshot(self.tree)


def _snapshot(tree: SpaceTree) -> dict[str, object]:
    out: dict[str, object] = {p: "dir" for p in tree.dir_meta if p}
    out.update({p: v.version_id for p, v in tree.versions()})
    return out


TestSpaceTree = SpaceTreeMachine.TestCase
TestSpaceTree.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_records_round_trip():
    v = FileVersion(9, 3 << 20, 1234, 0o100600, 77, 1 << 20,
                    np.array([1, 2, 3], np.uint32))
    space_id, path, got = srec.decode_file(srec.encode_file(4, "a/b.pt", v))
    assert (space_id, path, got.version_id, got.length, got.crc, got.mode, got.mtime_ns) == \
        (4, "a/b.pt", 9, 3 << 20, 1234, 0o100600, 77)
    assert got.block_crc.tolist() == [1, 2, 3]
    assert srec.decode_space(srec.encode_space(4, 5, "ckpt")) == (4, 5, "ckpt")
    assert srec.decode_mkdir(srec.encode_mkdir(4, "d", 0o700, 6)) == (4, "d", 0o700, 6)
    assert srec.decode_remove(srec.encode_remove(4, "d", True, 6)) == (4, "d", True, 6)
    assert srec.decode_rename(srec.encode_rename(4, "a", "b/c", 6)) == (4, "a", "b/c", 6)
    with pytest.raises(ValueError):
        srec.decode_rename(srec.encode_rename(4, "a", "b", 6)[:-3].replace(b"\0", b"x"))


def test_a_deleted_space_replays_to_nothing_and_its_versions_are_not_live():
    log = [(RecordType.SPACE, srec.encode_space(3, 1, "s")),
           (RecordType.FILE, srec.encode_file(3, "x", version(8))),
           (RecordType.DELETE, records.encode_delete(3))]
    spaces, max_id, live_bytes = replay_spaces(log)
    assert spaces == {} and max_id == 8 and live_bytes == 0


def test_a_record_that_does_not_apply_is_skipped_not_fatal(caplog):
    log = [(RecordType.SPACE, srec.encode_space(3, 1, "s")),
           (RecordType.FILE, srec.encode_file(3, "missing/x", version(8))),
           (RecordType.FILE, srec.encode_file(3, "y", version(9)))]
    spaces, _, _ = replay_spaces(log)
    assert _snapshot(spaces[3]) == {"y": 9}
    assert "does not apply" in caplog.text
