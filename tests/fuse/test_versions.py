"""A replaced dataset through the mount: a `--dataset` mount follows the replacement
without a remount; files and directories of the old version give its bytes or ESTALE,
never another version's."""

from __future__ import annotations

import errno
import os

import pytest

from dlfs import Client
from dlfs.formats import disk_layout
from helpers.mounts import pread_of_a_version
from helpers.trees import write_tree
from helpers.waiting import wait_until

pytestmark = pytest.mark.mount

# The mount checks the version every few seconds (limits.mount_dataset_entry_timeout_s);
# this bounds a hang on a loaded machine, it is not a speed target.
NOTICE_TIMEOUT_S = 120.0
# A sample whose gRPC read, left unconsumed, keeps the old version's extents on disk
# (the daemon's read lease): more than the stream's flow-control windows and socket
# buffers take in (about 20 MiB on loopback here), so the daemon's reply stays inside
# its lease.  The test checks that it did.
LEASE_BYTES = 64 << 20


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
    # Before the mount notices the replace, the root is v1's: a listing read afresh
    # then is ESTALE (v1 is no longer served).
    def shows_v2() -> bool:
        try:
            return (sorted(os.listdir(root)) == ["a.bin", "d", "only-v2.txt"] and
                    os.path.exists(os.path.join(root, "only-v2.txt")) and
                    os.stat(os.path.join(root, "a.bin")).st_size == 3000)
        except OSError as exc:
            assert exc.errno == errno.ESTALE, exc
            return False

    wait_until(shows_v2, "the listing and the names show v2", NOTICE_TIMEOUT_S)
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


def test_names_of_a_replaced_version_never_get_the_new_versions_samples(
        daemon, tmp_path, mount_factory):
    """The replacement adds a file in front, so every later path gets another sample id
    (ids are per version).  A directory of the old version (held open) looks names up
    after the replace: each lookup names the old version, which the daemon no longer
    serves (ESTALE).  Were the new version's entries taken for the old directory's
    nodes, their reads would name the old version with the new version's ids, and the
    old version's extents, mapped by the mount and kept on disk by a read still in
    flight, would answer s/a.bin with s/b.bin's bytes.  A file read before the
    replace gives what the kernel kept of it, then ESTALE once those extents are gone."""
    old = {"held.bin": os.urandom(LEASE_BYTES), "s/a.bin": b"a" * 5000,
           "s/b.bin": b"b" * 5000, "t/c.bin": os.urandom(20000)}
    new = {"held.bin": b"h", "s/0.bin": b"0" * 5000, "s/a.bin": b"A" * 5000,
           "s/b.bin": b"B" * 5000, "t/c.bin": os.urandom(30000)}
    write_tree(tmp_path / "old", old)
    write_tree(tmp_path / "new", new)
    with Client(daemon.address) as client, Client(daemon.address, data_path=False) as holder:
        version = client.ingest(str(tmp_path / "old"), "ds", progress=False).generation
        m = mount_factory(daemon.address)  # extent reads on: the daemon's host
        ds = os.path.join(m.mountpoint, "ds")
        old_dir = os.open(ds, os.O_RDONLY | os.O_DIRECTORY)
        old_c = os.open(os.path.join(ds, "t", "c.bin"), os.O_RDONLY)
        try:
            assert os.pread(old_c, 1 << 20, 0) == old["t/c.bin"]  # maps the old extents
            os.posix_fadvise(old_c, 4096, 0, os.POSIX_FADV_DONTNEED)  # keeps one page
            stream = holder.read_chunks("ds", "held.bin")
            assert next(stream)[0] == 0  # the daemon's reply waits inside its lease
            client.ingest(str(tmp_path / "new"), "ds", replace=True, progress=False)
            old_extents = disk_layout.dataset_dir(daemon.data_dir, version)
            assert os.path.isdir(old_extents), "the held read should keep the old extents"

            try:
                old_a = os.open("s/a.bin", os.O_RDONLY, dir_fd=old_dir)
            except OSError as exc:  # what this mount answers
                assert exc.errno == errno.ESTALE, exc
            else:  # the old file's bytes would do too; never another file's
                pread_of_a_version(old_a, [old["s/a.bin"]], 0, 8192)
                os.close(old_a)
            stream.close()
            holder.close()
            wait_until(lambda: not os.path.isdir(old_extents),
                       "the old version's extents are freed", NOTICE_TIMEOUT_S)
            # The page the kernel kept (a short read, unless it dropped it), then ESTALE.
            assert pread_of_a_version(old_c, [old["t/c.bin"]], 100, 8192) == "estale"
        finally:
            os.close(old_c)
            os.close(old_dir)

    # New lookups through the mount root find the new version (its directory is
    # re-checked every few seconds) with its bytes.
    wait_until(lambda: os.path.exists(os.path.join(ds, "s", "0.bin")),
               "the mount shows the new version", NOTICE_TIMEOUT_S)
    for path, data in new.items():
        with open(os.path.join(ds, path), "rb") as f:
            assert f.read() == data, path
