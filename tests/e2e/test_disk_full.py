"""A full data dir (a real tmpfs of a few MiB): clear error, nothing kept, still serving."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

import dlfs
from conftest import read_dataset, write_tree
from dlfs import Client
from small_disks import ext4_disk, extent_dirs, used_bytes


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


# --- a full disk under the O_DIRECT appender, and disk errors (issue 37, item 4) -------

DISK_MIB = 48  # the ext4 disk of these tests: a few MB more than the sources below


def big_source(root, files: int, size: int, seed: int = 1) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    tree = {f"f{i:04d}.bin": rng.bytes(size) for i in range(files)}
    write_tree(root, tree)
    return tree


@pytest.mark.parametrize("via", ["datapath", "grpc"])
def test_a_full_disk_during_a_resumable_ingest_gives_its_space_back(daemon_factory, tmp_path,
                                                                     via):
    """The default, resumable ingest on a disk that fills before its first checkpoint:
    StorageFull reaches the client (it used to see a broken pipe and advice to
    --resume: discarding the ingest raised BufferError from the O_DIRECT
    appender and killed the connection's thread), and the space is free again,
    also after a restart (it used to stay, as a parked ingest of 0 files)."""
    with ext4_disk(tmp_path / "disk", DISK_MIB) as disk:
        daemon = daemon_factory(data_dir=str(disk / "data"))
        small = big_source(tmp_path / "small", 10, 1000)
        big_source(tmp_path / "big", 60, 1_000_000, seed=2)  # 60 MB > 48 MiB
        with Client(daemon.address) as client:
            client.ingest(str(tmp_path / "small"), "small")
            baseline = used_bytes(disk)
            kept = extent_dirs(daemon.data_dir)
            with pytest.raises(dlfs.StorageFull) as caught:
                client.ingest(str(tmp_path / "big"), "big", resumable=True, via=via)
            message = caught.value.message
            assert message.startswith("no space left on the data dir while writing dataset "
                                      "'big'"), message
            assert message.endswith("the ingest was discarded: nothing of it takes space on "
                                    "the data dir"), message
            assert "--resume" not in message
            assert extent_dirs(daemon.data_dir) == kept
            assert used_bytes(disk) - baseline < 1 << 20  # a few catalog records
            assert client.datasets() == ["small"]
            assert [i.name for i in client.dataset_infos()] == ["small"]  # nothing parked
        daemon.restart()
        assert extent_dirs(daemon.data_dir) == kept
        assert used_bytes(disk) - baseline < 1 << 20
        with Client(daemon.address) as client:
            assert [i.name for i in client.dataset_infos()] == ["small"]
            assert read_dataset(client, "small") == small
            half = big_source(tmp_path / "half", 30, 1_000_000, seed=3)
            client.ingest(str(tmp_path / "half"), "half", resumable=True, via=via)
            assert read_dataset(client, "half") == half


@pytest.mark.parametrize("via", ["datapath", "grpc"])
@pytest.mark.parametrize("resumable", [True, False])
def test_a_disk_error_mid_ingest_is_a_typed_error_and_leaves_nothing(daemon_factory, tmp_path,
                                                                     via, resumable):
    """EIO at an extent write (the fault hook; before the first checkpoint): the
    client gets StorageFailed saying the ingest was discarded, over both front
    doors (the data path took the disk's OSError for its socket's and closed the
    connection without a word), and nothing of the ingest stays."""
    daemon = daemon_factory(start=False)
    daemon.extra_env = {"DLFS_FAULT": "write:40:EIO"}
    daemon.start()
    files = big_source(tmp_path / "src", 100, 100_000)
    with Client(daemon.address) as client:
        with pytest.raises(dlfs.StorageFailed) as caught:
            client.ingest(str(tmp_path / "src"), "ds", resumable=resumable, via=via)
        message = caught.value.message
        assert "the daemon's disk failed while writing dataset 'ds'" in message, message
        assert "(EIO)" in message and "dmesg" in message
        assert message.endswith("the ingest was discarded: nothing of it takes space on the "
                                "data dir"), message
        assert "fault injected: write #40" in daemon.log()
        assert extent_dirs(daemon.data_dir) == []
        assert client.dataset_infos() == []
        client.ingest(str(tmp_path / "src"), "ds", resumable=resumable, via=via)  # fired once
        assert read_dataset(client, "ds") == files
