"""`df` on a mount, as typed.  A writable (whole-daemon) mount: the datasets' size in
use and the daemon's data dir's free space available, where checkpoint spaces write.
A read-only one (`--dataset`): its size, all used, none available, read-only, as
squashfs shows itself (disk-full alerts and job prologs that look at the free space
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


def test_df_shows_the_datasets_size_and_the_free_space_spaces_may_write(daemon,
                                                                        mount_factory,
                                                                        tmp_path):
    write_tree(tmp_path / "a", {f"{i}.bin": b"x" * 10_000 for i in range(30)})
    write_tree(tmp_path / "b", {"one.bin": b"y" * 5000})
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "a"), "a")
        client.ingest(str(tmp_path / "b"), "b")
        sizes = {info.name: info.bytes for info in client.dataset_infos()}
    whole = mount_factory(daemon.address)  # writable: checkpoint spaces beside the datasets
    blocks = -(-(sizes["a"] + sizes["b"]) // 4096)
    size, used, avail, _ = df(whole.mountpoint, "-B4096", "--output=size,used,avail,target")
    disk = os.statvfs(daemon.data_dir)
    free = disk.f_bavail * disk.f_frsize // 4096
    assert int(used) == blocks and int(size) == blocks + int(avail)
    assert abs(int(avail) - free) <= max(free // 100, 16384), (avail, free)  # the data dir's
    inodes, iused, ifree, _ = df(whole.mountpoint, "--output=itotal,iused,iavail,target")
    assert (int(inodes), int(iused), int(ifree)) == (31 + 20000, 31, 20000)
    assert not os.statvfs(whole.mountpoint).f_flag & os.ST_RDONLY
    one = mount_factory(daemon.address, "--dataset", "b")  # read-only, as squashfs shows
    size, used, avail, percent, _ = df(one.mountpoint, "-B4096",
                                       "--output=size,used,avail,pcent,target")
    assert (int(size), int(used), int(avail), percent) == \
        (-(-sizes["b"] // 4096), -(-sizes["b"] // 4096), 0, "100%")
    assert os.statvfs(one.mountpoint).f_flag & os.ST_RDONLY
