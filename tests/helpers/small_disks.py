"""Small real file systems for disk-full tests: an ext4 image on a loop device.

tmpfs fills up too, but takes no O_DIRECT, so a daemon on it writes its
extents through the page cache (directio.open_appender); an ext4 image
gives the O_DIRECT appender its real ENOSPC.  Mounting needs root (the
tests run as root; elsewhere they are skipped as the tmpfs ones are).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import subprocess

import pytest


@contextlib.contextmanager
def ext4_disk(directory: pathlib.Path, size_mib: int):
    """Mount a fresh ext4 file system of `size_mib` MiB at `directory` (created), and
    unmount it afterwards.  Cost: mkfs and mount, a fraction of a second."""
    if os.geteuid() != 0:
        pytest.skip("mounting a loop device needs root")
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("mkfs.ext4 is not installed")
    directory.mkdir(parents=True)
    image = directory.with_name(directory.name + ".img")
    with open(image, "wb") as f:
        f.truncate(size_mib << 20)
    # No journal: its megabytes would be most of so small a disk.
    subprocess.run(["mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-E", "nodiscard",
                    str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(directory)], check=True)
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)
        image.unlink()


def used_bytes(path) -> int:
    """Bytes in use on the file system holding `path` (statvfs)."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def free_bytes(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def extent_dirs(data_dir) -> list[str]:
    """The dataset directories below DATA_DIR/extents: one per dataset or ingest
    that holds extents."""
    return sorted(os.listdir(os.path.join(data_dir, "extents")))


def tree_disk_bytes(path) -> int:
    """Allocated bytes of the files below `path` (what they take on the disk)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total
