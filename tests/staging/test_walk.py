"""Which files an ingest picks up: hidden files, symlinks, loops, special files."""

from __future__ import annotations

import os

import pytest

import dlfs
from dlfs.staging.tree_walk import walk_tree
from helpers.trees import write_tree


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "src"
    write_tree(root, {"a/x.txt": b"x", ".hidden": b"h", ".git/config": b"c", "b/y.txt": b"yy"})
    outside = tmp_path / "outside"
    write_tree(outside, {"o.txt": b"o"})
    os.symlink(root / "a" / "x.txt", root / "link-to-file")
    os.symlink(outside, root / "link-to-dir")
    os.symlink(root, root / "b" / "loop")
    os.symlink(root / "missing", root / "dangling")
    os.mkfifo(root / "fifo")
    os.mkdir(root / "empty")
    return root


def paths(report):
    return [f.path for f in report.files]


def test_default_rules(tree):
    report = walk_tree(str(tree))
    assert paths(report) == ["a/x.txt", "b/y.txt"]
    assert (report.skipped_hidden, report.skipped_symlinks, report.skipped_special) == (2, 4, 1)
    assert report.bytes == 3


def test_hidden_and_symlinks_on_request(tree):
    report = walk_tree(str(tree), include_hidden=True, follow_symlinks=True)
    assert paths(report) == [".git/config", ".hidden", "a/x.txt", "b/y.txt", "link-to-dir/o.txt",
                             "link-to-file"]
    assert report.skipped_loops == 1 and report.skipped_symlinks == 1  # the dangling link


def test_non_utf8_names_stop_the_walk(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    (root / "ok").write_bytes(b"1")
    with open(os.path.join(os.fsencode(root), b"bad-\xff"), "wb") as f:
        f.write(b"2")
    with pytest.raises(dlfs.InvalidArgument, match="not valid UTF-8"):
        walk_tree(str(root))
