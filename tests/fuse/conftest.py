"""Fixtures of the FUSE tests (`mount_factory`, in tests/conftest.py, starts ``python -m dlfs.fuse.mount_cli ADDR MNT --foreground`` as
a user would under systemd (`dlfs.tools.launch.MountProcess`), returns once the
mount answers, and at teardown unmounts with ``fusermount3 -u`` (lazily if
busy) and reaps the process, even when the test failed.
"""

from __future__ import annotations

import pytest



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
