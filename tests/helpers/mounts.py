"""What a test asks of a real mount: its extent and splice READ counts, and whether the
page cache holds a file's pages (asked without a READ), and a pread of a file whose
dataset was replaced checked against its versions."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os

import numpy as np

from dlfs.tools.launch import MountProcess


def extent_reads(mount: MountProcess) -> dict:
    """What the mount read whole from the daemon's extents so far ({"files": N, "bytes": B})."""
    return mount.request_counts(label="extent reads")


def splice_reads(mount: MountProcess) -> dict:
    """What the mount answered by splice so far ({"reads": N, "bytes": B, "off": why})."""
    return mount.request_counts(label="splice reads")


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def page_cache_holds(path: str) -> bool:
    """Whether the kernel's page cache holds every page of `path` now.

    mincore on a read-only mapping of the file: no byte is read, so a FUSE
    mount gets no READ.  Tests that count the mount's READs use it just
    before a read: some VMs reclaim page-cache pages without memory pressure
    (DAMON `pageout` of regions it saw idle), which can take pages pushed a
    moment ago along with old ones, and that read then reaches the mount.
    """
    size = os.path.getsize(path)
    if size == 0:
        return True
    pages = -(-size // mmap.PAGESIZE)
    vector = np.zeros(pages, dtype=np.uint8)
    with open(path, "rb", buffering=0) as f, \
            mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as mapping:
        view = np.frombuffer(mapping, dtype=np.uint8)
        try:
            if _libc.mincore(view.ctypes.data, size, vector.ctypes.data) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
        finally:
            del view  # the mapping closes only without exported views
    return bool((vector & 1).all())


def pread_of_a_version(fd: int, versions: list[bytes], offset: int, size: int) -> str:
    """pread `size` bytes at `offset` of `fd`, a file of a dataset that was replaced
    (`versions`: the file's bytes in each version it may belong to), and check them:
    "bytes" when they are one version's, "estale" when the read failed with ESTALE.

    A short read (the kernel hands over the pages it holds and stops at the first
    whose READ failed) is read on from where it stopped until it has them all or
    fails with ESTALE: the pages the mount still holds of an old file may answer
    where the daemon no longer does.  Fails the test on anything else: bytes of no
    version or of several, another error, the end of the file before the version's
    (the kernel takes a short READ reply for the end of the file).
    """
    wanted = [data[offset:offset + size] for data in versions]
    got = b""
    while True:
        try:
            piece = os.pread(fd, size - len(got), offset + len(got))
        except OSError as exc:
            assert exc.errno == errno.ESTALE, exc
            return "estale"
        got += piece
        wanted = [want for want in wanted if want.startswith(got)]
        assert wanted, f"bytes at {offset}..{offset + len(got)} that no version has"
        if got in wanted:
            return "bytes"
        assert piece, f"the file ends at {offset + len(got)}, before its version does"
