"""What reaches the mount's process per open(): nothing, once names and bytes are cached.

The mount answers OPEN with ENOSYS (FUSE no-open), so the kernel opens,
flushes and releases files without asking; names come with attributes in
READDIRPLUS; entries and attributes are cached for the life of a dataset
version.  The counts are the mount's own (`MountProcess.request_counts`).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from helpers.trees import unique_name, write_tree
from dlfs import Client
from helpers import mounts
from helpers.mounts import page_cache_holds

pytestmark = pytest.mark.mount

OPENS_PER_FILE = 20


@pytest.fixture(scope="module")
def small_dataset(shared_daemon, tmp_path_factory):
    rng = np.random.default_rng(9)
    tree = {f"{i:03d}.bin": rng.bytes(4096 if i % 2 else 110 * 1024) for i in range(30)}
    tree["sub/deeper.bin"] = rng.bytes(5000)
    source = tmp_path_factory.mktemp("roundtrips")
    write_tree(source, tree)
    name = unique_name("rt")
    with Client(shared_daemon.address) as client:
        client.ingest(str(source), name, progress=False)
    return shared_daemon.address, name, tree


def test_warm_opens_reach_the_mount_not_at_all(small_dataset, mount_factory):
    address, name, tree = small_dataset
    m = mount_factory(address, "--dataset", name)
    flat = sorted(rel for rel in tree if "/" not in rel)
    assert sorted(os.listdir(m.mountpoint)) == sorted(flat + ["sub"])
    for rel in flat:  # first epoch: the bytes come from the daemon
        with open(os.path.join(m.mountpoint, rel), "rb") as f:
            assert f.read() == tree[rel]
    first = m.request_counts()
    assert first.get("lookup", 0) == 0, first  # the listing carried every name's attributes
    assert first.get("open", 0) <= 1, first  # answered ENOSYS: the kernel stops asking
    assert first.get("release", 0) == 0, first
    # At least the first file's bytes came in a read; the others in reads or in
    # the push into the page cache the first read started (fuse/pagepush.py).
    assert first.get("read", 0) >= 1, first

    reclaimed = 0  # files the host's proactive reclaim took back meanwhile
    for _ in range(OPENS_PER_FILE):  # later epochs: buffered and unbuffered, stat and mmap
        for rel in flat:
            path = os.path.join(m.mountpoint, rel)
            reclaimed += not page_cache_holds(path)
            with open(path, "rb") as f:
                assert f.read() == tree[rel]
            fd = os.open(path, os.O_RDONLY)
            try:
                assert os.fstat(fd).st_size == len(tree[rel])
                assert os.pread(fd, 100, 1000) == tree[rel][1000:1100]
            finally:
                os.close(fd)
    later = m.request_counts()
    added = {k: later.get(k, 0) - first.get(k, 0) for k in later if later[k] != first.get(k, 0)}
    # Nothing at all, but a READ for a file whose pages were reclaimed (helpers/mounts.py).
    assert set(added) <= {"read"} and added.get("read", 0) <= reclaimed, (added, reclaimed)
    assert reclaimed <= len(flat), reclaimed


def test_reads_name_the_inode_without_open(small_dataset, mount_factory):
    """With the page cache dropped, a file opened without OPEN is read again
    from the daemon: reads are served by inode alone."""
    address, name, tree = small_dataset
    m = mount_factory(address, "--dataset", name)
    path = os.path.join(m.mountpoint, "sub", "deeper.bin")
    with open(path, "rb") as f:
        assert f.read() == tree["sub/deeper.bin"]
    before = m.request_counts()
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # evict its pages
        assert f.read() == tree["sub/deeper.bin"]
    after = m.request_counts()
    assert after.get("read", 0) > before.get("read", 0)
    assert after.get("open", 0) == before.get("open", 0) <= 1


@pytest.mark.parametrize("extent_reads", ["auto", "off"])
def test_paths_opened_without_a_listing_cost_one_listing_per_directory(small_dataset,
                                                                       mount_factory,
                                                                       extent_reads):
    """A reader that knows its paths (a file list) and never lists: the first
    lookup in a directory lists it, the others are answered from memory.  Each
    file's bytes: one read of the extents (this mount is on the daemon's host),
    or with `--extent-reads off` one whole-sample read through the daemon."""
    address, name, tree = small_dataset
    m = mount_factory(address, "--dataset", name, "--extent-reads", extent_reads)
    for rel in sorted(tree):
        with open(os.path.join(m.mountpoint, *rel.split("/")), "rb") as f:
            assert f.read() == tree[rel]
    calls = m.request_counts(label="daemon calls")
    assert calls.get("stat", 0) == 0, calls  # every name came with its directory
    assert calls["list_page"] == 2, calls  # the root and sub/
    if extent_reads == "auto":  # read on demand, or by the page push the first read started
        assert "read" not in calls, calls
        counted = mounts.extent_reads(m)
        assert counted["files"] + counted["batched_files"] >= len(tree), counted
    else:
        assert calls["read"] == len(tree), calls


def test_a_sequential_reader_of_a_large_file_gets_large_reads(shared_daemon, tmp_path,
                                                              mount_factory):
    """The mount widens the kernel's read-ahead window (limits.mount_kernel_read_ahead_bytes),
    so a reader going through a large file in 256 KiB reads (np.load of a volume)
    costs about one READ per MiB, not one or two per read() call."""
    from dlfs import limits

    rng = np.random.default_rng(11)
    data = rng.bytes(24 * 2**20 + 4321)
    write_tree(tmp_path / "src", {"volume.npz": data})
    name = unique_name("ra")
    with Client(shared_daemon.address) as client:
        client.ingest(str(tmp_path / "src"), name, progress=False)
    m = mount_factory(shared_daemon.address)  # every dataset: no page push to muddle counts
    path = os.path.join(m.mountpoint, name, "volume.npz")
    device = os.stat(m.mountpoint).st_dev
    if os.geteuid() == 0:
        with open(f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb") as f:
            assert int(f.read()) == limits.mount_kernel_read_ahead_bytes // 1024
    before = m.request_counts().get("read", 0)
    got = bytearray()
    with open(path, "rb", buffering=0) as f:
        while piece := f.read(256 * 1024):
            got += piece
    assert got == data
    reads = m.request_counts().get("read", 0) - before
    # 1 MiB per READ (the kernel's largest) plus a few smaller ones at the start;
    # with the kernel's default 128 KiB window this took about 100.
    assert reads <= len(data) // 2**20 + 8, reads
