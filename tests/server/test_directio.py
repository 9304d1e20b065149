"""O_DIRECT appends to extents: any pattern of writes and flushes reads back exactly."""

from __future__ import annotations

import os
import random

import pytest

from dlfs.server.core.directio import DirectAppender, open_appender


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
