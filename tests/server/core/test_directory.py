"""DatasetIndex: tree + id arrays against a plain model of paths."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlfs.errors import InvalidArgument, NotFound
from dlfs.server.core.catalog_records import SampleBlock
from dlfs.server.core.directory import DatasetIndex
from dlfs.server.core.sealed_datasets import SampleDirectory

name_part = st.text(alphabet="ab.-_ü/名", min_size=1, max_size=4).map(
    lambda s: "/".join(c for c in s.split("/") if c not in ("", ".", "..")) or "x")
path_sets = st.sets(name_part, min_size=0, max_size=60)


def make_block(paths: list[str]) -> SampleBlock:
    n = len(paths)
    return SampleBlock(list(paths), np.arange(n, dtype=np.uint32) % 3,
                       np.arange(n, dtype=np.uint64) * 100, np.arange(n, dtype=np.uint64) + 1,
                       np.arange(n, dtype=np.uint32), np.full(n, 0o100600, np.uint32),
                       np.arange(n, dtype=np.int64))


def is_consistent(paths) -> bool:
    prefixes = {"/".join(p.split("/")[:i]) for p in paths for i in range(1, p.count("/") + 1)}
    return not prefixes & set(paths)


def model_children(paths, directory: str) -> dict[str, bool]:
    """name -> is_dir for the direct children of `directory` in the model."""
    prefix = directory + "/" if directory else ""
    children = {}
    for p in paths:
        if p.startswith(prefix):
            head, sep, _ = p[len(prefix):].partition("/")
            children[head] = children.get(head, False) or bool(sep)
    return children


@settings(max_examples=200, deadline=None)
@given(paths=path_sets.filter(is_consistent), data=st.data())
def test_index_matches_model(paths, data):
    shuffled = data.draw(st.permutations(sorted(paths)))
    block = make_block(shuffled)
    index = DatasetIndex("ds", 1, 5, block)
    index.check_invariants()
    ordered = sorted(paths)
    assert len(index) == len(ordered)
    for i, path in enumerate(ordered):
        assert index.path(i) == path and index.id_of(path) == i
        source = shuffled.index(path)
        assert int(index.offset[i]) == int(block.offset[source])
        assert int(index.length[i]) == int(block.length[source])
        entry = index.stat(path)
        assert not entry.is_dir and entry.size == int(block.length[source]) and entry.id == i
    directories = {""} | {"/".join(p.split("/")[:k]) for p in paths for k in range(1, p.count("/") + 1)}
    for directory in directories:
        expected = model_children(paths, directory)
        page = data.draw(st.integers(1, 5))
        listed, after = [], ""
        while True:
            entries, more = index.listdir(directory, after, page)
            listed += [(e.name, e.is_dir) for e in entries]
            if not more:
                break
            after = entries[-1].name
        assert listed == sorted(expected.items())
        assert index.stat(directory).children == len(expected)
    if ordered:
        ids = data.draw(st.lists(st.integers(0, len(ordered) - 1), max_size=20))
        assert index.check_ids(ids).tolist() == ids
        assert index.ids_of([ordered[i] for i in ids]).tolist() == ids


def test_duplicate_and_conflicting_paths_are_rejected():
    with pytest.raises(InvalidArgument, match="'a/b' occurs twice"):
        DatasetIndex("ds", 1, 0, make_block(["a/b", "a/b"]))
    with pytest.raises(InvalidArgument, match="as a file and a directory"):
        DatasetIndex("ds", 1, 0, make_block(["a", "a/b"]))
    with pytest.raises(InvalidArgument, match="as a file and a directory"):
        DatasetIndex("ds", 1, 0, make_block(["x/a/c", "x/a"]))


def test_lookup_errors_name_the_problem():
    index = DatasetIndex("ds", 1, 0, make_block(["a/b", "c"]))
    with pytest.raises(NotFound, match="dataset 'ds' has no sample 'a/zz'"):
        index.id_of("a/zz")
    with pytest.raises(InvalidArgument, match="'a' is a directory"):
        index.id_of("a")
    with pytest.raises(NotFound, match="'c' is a file"):
        index.id_of("c/d")
    with pytest.raises(InvalidArgument, match="valid ids are 0..1"):
        index.check_ids([0, 2])
    with pytest.raises(InvalidArgument, match="sample id -1"):
        index.check_ids([-1])
    with pytest.raises(InvalidArgument, match="valid ids are 0..1"):  # unsigned, as sent
        index.check_ids(np.array([0, 2**63], dtype=np.uint64))
    with pytest.raises(InvalidArgument, match="'c' is a sample, not a directory"):
        index.listdir("c")
    with pytest.raises(InvalidArgument, match="page size 0"):
        index.listdir("", "", 0)
    for bad in ("/abs", "a//b", "a/../b", "nul\0", "x" * 5000):
        with pytest.raises(InvalidArgument):
            index.id_of(bad)


def test_sample_directory_publish_replace_remove():
    directory = SampleDirectory()
    first = DatasetIndex("ds", 1, 0, make_block(["a"]))
    second = DatasetIndex("ds", 2, 0, make_block(["b"]))
    assert directory.publish(first) is None
    assert directory.publish(second) is first
    assert directory.get("ds") is second and directory.names() == ["ds"]
    assert directory.remove("ds") is second
    with pytest.raises(NotFound, match="no dataset named 'ds'"):
        directory.get("ds")
