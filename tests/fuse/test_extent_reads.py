"""Small files of a co-located mount read whole from the daemon's extents
(fuse/extentreads.py), against a real daemon and real mounts: the bytes, the
daemon left out of it, a damaged file, the daemon away, the switch."""

from __future__ import annotations

import errno
import os
import time

import numpy as np
import pytest

from helpers.trees import write_tree
from helpers.damage import flip_byte
from dlfs import Client
from dlfs.fuse.extentreads import PagesRelease
from dlfs.server.read import residency
from helpers.daemons import evict_extents
from helpers.mounts import extent_reads

pytestmark = pytest.mark.mount


@pytest.fixture
def tree(daemon, tmp_path) -> dict[str, bytes]:
    rng = np.random.default_rng(21)
    # Sizes around pages and the kernel's first read of a file; an empty file.
    files = {f"c{i % 3}/{i:03d}.jpg": rng.bytes(size)
             for i, size in enumerate((1, 4095, 4096, 4097, 65_536, 110_000, 131_073,
                                       2 * 2**20 + 5, 0))}
    write_tree(tmp_path / "src", files)
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")
    return files


def read(mount, rel: str) -> bytes:
    with open(os.path.join(mount.mountpoint, rel), "rb") as f:
        return f.read()


def test_small_files_come_from_the_extents_and_the_daemon_sends_nothing(
        daemon, mount_factory, tree):
    mount = mount_factory(daemon.address, "--dataset", "ds")
    for rel, data in sorted(tree.items()):
        assert read(mount, rel) == data, rel
    assert "read" not in mount.request_counts(label="daemon calls")
    counted = extent_reads(mount)
    # Each file (the empty one needs no read) read on demand, or in a batch by the
    # page push the first read started (it reads from the extents too).
    assert counted["files"] + counted["batched_files"] >= len(tree) - 1
    assert counted["bytes"] + counted["batched_bytes"] >= sum(len(d) for d in tree.values())


def test_a_damaged_file_is_eio_naming_it_and_the_others_read(daemon, mount_factory, tree):
    names = sorted(tree)  # ingest order: sample ids follow the sorted paths
    damaged = names.index("c2/005.jpg")
    flip_byte(daemon, "ds", damaged, 50_000)
    mount = mount_factory(daemon.address, "--dataset", "ds")
    with pytest.raises(OSError) as caught:
        read(mount, "c2/005.jpg")
    assert caught.value.errno == errno.EIO
    assert "checksum mismatch" in mount.log() and "'c2/005.jpg'" in mount.log()
    for rel in names:
        if rel != "c2/005.jpg":
            assert read(mount, rel) == tree[rel], rel
    assert "read" not in mount.request_counts(label="daemon calls")  # no retry elsewhere


def test_reads_go_on_while_the_daemon_is_away(daemon, mount_factory, tree):
    """The extents are mapped and the names known: files not read before the
    daemon stopped still read (listing an unlisted directory would need it)."""
    mount = mount_factory(daemon.address, "--dataset", "ds")
    names = sorted(tree)
    assert sorted(os.path.join(d, f) for d in ("c0", "c1", "c2")
                  for f in os.listdir(os.path.join(mount.mountpoint, d))) == names
    assert read(mount, names[0]) == tree[names[0]]  # maps the extents
    port = daemon.address.rpartition(":")[2]
    daemon.stop()
    for rel in names[1:]:
        assert read(mount, rel) == tree[rel], rel
    daemon.start(f"127.0.0.1:{port}")
    assert read(mount, names[1]) == tree[names[1]]


def test_extent_reads_off_reads_through_the_daemon(daemon, mount_factory, tree):
    mount = mount_factory(daemon.address, "--dataset", "ds", "--extent-reads", "off")
    for rel, data in sorted(tree.items()):
        assert read(mount, rel) == data, rel
    assert mount.request_counts(label="daemon calls")["read"] == len(tree) - 1
    assert "extent reads:" not in mount.log()


# --- the pages the mount mapped: let go of --extent-pages-release seconds after a read ---

def _mapped_extent_bytes(pid: int, extent_dir: str) -> int:
    """Bytes of `pid`'s mappings of files under `extent_dir` that its page tables map
    (the Rss lines of /proc/PID/smaps)."""
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's first line
                inside = len(fields) >= 6 and fields[5].startswith(extent_dir)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


@pytest.fixture
def small_files(daemon, tmp_path) -> dict[str, bytes]:
    """4 MiB of small files: each read whole from the mapped extents (no splice)."""
    rng = np.random.default_rng(22)
    files = {f"s/{i:03d}.bin": rng.bytes(64 * 1024) for i in range(64)}
    write_tree(tmp_path / "small", files)
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "small"), "small")
    return files


def _read_all(mount, files: dict[str, bytes]) -> None:
    for rel, data in sorted(files.items()):
        assert read(mount, rel) == data, rel


def test_without_release_the_pages_read_stay_mapped(daemon, mount_factory, small_files):
    """The control: what the release below lets go of is there without it."""
    mount = mount_factory(daemon.address, "--dataset", "small", "--extent-pages-release", "0")
    _read_all(mount, small_files)
    extent_dir = os.path.join(daemon.data_dir, "extents")
    assert _mapped_extent_bytes(mount.pid, extent_dir) >= 0.9 * 64 * 64 * 1024


def _cached_extent_pages(daemon) -> int:
    extent_dir = os.path.join(daemon.data_dir, "extents")
    total = 0
    for folder, _, names in os.walk(extent_dir):
        for name in names:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                total += residency.cached_pages(fd, 0, os.fstat(fd).st_size)
            finally:
                os.close(fd)
    return total


def test_after_reads_through_a_default_mount_eviction_makes_the_extents_cold(
        daemon, mount_factory, small_files):
    """What drop_caches does between a benchmark's epochs (DONTNEED here, as the test
    shares the machine): the mount, which goes on running, lets go of its mapped
    pages within a second of its last read, as the daemon does, so nothing stays."""
    mount = mount_factory(daemon.address, "--dataset", "small")
    _read_all(mount, small_files)
    assert _cached_extent_pages(daemon) > 0
    evict_extents(daemon)  # waits for the daemon's mappings, and now the mount's
    assert _cached_extent_pages(daemon) == 0
    assert _mapped_extent_bytes(mount.pid, os.path.join(daemon.data_dir, "extents")) == 0


def test_the_release_is_due_after_idle_or_now_and_then_while_busy():
    release = PagesRelease(idle_s=1.0, busy_s=30.0)
    assert not release.due(0.0, 0)  # nothing read: nothing mapped
    assert not release.due(10.0, 0)
    assert not release.due(10.5, 5)  # reading
    assert not release.due(11.0, 5)  # idle for 0.5 s
    assert release.due(11.5, 5)  # idle for 1 s
    assert not release.due(12.0, 5) and not release.due(100.0, 5)  # released already
    for t in range(101, 130):  # reading on without a pause
        assert not release.due(float(t), t)
    assert release.due(130.0, 130)  # 30 s after the release before the reads began
    assert not release.due(131.0, 131)


def test_the_mount_lets_go_of_the_pages_it_mapped_and_reads_on(daemon, mount_factory,
                                                                 small_files):
    mount = mount_factory(daemon.address, "--dataset", "small",
                          "--extent-pages-release", "0.2")
    _read_all(mount, small_files)
    extent_dir = os.path.join(daemon.data_dir, "extents")
    deadline = time.monotonic() + 10
    while _mapped_extent_bytes(mount.pid, extent_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _mapped_extent_bytes(mount.pid, extent_dir) == 0
    # The files read again from the same mappings: a page is mapped again at its touch.
    # The kernel's cache of the mount's files would answer without asking the mount:
    # evict it first.
    for rel in small_files:
        with open(os.path.join(mount.mountpoint, rel), "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    _read_all(mount, small_files)
    counted = extent_reads(mount)
    assert counted["files"] + counted["batched_files"] >= 2 * len(small_files) - 8
