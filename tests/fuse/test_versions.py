"""A `--dataset` mount follows a replacement of its dataset without a remount."""

from __future__ import annotations

import errno
import os

import pytest

from dlfs import Client
from helpers.trees import write_tree
from helpers.waiting import wait_until

pytestmark = pytest.mark.mount

# The mount checks the version every few seconds (limits.mount_dataset_entry_timeout_s);
# this bounds a hang on a loaded machine, it is not a speed target.
NOTICE_TIMEOUT_S = 120.0


def test_a_dataset_mount_follows_a_replacement(daemon, tmp_path, mount_factory):
    write_tree(tmp_path / "v1", {"a.bin": b"1" * 1000, "only-v1.txt": b"old", "d/x.bin": b"x1"})
    write_tree(tmp_path / "v2", {"a.bin": b"2" * 3000, "only-v2.txt": b"new", "d/x.bin": b"x2"})
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "v1"), "ds", progress=False)
        m = mount_factory(daemon.address, "--dataset", "ds")
        root = m.mountpoint
        assert sorted(os.listdir(root)) == ["a.bin", "d", "only-v1.txt"]
        with open(os.path.join(root, "a.bin"), "rb") as f:
            assert f.read() == b"1" * 1000
        held = open(os.path.join(root, "d", "x.bin"), "rb", buffering=0)
        assert held.read() == b"x1"
        assert not os.path.exists(os.path.join(root, "only-v2.txt"))  # a negative entry
        client.ingest(str(tmp_path / "v2"), "ds", replace=True, progress=False)

    # The mount serves v2 first and then has the kernel forget each cached name; in
    # between, a listing read afresh (the kernel's copy of it reclaimed) can show v2
    # while a name not yet forgotten still has v1's attributes (seen once in CI).
    wait_until(lambda: sorted(os.listdir(root)) == ["a.bin", "d", "only-v2.txt"] and
               os.path.exists(os.path.join(root, "only-v2.txt")) and
               os.stat(os.path.join(root, "a.bin")).st_size == 3000,
               "the listing and the names show v2", NOTICE_TIMEOUT_S)
    with open(os.path.join(root, "a.bin"), "rb") as f:
        assert f.read() == b"2" * 3000
    with open(os.path.join(root, "only-v2.txt"), "rb") as f:
        assert f.read() == b"new"
    with open(os.path.join(root, "d", "x.bin"), "rb") as f:
        assert f.read() == b"x2"
    assert not os.path.exists(os.path.join(root, "only-v1.txt"))
    # The file open since before belongs to v1: its cached bytes or ESTALE, never v2's.
    os.posix_fadvise(held.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    held.seek(0)
    try:
        assert held.read() == b"x1"
    except OSError as exc:
        assert exc.errno == errno.ESTALE
    held.close()
    assert "'ds' was replaced" in m.log()
