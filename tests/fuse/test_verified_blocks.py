"""A byte flipped on disk inside a large file: the mount answers EIO for the
damaged block and keeps serving the others (block CRC32Cs, dlfs.formats.block_crcs)."""

from __future__ import annotations

import errno
import os

import pytest

from helpers.trees import write_tree
from helpers.damage import BAD_BLOCK, BIG, MiB, big_tree, flip_byte
from dlfs import Client
from helpers.mounts import splice_reads

pytestmark = pytest.mark.mount


@pytest.mark.parametrize("extent_reads", ["off", "auto"], ids=["through-daemon", "extents"])
def test_a_damaged_block_is_eio_through_the_mount_and_other_blocks_read(
        daemon, mount_factory, tmp_path, extent_reads, request):
    """Files through the daemon's data path, and (co-located, `--extent-reads auto`)
    from the extents: large ones spliced from their pages, checked by the mount
    against the blocks' CRC32Cs, the others read whole and checked whole."""
    if extent_reads == "auto":
        request.getfixturevalue("splice_pipes")
    files = big_tree(tmp_path / "src")
    write_tree(tmp_path / "src", {"mid.bin": files["big.bin"][:6 * MiB]})  # fetched whole
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")
    flip_byte(daemon, "ds", 0, BAD_BLOCK * MiB + 777)  # big.bin
    flip_byte(daemon, "ds", 1, BAD_BLOCK * MiB + 777)  # mid.bin
    mount = mount_factory(daemon.address, "--dataset", "ds", "--extent-reads", extent_reads)
    good = files["big.bin"]
    path = os.path.join(mount.mountpoint, "big.bin")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 2 * MiB) == good[2 * MiB:2 * MiB + 4096]
        with pytest.raises(OSError) as caught:
            os.pread(fd, 100, BAD_BLOCK * MiB + 700)
        assert caught.value.errno == errno.EIO
        # The blocks after the damaged one, and before it, still read.
        assert os.pread(fd, 8192, 7 * MiB) == good[7 * MiB:7 * MiB + 8192]
        assert os.pread(fd, 100, BIG - 100) == good[BIG - 100:]
        assert os.pread(fd, 4096, 0) == good[:4096]
    finally:
        os.close(fd)
    with open(path, "rb") as f, pytest.raises(OSError) as caught:
        f.read()
    assert caught.value.errno == errno.EIO
    with open(os.path.join(mount.mountpoint, "mid.bin"), "rb") as f, \
            pytest.raises(OSError) as caught:
        f.read()
    assert caught.value.errno == errno.EIO
    with open(os.path.join(mount.mountpoint, "small.bin"), "rb") as f:
        assert f.read() == files["small.bin"]
    # The mount names the damaged sample in its log.  It reads over the data
    # path, where it checks the block CRC32Cs the daemon sends itself (the
    # daemon checks before sending on the gRPC stream only; `dlfs scrub`
    # names the block on the daemon's side).
    assert "'big.bin'" in mount.log() and "checksum mismatch" in mount.log()
    assert "'mid.bin'" in mount.log()
    if extent_reads == "auto":  # the large file's good blocks came from the extent, by splice
        assert splice_reads(mount)["reads"] >= 4
        calls = mount.request_counts(label="daemon calls")
        assert calls.get("read_chunks", 0) == calls.get("read", 0) == 0
