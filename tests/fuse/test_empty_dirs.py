"""The tree exactly as ingested: empty directories survive ingest, restarts, striping,
`dlfs ls` and the mount (DLIO creates an empty `valid/` folder and needs it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import dlfs
from dlfs import Client
from dlfs.staging.source_files import SourceFile
from dlfs.staging.tree_walk import WalkReport, walk_tree
from helpers.trees import write_tree

pytestmark = pytest.mark.mount

EMPTY = ["valid", "train/empty", "deep/a/b/c", "only-hidden", "deep/sibling"]


def make_source(root) -> None:
    write_tree(root, {"train/cat/1.jpg": b"cat", "train/dog/2.jpg": b"dog",
                      "deep/a/file.txt": b"x", "top.txt": b"top",
                      "only-hidden/.secret": b"hidden"})
    for path in EMPTY:
        os.makedirs(os.path.join(root, *path.split("/")), exist_ok=True)


def tree_of(root: str) -> tuple[set[str], set[str]]:
    """(directories, files) below `root`, as paths relative to it (hidden ones left out)."""
    dirs, files = set(), set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in dirnames:
            dirs.add(os.path.normpath(os.path.join(rel, name)))
        files.update(os.path.normpath(os.path.join(rel, n)) for n in filenames
                     if not n.startswith("."))
    return dirs, files


def dlfs_ls(address: str, target: str) -> list[str]:
    result = subprocess.run([sys.executable, "-m", "dlfs.cli", "--server", address, "ls", target],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_walk_reports_the_empty_directories(tmp_path):
    make_source(tmp_path / "src")
    report = walk_tree(str(tmp_path / "src"))
    # A directory holding only skipped (hidden) entries is empty in the dataset.
    assert report.dirs == sorted(EMPTY)
    assert [f.path for f in report.files] == ["deep/a/file.txt", "top.txt", "train/cat/1.jpg",
                                              "train/dog/2.jpg"]


def test_empty_directories_round_trip_through_ls_restart_and_the_mount(
        daemon, mount_factory, tmp_path):
    source = tmp_path / "src"
    make_source(source)
    with Client(daemon.address) as client:
        info = client.ingest(str(source), "ds")
        assert info.samples == 4
        ds = client.dataset("ds")
        assert ds.stat("valid").is_dir and ds.stat("valid").children == 0
        assert list(ds.listdir("deep/a/b/c")) == []
        with pytest.raises(dlfs.NotFound):
            ds.stat("missing")
    assert dlfs_ls(daemon.address, "ds") == ["deep/", "only-hidden/", "top.txt", "train/",
                                             "valid/"]
    assert dlfs_ls(daemon.address, "ds/train") == ["cat/", "dog/", "empty/"]
    assert dlfs_ls(daemon.address, "ds/valid") == []
    daemon.restart()  # the directories come back from the catalog
    mount = mount_factory(daemon.address, "--dataset", "ds")
    assert tree_of(mount.mountpoint) == tree_of(str(source))
    assert os.listdir(os.path.join(mount.mountpoint, "valid")) == []


def test_a_directory_that_is_also_a_file_is_refused(daemon, tmp_path):
    write_tree(tmp_path, {"a": b"x"})
    report = WalkReport([SourceFile("a", str(tmp_path / "a"), 1, 0o100644, 1)], dirs=["a"])
    with Client(daemon.address) as client:
        with pytest.raises(dlfs.InvalidArgument, match="'a' occurs as a file and a directory"):
            client.upload(report, "clash")
        assert "clash" not in client.datasets()


def test_striped_datasets_keep_empty_directories_on_every_member(cluster, tmp_path):
    daemons = cluster.start(2)
    make_source(tmp_path / "src")
    with cluster.client() as client:
        client.ingest(str(tmp_path / "src"), "ds", replicas=1)
    for d in daemons:
        with Client(d.address) as member:
            assert member.dataset("ds").stat("deep/a/b/c").is_dir
            assert [e.name for e in member.dataset("ds").listdir("")] == [
                "deep", "only-hidden", "top.txt", "train", "valid"]
