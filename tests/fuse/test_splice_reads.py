"""Large files of a co-located mount answered from the daemon's extent pages by splice
(fuse/splicereads.py), against a real daemon and real mounts: the bytes, the daemon
left out of it, a replaced dataset, the switch."""

from __future__ import annotations

import errno
import hashlib
import os

import numpy as np
import pytest

from helpers.trees import write_tree
from dlfs import Client
from helpers.mounts import extent_reads, splice_reads

pytestmark = pytest.mark.mount

MiB = 1 << 20


@pytest.fixture
def large_tree(tmp_path):
    rng = np.random.default_rng(5)
    # Sizes that do not fall on pages or blocks; one under the whole-file limit.
    files = {"vol/a.npz": rng.bytes(23 * MiB + 123), "vol/b.npz": rng.bytes(9 * MiB + 4097),
             "small.jpg": rng.bytes(110_000)}
    write_tree(tmp_path / "src", files)
    return tmp_path / "src", files


def read_all(path: str, chunk: int = MiB) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return b"".join(iter(lambda: f.read(chunk), b""))


def test_large_files_come_from_the_extents_and_the_daemon_sends_nothing(
        daemon, mount_factory, large_tree, splice_pipes):
    src, files = large_tree
    with Client(daemon.address) as client:
        client.ingest(str(src), "ds")
    mount = mount_factory(daemon.address, "--dataset", "ds")
    for name in ("vol/a.npz", "vol/b.npz"):
        assert hashlib.sha256(read_all(os.path.join(mount.mountpoint, name))).digest() == \
            hashlib.sha256(files[name]).digest()
    # Random reads of parts straddling blocks and pages, through a fresh mount.
    fresh = mount_factory(daemon.address, "--dataset", "ds")
    fd = os.open(os.path.join(fresh.mountpoint, "vol", "a.npz"), os.O_RDONLY)
    try:
        for offset in (5 * MiB - 3, 123, 22 * MiB + 77, 23 * MiB + 100):
            assert os.pread(fd, 2 * MiB, offset) == files["vol/a.npz"][offset:offset + 2 * MiB]
    finally:
        os.close(fd)
    assert read_all(os.path.join(mount.mountpoint, "small.jpg")) == files["small.jpg"]
    answered = splice_reads(mount)
    assert answered["off"] == "" and answered["reads"] >= 32
    # Every byte came from the extent pages by splice: as READ replies, or stored
    # ahead of the reader by the page push, which starts after the first read and
    # can overtake the reader on b.npz (CI's machine: 232 KiB of it, once).
    total = len(files["vol/a.npz"]) + len(files["vol/b.npz"])
    assert answered["bytes"] <= total
    assert answered["bytes"] + answered["stored_bytes"] >= total, answered
    # No READ went to the daemon (the page push, which fetches on its own, aside).
    assert mount.request_counts(label="daemon calls").get("read_chunks", 0) == 0
    assert splice_reads(fresh)["reads"] >= 4


def test_an_open_file_of_a_replaced_dataset_is_stale_not_mixed(
        daemon, mount_factory, large_tree, splice_pipes, tmp_path):
    src, files = large_tree
    with Client(daemon.address) as client:
        client.ingest(str(src), "ds")
        mount = mount_factory(daemon.address, "--dataset", "ds")
        fd = os.open(os.path.join(mount.mountpoint, "vol", "a.npz"), os.O_RDONLY)
        try:
            assert os.pread(fd, MiB, 0) == files["vol/a.npz"][:MiB]
            write_tree(tmp_path / "v2", {"vol/a.npz": b"v2" * (12 * MiB)})
            client.ingest(str(tmp_path / "v2"), "ds", replace=True)
            # Bytes not yet read: from the old version or ESTALE, never the new one's.
            try:
                got = os.pread(fd, MiB, 20 * MiB)
            except OSError as exc:
                assert exc.errno == errno.ESTALE
            else:
                assert got == files["vol/a.npz"][20 * MiB:21 * MiB]
        finally:
            os.close(fd)


def test_splice_off_reads_parts_of_the_extents(daemon, mount_factory, large_tree,
                                               splice_pipes):
    """Without splice (`--splice off`, or no 2 MiB pipes) a co-located mount still reads
    large files from the extents: block-checked views copied into the kernel's page
    cache; with `--extent-reads off` they come through the daemon."""
    src, files = large_tree
    with Client(daemon.address) as client:
        client.ingest(str(src), "ds")
    mount = mount_factory(daemon.address, "--dataset", "ds", "--splice", "off")
    assert read_all(os.path.join(mount.mountpoint, "vol", "b.npz")) == files["vol/b.npz"]
    fd = os.open(os.path.join(mount.mountpoint, "vol", "a.npz"), os.O_RDONLY)
    try:
        for offset in (5 * MiB - 3, 22 * MiB + 77):
            assert os.pread(fd, MiB, offset) == files["vol/a.npz"][offset:offset + MiB]
    finally:
        os.close(fd)
    calls = mount.request_counts(label="daemon calls")
    assert calls.get("read_chunks", 0) == calls.get("read", 0) == 0, calls
    assert extent_reads(mount)["range_bytes"] >= len(files["vol/b.npz"])
    assert "splice reads:" not in mount.log()  # the path does not exist in this mount
    through = mount_factory(daemon.address, "--dataset", "ds", "--extent-reads", "off")
    assert read_all(os.path.join(through.mountpoint, "vol", "b.npz")) == files["vol/b.npz"]
    assert through.request_counts(label="daemon calls").get("read_chunks", 0) > 0


def test_a_refused_splice_turns_the_path_off_and_reads_go_on(
        daemon, mount_factory, large_tree, splice_pipes, monkeypatch):
    """splice(2) refused after the start-up check (a seccomp filter added later; the
    mount's fault hook): that READ and all later ones are read from the extents and
    copied, as without splice."""
    src, files = large_tree
    with Client(daemon.address) as client:
        client.ingest(str(src), "ds")
    monkeypatch.setenv("DLFS_MOUNT_SPLICE_FAULT", "EPERM")
    mount = mount_factory(daemon.address, "--dataset", "ds")
    assert read_all(os.path.join(mount.mountpoint, "vol", "a.npz")) == files["vol/a.npz"]
    answered = splice_reads(mount)
    # READs already past the check when the fault fired may still have been spliced.
    assert answered["reads"] <= 16 and "Operation not permitted" in answered["off"]
    assert "fault injected" in mount.log() and "without splice from now on" in mount.log()
    assert mount.request_counts(label="daemon calls").get("read_chunks", 0) == 0
    assert extent_reads(mount)["range_bytes"] > 0
