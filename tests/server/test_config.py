"""ServerConfig defaults that depend on the machine."""

from __future__ import annotations

import os

from dlfs import limits
from dlfs.server.config import ServerConfig, default_reader_threads


def test_reader_threads_default_to_one_per_cpu_within_bounds():
    assert default_reader_threads(1) == limits.reader_threads_default_min
    assert default_reader_threads(limits.reader_threads_default_min + 1) == \
        limits.reader_threads_default_min + 1
    assert default_reader_threads(1024) == limits.reader_threads_default_max
    assert ServerConfig(data_dir="x").reader_threads == default_reader_threads(os.cpu_count())
    assert ServerConfig(data_dir="x", reader_threads=5).reader_threads == 5
