"""A full data dir (a real tmpfs of a few MiB): clear error, nothing kept, still serving."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

import dlfs
from conftest import write_tree
from dlfs import Client


@pytest.fixture
def tiny_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mountpoint)], check=True)
    yield mountpoint
    subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def test_disk_full_during_ingest(daemon_factory, tiny_fs, tmp_path):
    daemon = daemon_factory(data_dir=str(tiny_fs / "data"))
    rng = np.random.default_rng(0)
    small = {f"s{i}": rng.bytes(1000) for i in range(10)}
    big = {f"b{i:03d}": rng.bytes(100_000) for i in range(100)}  # 10 MB > 6 MiB
    write_tree(tmp_path / "small", small)
    write_tree(tmp_path / "big", big)
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "small"), "small")
        with pytest.raises(dlfs.StorageFull, match="no space left on the data dir"):
            client.ingest(str(tmp_path / "big"), "big")
        assert client.datasets() == ["small"]
        assert [bytes(s) for s in client.get_batch(sorted(small), dataset="small")] == \
               [small[k] for k in sorted(small)]
        # The space of the failed ingest was given back: a smaller ingest now fits.
        half = {k: big[k] for k in sorted(big)[:30]}
        write_tree(tmp_path / "half", half)
        assert client.ingest(str(tmp_path / "half"), "half").samples == 30
    daemon.restart()
    with Client(daemon.address) as client:
        assert client.datasets() == ["half", "small"]
