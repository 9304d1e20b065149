"""Samples written to real extent files through ExtentWriter (dataset 7), and those
files' pages dropped from the page cache."""

from __future__ import annotations

import os

import crc32c
import numpy as np

from dlfs.server.core.extents import ExtentStore, ExtentWriter


def write_samples(root, sizes, extent_bytes_max=64 * 1024, seed=0):
    """Write samples of `sizes` through ExtentWriter; return arrays and contents."""
    rng = np.random.default_rng(seed)
    store = ExtentStore(str(root))
    writer = ExtentWriter(store, 7, 0, extent_bytes_max)
    contents, ext, off, crc = [], [], [], []
    for size in sizes:
        data = rng.bytes(size)
        e, o = writer.begin_sample(size)
        for start in range(0, size, 1000):
            writer.write(data[start:start + 1000])
        writer.end_sample()
        contents.append(data)
        ext.append(e)
        off.append(o)
        crc.append(crc32c.crc32c(data))
    writer.sync()
    writer.close()
    arrays = (np.array(ext, np.uint32), np.array(off, np.uint64),
              np.array(sizes, np.uint64), np.array(crc, np.uint32))
    return store, arrays, contents


def drop_cached_pages(store: ExtentStore, extent_nos) -> None:
    """Evict dataset 7's extents `extent_nos` from the page cache (written by
    `write_samples`, which syncs them, so DONTNEED drops them)."""
    for extent_no in sorted(set(int(e) for e in extent_nos)):
        with open(store.extent_path(7, extent_no), "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
