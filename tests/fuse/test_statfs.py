"""`df` on a mount, as typed: the datasets' size, all used, none available, read-only
(as squashfs shows itself: disk-full alerts and job prologs that look at free space
of writable file systems leave it out by its read-only flag)."""

from __future__ import annotations

import os
import subprocess

import pytest

from helpers.trees import write_tree
from dlfs import Client

pytestmark = pytest.mark.mount


def df(mountpoint: str, *options: str) -> list[str]:
    """The one line of `df OPTIONS MOUNTPOINT` for the mount, split."""
    done = subprocess.run(["df", *options, mountpoint], capture_output=True, text=True,
                          timeout=60, check=True)
    header, line = done.stdout.splitlines()
    return line.split()


def test_df_shows_the_datasets_size_none_free_and_read_only(daemon, mount_factory, tmp_path):
    write_tree(tmp_path / "a", {f"{i}.bin": b"x" * 10_000 for i in range(30)})
    write_tree(tmp_path / "b", {"one.bin": b"y" * 5000})
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "a"), "a")
        client.ingest(str(tmp_path / "b"), "b")
        sizes = {info.name: info.bytes for info in client.dataset_infos()}
    whole = mount_factory(daemon.address)
    blocks = -(-(sizes["a"] + sizes["b"]) // 4096)
    size, used, avail, percent, _ = df(whole.mountpoint, "-B4096",
                                       "--output=size,used,avail,pcent,target")
    assert (int(size), int(used), int(avail), percent) == (blocks, blocks, 0, "100%")
    inodes, iused, ifree, _ = df(whole.mountpoint, "--output=itotal,iused,iavail,target")
    assert (int(inodes), int(iused), int(ifree)) == (31, 31, 0)
    assert os.statvfs(whole.mountpoint).f_flag & os.ST_RDONLY
    one = mount_factory(daemon.address, "--dataset", "b")
    size, avail, _ = df(one.mountpoint, "-B4096", "--output=size,avail,target")
    assert (int(size), int(avail)) == (-(-sizes["b"] // 4096), 0)
