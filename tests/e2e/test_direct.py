"""Co-located direct reads give the same bytes as reads through the daemon."""

from __future__ import annotations

import os
import subprocess
import time

import numpy as np
import pytest

import dlfs
from conftest import write_tree
from dlfs import Client


def test_direct_reads_match_daemon_reads(daemon, tmp_path):
    rng = np.random.default_rng(3)
    tree = {f"c{i % 5}/{i:04d}": rng.bytes(int(rng.integers(0, 9000))) for i in range(400)}
    write_tree(tmp_path / "src", tree)
    with Client(daemon.address) as remote, Client(daemon.address, direct=True) as local:
        remote.ingest(str(tmp_path / "src"), "ds")
        ids = rng.integers(0, len(tree), 1000)
        assert [bytes(s) for s in local.get_batch(ids, dataset="ds")] == \
               [bytes(s) for s in remote.get_batch(ids, dataset="ds")]
        paths = sorted(tree)
        assert bytes(local.get_batch([paths[9]], dataset="ds")[0]) == tree[paths[9]]
        with pytest.raises(dlfs.InvalidArgument, match="sample id 400 is out of range"):
            local.get_batch([400], dataset="ds")
        # A replaced dataset: the direct reader notices its old extents are gone.
        write_tree(tmp_path / "v2", {"only": b"new"})
        remote.ingest(str(tmp_path / "v2"), "ds", replace=True)
        assert bytes(local.get_batch([0], dataset="ds")[0]) == b"new"


def test_direct_reads_refuse_foreign_data_dirs(daemon, tmp_path):
    write_tree(tmp_path / "src", {"a": b"1"})
    with Client(daemon.address) as remote:
        remote.ingest(str(tmp_path / "src"), "ds")
    with open(os.path.join(daemon.data_dir, "daemon-token"), "w") as f:
        f.write("someone else")
    with Client(daemon.address, direct=True) as local:
        with pytest.raises(dlfs.FailedPrecondition, match="belongs to another daemon"):
            local.get_batch([0], dataset="ds")


def resident_bytes(path: str) -> int:
    """Bytes of `path` in the page cache, from util-linux fincore."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip())


def test_prefetch_hints_warm_the_page_cache(daemon, tmp_path):
    rng = np.random.default_rng(4)
    tree = {f"{i:04d}": rng.bytes(64 * 1024) for i in range(64)}
    write_tree(tmp_path / "src", tree)
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")
        ds = client.dataset("ds")
        [dataset_dir] = os.listdir(os.path.join(daemon.data_dir, "extents"))
        extent = os.path.join(daemon.data_dir, "extents", dataset_dir, "000000.ext")
        fd = os.open(extent, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # evict the extent
        finally:
            os.close(fd)
        assert resident_bytes(extent) < 64 * 1024
        assert ds.prefetch(range(0, 64, 2)) is True
        deadline = time.monotonic() + 10
        while resident_bytes(extent) < 32 * 64 * 1024 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert 32 * 64 * 1024 <= resident_bytes(extent) < 48 * 64 * 1024  # hinted half only
        with pytest.raises(dlfs.InvalidArgument, match="out of range"):
            ds.prefetch([64])
        assert [bytes(s) for s in ds.get_batch(range(0, 64, 2))] == \
               [tree[f"{i:04d}"] for i in range(0, 64, 2)]


def test_direct_reads_report_corruption_and_truncation(daemon, tmp_path):
    write_tree(tmp_path / "src", {"a": b"A" * 5000, "b": b"B" * 5000})
    with Client(daemon.address) as remote:
        remote.ingest(str(tmp_path / "src"), "ds")
    [dataset_dir] = os.listdir(os.path.join(daemon.data_dir, "extents"))
    extent = os.path.join(daemon.data_dir, "extents", dataset_dir, "000000.ext")
    with open(extent, "r+b") as f:
        data = f.read()
        f.seek(data.index(b"A" * 5000) + 7)
        f.write(b"x")
    with Client(daemon.address, direct=True) as local:
        with pytest.raises(dlfs.DataCorruption, match="checksum mismatch for sample 0"):
            local.get_batch([0], dataset="ds")
        assert bytes(local.get_batch([0], dataset="ds", verify=False)[0]).count(b"x") == 1
    os.truncate(extent, data.index(b"B" * 5000) + 10)
    with Client(daemon.address, direct=True) as local:
        assert bytes(local.get_batch([0], dataset="ds", verify=False)[0]).count(b"x") == 1
        with pytest.raises(dlfs.DataCorruption, match="is truncated: sample 1"):
            local.get_batch([1], dataset="ds")


@pytest.mark.parametrize("direct", [False, True])
def test_get_batch_carries_a_prefetch_hint(daemon, tmp_path, direct):
    rng = np.random.default_rng(5)
    tree = {f"{i:04d}": rng.bytes(64 * 1024) for i in range(64)}
    write_tree(tmp_path / "src", tree)
    with Client(daemon.address) as remote:
        remote.ingest(str(tmp_path / "src"), "ds", replace=True)
    [dataset_dir] = os.listdir(os.path.join(daemon.data_dir, "extents"))
    extent = os.path.join(daemon.data_dir, "extents", dataset_dir, "000000.ext")
    with Client(daemon.address, direct=direct) as client:
        client.get_batch([0], dataset="ds")
        fd = os.open(extent, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        before = resident_bytes(extent)
        got = client.get_batch([1], dataset="ds", prefetch=range(32, 64))
        assert bytes(got[0]) == tree["0001"]
        deadline = time.monotonic() + 10
        while resident_bytes(extent) < before + 32 * 64 * 1024 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert resident_bytes(extent) >= before + 32 * 64 * 1024
        if direct:  # the co-located reader drops hint ids it does not know
            assert bytes(client.get_batch([1], dataset="ds", prefetch=[64])[0]) == tree["0001"]
        else:
            with pytest.raises(dlfs.InvalidArgument, match="sample id 64 is out of range"):
                client.get_batch([1], dataset="ds", prefetch=[64])
