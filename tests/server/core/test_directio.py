"""O_DIRECT appends to extents: any pattern of writes and flushes reads back exactly."""

from __future__ import annotations

import errno
import os
import random

import pytest

from dlfs.server.core.directio import DirectAppender, open_appender
from helpers.small_disks import ext4_disk, free_bytes


def test_writes_and_flushes_in_any_pattern_read_back_exactly(tmp_path):
    rng = random.Random(1)
    for trial in range(30):
        path = str(tmp_path / f"extent{trial}")
        appender = open_appender(path, 16384 * (1 + trial % 3))
        if not isinstance(appender, DirectAppender):
            pytest.skip("this file system does not take O_DIRECT")
        expected = bytearray()
        for _ in range(rng.randint(1, 60)):
            chunk = os.urandom(rng.choice([0, 1, 100, 4095, 4096, 5000, 20000, 70000]))
            appender.write(chunk)
            expected += chunk
            if rng.random() < 0.2:
                appender.flush()
                with open(path, "rb") as f:
                    assert f.read() == expected
        appender.flush()
        appender.close()
        with open(path, "rb") as f:
            assert f.read() == expected


def test_a_file_system_without_o_direct_gets_a_buffered_file(tmp_path):
    shm = "/dev/shm"
    if not os.path.isdir(shm):
        pytest.skip("no /dev/shm")
    path = os.path.join(shm, f"dlfs-test-{os.getpid()}")
    try:
        appender = open_appender(path, 16384)
        appender.write(b"abc" * 10000)
        appender.flush()
        appender.close()
        with open(path, "rb") as f:
            assert f.read() == b"abc" * 10000
    finally:
        os.unlink(path)


def fill(disk, leave_bytes: int) -> None:
    """Take the free space of the file system at `disk` down to about `leave_bytes`."""
    with open(os.path.join(disk, "filler"), "wb") as f:
        while free_bytes(disk) > leave_bytes + (1 << 20):
            f.write(b"\0" * (1 << 20))
            f.flush()
            os.fsync(f.fileno())
        f.write(b"\0" * max(0, free_bytes(disk) - leave_bytes))
        os.fsync(f.fileno())


def test_a_failed_flush_breaks_the_appender_and_close_never_raises(tmp_path):
    """A full disk at flush: the write's traceback used to keep a slice of the buffer
    alive, and close() then raised BufferError (an ingest's cleanup died of it)."""
    with ext4_disk(tmp_path / "disk", 16) as disk:
        fill(disk, 1 << 20)
        appender = open_appender(str(disk / "extent"), 4 << 20)
        assert isinstance(appender, DirectAppender)  # ext4 takes O_DIRECT
        fd = appender.fileno()
        appender.write(os.urandom(3 << 20))  # stays in the buffer
        with pytest.raises(OSError) as caught:  # kept alive, traceback and all
            appender.flush()
        assert caught.value.errno == errno.ENOSPC
        with pytest.raises(OSError, match="an earlier write to this extent failed"):
            appender.write(b"more")  # would follow a hole
        with pytest.raises(OSError, match="an earlier write to this extent failed"):
            appender.flush()
        appender.close()
        appender.close()  # idempotent
        with pytest.raises(OSError) as closed:
            os.fstat(fd)
        assert closed.value.errno == errno.EBADF


def test_a_failed_write_behind_breaks_the_appender(tmp_path):
    """A full disk met by the writer thread: the buffer it held is lost, so every later
    write and flush refuses (they would leave a hole a checkpoint could claim)."""
    with ext4_disk(tmp_path / "disk", 16) as disk:
        fill(disk, 2 << 20)
        appender = open_appender(str(disk / "extent"), 1 << 20)
        assert isinstance(appender, DirectAppender)  # ext4 takes O_DIRECT
        with pytest.raises(OSError) as caught:
            for _ in range(16):  # 16 MiB into 2 MiB of room
                appender.write(os.urandom(1 << 20))
            appender.flush()
        assert caught.value.errno == errno.ENOSPC
        with pytest.raises(OSError, match="an earlier write to this extent failed"):
            appender.flush()
        appender.close()
