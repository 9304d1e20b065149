"""Whether the page cache holds a file's bytes, asked without reading them.

A 1-byte `preadv(RWF_NOWAIT)` probe is no good for this: on a miss the
kernel still starts read-ahead of the probed page before it answers EAGAIN
(Linux 6.18 here), so the probe itself fills the cache, and a later probe
(or the same one, when the device answers fast) says "cached".  cachestat(2)
counts cached pages of a range and reads nothing.
"""

from __future__ import annotations

import os

import numpy as np

from dlfs.server.read import sendfiles


def cached(path: str, offset: int, length: int = 1) -> bool:
    """Whether every page of `length` bytes at `offset` of `path` is cached."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return sendfiles.all_cached(np.array([fd]), np.array([offset]), np.array([length]))
    finally:
        os.close(fd)
