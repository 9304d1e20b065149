"""A full data dir (a real tmpfs of a few MiB): clear error, nothing kept, still serving."""

from __future__ import annotations

import os
import re
import subprocess

import numpy as np
import pytest

import dlfs
from helpers.cli_advice import run_as_printed, run_dlfs, the_command
from helpers.daemons import read_dataset
from helpers.trees import write_tree
from dlfs import Client
from dlfs.client.cluster.placement import place
from helpers.small_disks import ext4_disk, extent_dirs, tree_disk_bytes, used_bytes


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


@pytest.mark.parametrize("error, via, resumable", [
    ("EIO", "datapath", True), ("EIO", "datapath", False), ("EIO", "grpc", True),
    ("EIO", "grpc", False), ("EDQUOT", "datapath", True), ("EDQUOT", "grpc", False)])
def test_a_disk_error_mid_ingest_is_a_typed_error_and_leaves_nothing(daemon_factory, tmp_path,
                                                                     error, via, resumable):
    """EIO (or EDQUOT, a quota: full for this user) at an extent write (the fault hook;
    before the first checkpoint): the client gets StorageFailed (StorageFull) saying
    the ingest was discarded, over both front doors (the data path took the disk's
    OSError for its socket's and closed the connection without a word), and nothing
    of the ingest stays."""
    daemon = daemon_factory(start=False)
    daemon.extra_env = {"DLFS_FAULT": f"write:40:{error}"}
    daemon.start()
    files = big_source(tmp_path / "src", 100, 100_000)
    expected = dlfs.StorageFailed if error == "EIO" else dlfs.StorageFull
    with Client(daemon.address) as client:
        with pytest.raises(expected) as caught:
            client.ingest(str(tmp_path / "src"), "ds", resumable=resumable, via=via)
        message = caught.value.message
        if error == "EIO":
            assert "the daemon's disk failed while writing dataset 'ds'" in message, message
            assert "(EIO)" in message and "dmesg" in message
        else:
            assert message.startswith("no space left on the data dir while writing dataset "
                                      "'ds'"), message
        assert message.endswith("the ingest was discarded: nothing of it takes space on the "
                                "data dir"), message
        assert "fault injected: write #40" in daemon.log()
        assert extent_dirs(daemon.data_dir) == []
        assert client.dataset_infos() == []
        client.ingest(str(tmp_path / "src"), "ds", resumable=resumable, via=via)  # fired once
        assert read_dataset(client, "ds") == files


PARKED = re.compile(r"the ingest is parked with ([\d,]+) files \(([\d,]+) bytes\) durable, "
                    r"which take ([\d,]+) bytes of the data dir")


def test_a_full_disk_parks_the_durable_files_and_each_piece_of_advice_works(daemon_factory,
                                                                            tmp_path):
    """Checkpoints every 4 MiB: the ingest that fills the disk keeps what its checkpoints
    made durable, the error says how much and how to free it, and every command it
    prints, run as printed, does what it says (a restart in between changes nothing)."""
    with ext4_disk(tmp_path / "disk", DISK_MIB) as disk:
        daemon = daemon_factory(data_dir=str(disk / "data"),
                                extra_args=["--ingest-checkpoint-bytes", str(4 << 20)])
        big_source(tmp_path / "filler", 20, 1_000_000, seed=4)
        big = big_source(tmp_path / "big", 30, 1_000_000, seed=5)
        assert run_dlfs(daemon.address, ["ingest", str(tmp_path / "filler"), "filler",
                                         "--progress", "none"]).returncode == 0
        command = ["ingest", str(tmp_path / "big"), "big", "--progress", "none"]
        failed = run_dlfs(daemon.address, command)
        assert failed.returncode == 1
        message = failed.stderr
        assert message.startswith("dlfs: StorageFull: no space left on the data dir while "
                                  "writing dataset 'big'"), message
        parked = PARKED.search(message)
        assert parked, message
        files, data_bytes, held = (int(g.replace(",", "")) for g in parked.groups())
        assert files >= 4 and data_bytes == files * 1_000_000
        [big_dir] = set(extent_dirs(daemon.data_dir)) - {extent_dirs(daemon.data_dir)[0]}
        on_disk = tree_disk_bytes(os.path.join(daemon.data_dir, "extents", big_dir))
        assert on_disk == held  # the extents were cut where the checkpoint ends
        assert data_bytes <= held < data_bytes + (1 << 20)
        daemon.restart()  # parked, with the same files and the same space
        assert tree_disk_bytes(os.path.join(daemon.data_dir, "extents", big_dir)) == held
        listed = run_as_printed(daemon.address, the_command(message, "dlfs datasets"))
        assert listed.returncode == 0
        assert listed.stdout.splitlines()[0].startswith(f"big\t{files} samples")
        assert "ingest broke off" in listed.stdout.splitlines()[0]
        assert listed.stdout.splitlines()[1].startswith("filler\t20 samples")
        # "`dlfs rm NAME` deletes one": NAME is the user's to choose.
        freed = run_as_printed(daemon.address,
                               the_command(message, "dlfs rm").replace("NAME", "filler"))
        assert freed.returncode == 0 and freed.stdout.startswith("removed filler: 20 samples")
        # "run the same `dlfs ingest` command with --resume"
        resumed = run_dlfs(daemon.address, command + ["--resume"])
        assert resumed.returncode == 0, resumed.stderr
        assert f"resumed after {files} files" in resumed.stdout
        with Client(daemon.address) as client:
            assert read_dataset(client, "big") == big

        # Again, and this time `dlfs discard big2` as printed gives the space back.
        before, kept = used_bytes(disk), extent_dirs(daemon.data_dir)
        big_source(tmp_path / "big2", 30, 1_000_000, seed=6)
        failed = run_dlfs(daemon.address, ["ingest", str(tmp_path / "big2"), "big2",
                                           "--progress", "none"])
        assert failed.returncode == 1 and PARKED.search(failed.stderr), failed.stderr
        discard = the_command(failed.stderr, "dlfs discard")
        [listed] = [line for line in run_dlfs(daemon.address, ["datasets"]).stdout.splitlines()
                    if line.startswith("big2\t")]
        # The listing says the same, naming the daemon it asked.
        assert the_command(listed, "dlfs discard") == \
            f"dlfs --server {daemon.address} discard big2"
        ended = run_as_printed(daemon.address, discard)
        assert ended.returncode == 0, ended.stderr
        assert ended.stdout.startswith("discarded the parked ingest of big2")
        assert extent_dirs(daemon.data_dir) == kept
        assert used_bytes(disk) - before < 1 << 20
        daemon.restart()
        assert extent_dirs(daemon.data_dir) == kept
        with Client(daemon.address) as client:
            assert [i.name for i in client.dataset_infos()] == ["big"]
            assert read_dataset(client, "big") == big


def striped_source(root, name: str, members: list[str], per_member: int) -> dict[str, bytes]:
    """A tree of 1 MB files that a striped ingest as `name` over `members` (one replica)
    places `per_member` on each member."""
    rng = np.random.default_rng(8)
    counts, tree, i = [0] * len(members), {}, 0
    while min(counts) < per_member:
        path = f"f{i:05d}.bin"
        i += 1
        holder = int(place(name, [path], members, 1)[0][0])
        if counts[holder] < per_member:
            counts[holder] += 1
            tree[path] = rng.bytes(1_000_000)
    write_tree(root, tree)
    return tree


def test_a_full_member_of_a_striped_ingest(cluster, daemon_factory, tmp_path):
    """A striped ingest whose first member's disk fills: StorageFull names that member,
    its space and the other member's are accounted for (nothing kept without
    --resumable; with it, nothing durable on the full member, the other's part
    kept for the resume), and the advice, run as printed, completes the ingest."""
    with ext4_disk(tmp_path / "disk", DISK_MIB) as disk:
        full = daemon_factory(data_dir=str(disk / "data"), extra_args=cluster.args())
        other = daemon_factory(extra_args=cluster.args())
        servers = cluster.cli()  # the cluster of both, found in etcd
        big_source(tmp_path / "filler", 20, 1_000_000, seed=7)
        assert run_dlfs(full.address, ["ingest", str(tmp_path / "filler"), "filler",
                                       "--progress", "none"]).returncode == 0
        # 36 MB on each member: more than the full disk has left (about 26 MB), less than
        # it has once the filler is removed (about 46 MB).  Placement hashes the members'
        # addresses, so the names are picked for these two.
        source = striped_source(tmp_path / "src", "ds", [full.address, other.address], 36)
        kept = (extent_dirs(full.data_dir), extent_dirs(other.data_dir))
        before = used_bytes(disk)
        command = ["ingest", str(tmp_path / "src"), "ds", "--progress", "none"]

        failed = run_dlfs(servers, command + ["--no-resumable"])
        assert failed.returncode == 1
        assert failed.stderr.startswith(f"dlfs: StorageFull: ingest into {full.address} "
                                        "failed, nothing was kept: no space left on the data "
                                        "dir while writing dataset 'ds'"), failed.stderr
        assert (extent_dirs(full.data_dir), extent_dirs(other.data_dir)) == kept
        assert used_bytes(disk) - before < 1 << 20

        failed = run_dlfs(servers, command)  # resumable, the default
        assert failed.returncode == 1
        message = failed.stderr
        assert message.startswith(f"dlfs: StorageFull: ingest into {full.address} failed: no "
                                  "space left on the data dir"), message
        assert "the ingest was discarded: nothing of it takes space" in message
        assert extent_dirs(full.data_dir) == kept[0]
        assert used_bytes(disk) - before < 1 << 20
        # The full member's own advice: its one-daemon dataset, removed there.
        freed = run_as_printed(full.address,
                               the_command(message, "dlfs rm").replace("NAME", "filler"))
        assert freed.returncode == 0, freed.stderr
        resumed = run_dlfs(servers, command + ["--resume"])
        assert resumed.returncode == 0, resumed.stderr
        with cluster.client() as client:
            assert read_dataset(client, "ds") == source
