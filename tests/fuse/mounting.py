"""Helpers for the FUSE tests: real `dlfs-mount` processes on real daemons.

Test modules import `mount_factory` (a fixture) and `requires_fuse` from
here; a conftest.py in this directory would shadow tests/conftest.py's
helpers (`from conftest import write_tree`), hence a plain module.

`mount_factory` starts ``python -m dlfs.fuse.mount_cli ADDR MNT --foreground`` as
a user would under systemd (`dlfs.tools.launch.MountProcess`), returns once the
mount answers, and at teardown unmounts with ``fusermount3 -u`` (lazily if
busy) and reaps the process, even when the test failed.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os

import numpy as np
import pytest

from conftest import requires_fuse  # noqa: F401 - the FUSE tests import it from here
from dlfs.tools.launch import MountProcess


@pytest.fixture
def mount_factory(tmp_path):
    """mount(address, *args) -> MountProcess: a foreground mount on a fresh directory."""
    mounts: list[MountProcess] = []

    def mount(address: str, *args: str) -> MountProcess:
        index = len(mounts)
        m = MountProcess(address, str(tmp_path / f"mnt{index}"),
                         str(tmp_path / f"mount{index}.log"), list(args))
        mounts.append(m)
        return m.start()

    yield mount
    for m in mounts:
        m.unmount()


PIPE_MAX_SIZE = "/proc/sys/fs/pipe-max-size"


@pytest.fixture
def splice_pipes():
    """Pipes big enough for the mount's splice READs (fuse/splicereads.py): raises
    fs.pipe-max-size to 2 MiB for the test where it is lower (as root), restores it
    after; skips where that is not allowed."""
    from dlfs.fuse import splicereads

    with open(PIPE_MAX_SIZE) as f:
        before = f.read().strip()
    raised = False
    if splicereads.pipe_bytes_available():
        try:
            with open(PIPE_MAX_SIZE, "w") as f:
                f.write(str(2 << 20))
            raised = True
        except OSError as exc:
            pytest.skip(f"splice READs need pipes of 2 MiB, and {PIPE_MAX_SIZE} cannot be "
                        f"raised here ({exc.strerror})")
    yield
    if raised:
        with open(PIPE_MAX_SIZE, "w") as f:
            f.write(before)


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
