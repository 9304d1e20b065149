"""Fixtures of the read tests: real extent files in the page cache, a socket pair, and
ExtentMaps closed at teardown."""

from __future__ import annotations

import os
import socket
import time

import numpy as np
import pytest

from dlfs.formats.disk_layout import encode_header
from dlfs.server.core.extents import ExtentFiles, ExtentStore
from dlfs.server.read.mapped_sends import ExtentMaps


@pytest.fixture
def extents(tmp_path):
    """Two extent files of dataset 1, random bytes after the header, read into the cache."""
    store = ExtentStore(str(tmp_path))
    os.makedirs(os.path.dirname(store.extent_path(1, 0)))
    rng = np.random.default_rng(3)
    bodies = {}
    for extent_no in (0, 1):
        bodies[extent_no] = rng.bytes(300_000)
        with open(store.extent_path(1, extent_no), "wb") as f:
            f.write(encode_header(1, extent_no, time.time_ns()) + bodies[extent_no])
            f.flush()
            os.fsync(f.fileno())  # written back: DONTNEED can drop its pages
        with open(store.extent_path(1, extent_no), "rb") as f:
            f.read()
    files = ExtentFiles(store)
    yield store, files, bodies
    files.close()


@pytest.fixture
def wire():
    """Both ends of a connected socket pair, closed at teardown."""
    here, there = socket.socketpair()
    yield here, there
    here.close()
    there.close()


@pytest.fixture
def make_maps():
    """ExtentMaps(files, ...) that are closed at teardown."""
    made: list[ExtentMaps] = []

    def make(files, **options) -> ExtentMaps:
        made.append(ExtentMaps(files, **options))
        return made[-1]

    yield make
    for maps in made:
        maps.close()
