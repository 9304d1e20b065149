"""Helpers for the FUSE tests: real `dlfs-mount` processes on real daemons.

Test modules import `mount_factory` (a fixture) and `requires_fuse` from
here; a conftest.py in this directory would shadow tests/conftest.py's
helpers (`from conftest import write_tree`), hence a plain module.

`mount_factory` starts ``python -m dlfs.fuse.main ADDR MNT --foreground`` as
a user would under systemd (`dlfs.launch.MountProcess`), returns once the
mount answers, and at teardown unmounts with ``fusermount3 -u`` (lazily if
busy) and reaps the process, even when the test failed.
"""

from __future__ import annotations

import pytest

from conftest import requires_fuse  # noqa: F401 - the FUSE tests import it from here
from dlfs.launch import MountProcess


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
