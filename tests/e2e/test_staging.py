"""Staging from tar archives and WebDataset shards, over real daemons: byte for byte."""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile

import numpy as np
import pytest

import dlfs
from dlfs import Client
from helpers.cli_advice import run_as_printed, run_dlfs, the_command
from helpers.daemons import read_dataset
from helpers.trees import unique_name, write_tree


def cli(address, *args, check=True):
    proc = subprocess.run([sys.executable, "-m", "dlfs.cli", "--server", address, *args],
                          capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def tar_of(path, files: dict[str, bytes], mode="w", prefix="./"):
    with tarfile.open(path, mode) as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(prefix + name)
            info.size, info.mtime, info.mode = len(data), 1_700_000_123, 0o644
            tf.addfile(info, io.BytesIO(data))
    return str(path)


def sample_files(seed: int, n: int, prefix: str = "") -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    return {f"{prefix}{i:06d}.{ext}": rng.bytes(int(rng.integers(0, 300_000)) if ext == "jpg"
                                                 else 2)
            for i in range(n) for ext in ("jpg", "cls")}


@pytest.mark.parametrize("via", ["datapath", "grpc"])
def test_a_tar_round_trips_byte_for_byte(shared_client, tmp_path, via):
    files = sample_files(1, 60, "train/")
    files["train/big.bin"] = os.urandom(3_500_000)  # several pieces
    files["empty.bin"] = b""
    archive = tar_of(tmp_path / "data.tar", files)
    name = unique_name()
    info = shared_client.ingest(archive, name, via=via)
    assert (info.samples, info.bytes) == (len(files), sum(map(len, files.values())))
    assert read_dataset(shared_client, name) == files
    entry = shared_client.stat(name, "train/000001.jpg")
    assert entry.mtime_ns == 1_700_000_123 * 10**9 and entry.permissions == "-rw-r--r--"


@pytest.mark.slow
def test_a_set_of_shards_round_trips_by_list_glob_and_directory(shared_daemon, tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    everything = {}
    for i, mode in enumerate(("w", "w:gz", "w:bz2", "w:xz")):
        files = sample_files(10 + i, 25, f"{i:02d}")
        everything.update(files)
        suffix = {"w": ".tar", "w:gz": ".tar.gz", "w:bz2": ".tar.bz2", "w:xz": ".tar.xz"}[mode]
        tar_of(shards / f"shard-{i:04d}{suffix}", files, mode, prefix="")
    listed = sorted(str(p) for p in shards.iterdir())
    with Client(shared_daemon.address) as client:
        for how, args in (("list", listed), ("glob", [str(shards / "shard-*")]),
                          ("dir", [str(shards), "--archives"])):
            name = unique_name(how)
            out = cli(shared_daemon.address, "ingest", *args, name).stdout
            assert f"ingested {name}: {len(everything)} samples" in out
            got = read_dataset(client, name)
            assert {p: hashlib.sha256(d).digest() for p, d in got.items()} == \
                {p: hashlib.sha256(d).digest() for p, d in everything.items()}
            assert "000003.jpg" in "".join(got) and "000003.cls" in "".join(got)


def test_links_in_archives_follow_the_documented_rule(shared_client, tmp_path):
    path = tmp_path / "links.tar"
    with tarfile.open(path, "w") as tf:
        for name, data in (("a/real.bin", b"real bytes"),):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, kind, target in (("a/hard.bin", tarfile.LNKTYPE, "a/real.bin"),
                                   ("a/soft.bin", tarfile.SYMTYPE, "real.bin")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, target
            tf.addfile(info)
    name = unique_name()
    shared_client.ingest(str(path), name)
    assert read_dataset(shared_client, name) == {"a/real.bin": b"real bytes",
                                             "a/hard.bin": b"real bytes"}
    followed = unique_name()
    shared_client.ingest(str(path), followed, follow_symlinks=True)
    assert read_dataset(shared_client, followed)["a/soft.bin"] == b"real bytes"


@pytest.mark.parametrize("member, message", [
    ("/etc/passwd", "absolute name"),
    ("../escape.bin", "'..' component"),
    ("ok/../../escape.bin", "'..' component"),
])
def test_dangerous_member_names_are_refused_naming_archive_and_member(shared_client, tmp_path,
                                                                      member, message):
    archive = tar_of(tmp_path / "bad.tar", {"fine.bin": b"x", member: b"y"}, prefix="")
    name = unique_name()
    with pytest.raises(dlfs.InvalidArgument, match=message) as error:
        shared_client.ingest(archive, name)
    assert "bad.tar" in error.value.message and member in error.value.message
    assert name not in shared_client.datasets()


def test_non_utf8_member_names_are_refused(shared_client, tmp_path):
    path = tmp_path / "latin1.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT, encoding="latin-1") as tf:
        info = tarfile.TarInfo("caf\xe9.jpg")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(dlfs.InvalidArgument, match="not valid UTF-8"):
        shared_client.ingest(str(path), unique_name())


def test_duplicate_names_are_refused_within_and_across_archives(shared_client, tmp_path):
    one = tar_of(tmp_path / "one.tar", {"a.bin": b"1", "b.bin": b"2"})
    with tarfile.open(one, "a") as tf:  # appended again: tar keeps both copies
        info = tarfile.TarInfo("./a.bin")
        info.size = 3
        tf.addfile(info, io.BytesIO(b"new"))
    with pytest.raises(dlfs.InvalidArgument, match="'a.bin'.*one.tar"):
        shared_client.ingest(one, unique_name())
    two = tar_of(tmp_path / "two.tar", {"b.bin": b"other"})
    three = tar_of(tmp_path / "three.tar", {"c.bin": b"3"})
    with pytest.raises(dlfs.InvalidArgument, match="'b.bin'.*two.tar"):
        shared_client.ingest([three, two, tar_of(tmp_path / "b.tar", {"b.bin": b"x"})],
                             unique_name())


def test_dry_run_lists_taken_and_skipped_with_counts(shared_daemon, tmp_path):
    write_tree(tmp_path / "src", {"a/x.bin": b"12", "a/y.bin": b"345", ".hidden": b"h"})
    os.symlink("a/x.bin", tmp_path / "src" / "link")
    os.mkfifo(tmp_path / "src" / "fifo")
    name = unique_name()
    out = cli(shared_daemon.address, "ingest", "--dry-run", str(tmp_path / "src"), name).stdout
    lines = out.splitlines()
    assert "take\ta/x.bin\t2" in lines and "take\ta/y.bin\t3" in lines
    assert any(line.startswith("skip\thidden\t") for line in lines)
    assert any(line.startswith("skip\tsymlink\t") and "-> a/x.bin" in line for line in lines)
    assert any(line.startswith("skip\tspecial\t") for line in lines)
    assert lines[-1] == (f"would ingest {name}: 2 files, 5 bytes from 1 tree; skipped: "
                         "1 hidden, 1 symlink, 1 special file, 0 symlink loops, 0 unreadable")
    with Client(shared_daemon.address) as client:
        assert name not in client.datasets()


def test_progress_log_reports_rates_and_the_summary_names_them(shared_daemon, tmp_path):
    write_tree(tmp_path / "src", {f"d/{i}.bin": os.urandom(1000) for i in range(50)})
    name = unique_name()
    proc = cli(shared_daemon.address, "ingest", str(tmp_path / "src"), name, "--progress", "bar",
               "--readers", "4")
    final = proc.stderr.strip().split("\r")[-1]
    assert f"ingest {name}:" in final and "files/s" in final and "/s" in final
    assert "100% of" in final
    lines = proc.stdout.splitlines()
    assert lines[0] == f"ingested {name}: 50 samples, 50000 bytes (48.8 KiB)"
    assert lines[1].startswith("sent 50 files, 48.8 KiB in ") and "files/s, 4 readers" in lines[1]


def test_a_striped_ingest_of_shards_uses_the_same_reader(cluster, tmp_path):
    cluster.start(3)
    files = sample_files(5, 40)
    archives = [tar_of(tmp_path / f"s{i}.tar", dict(list(files.items())[i::2])) for i in range(2)]
    everything = {**dict(list(files.items())[0::2]), **dict(list(files.items())[1::2])}
    with cluster.client() as client:
        info = client.ingest(archives, "striped", replicas=2, readers=8)
        assert info.samples == len(everything)
        assert read_dataset(client, "striped") == everything


# --- damaged archives, replace, and the advice given (issue 37, item 5) ----------------

def damage_header(path: str, member_index: int) -> tuple[int, str]:
    """Spoil the checksum of member `member_index`'s header (0-based) in the plain tar
    at `path`; (its byte offset, the name of the member before it)."""
    with tarfile.open(path) as tf:
        members = tf.getmembers()
    at = members[member_index].offset
    with open(path, "r+b") as f:
        f.seek(at + 148)
        f.write(b"0000000\0")
    return at, members[member_index - 1].name


def test_a_damaged_tar_never_replaces_a_dataset_and_the_advice_does_what_it_says(daemon,
                                                                                 tmp_path):
    """A tar whose 4th header of 6 is damaged was ingested as 3 samples (exit 0) and
    replaced a good dataset; the retry was then refused as parked, and the advice
    printed, `dlfs rm NAME`, deleted the live dataset with the parked ingest.
    Now: refused naming the member and offset, the old dataset served whole, and
    every command the messages print is run as printed."""
    old = sample_files(1, 3, "old")  # 6 files
    tar_of(tmp_path / "old.tar", old)
    cli(daemon.address, "ingest", str(tmp_path / "old.tar"), "ds", "--progress", "none")
    rng = np.random.default_rng(2)  # big enough that members before the damage are sent
    new = {f"new{i}.bin": rng.bytes(700_000) for i in range(6)}
    bad = tar_of(tmp_path / "new.tar", new)
    offset, before = damage_header(bad, 3)
    ingest_bad = ["ingest", bad, "ds", "--replace", "--progress", "none"]

    # 1. Refused, naming the member and the offset; the old version is served whole.
    refused = run_dlfs(daemon.address, ingest_bad)
    assert refused.returncode == 1, refused.stdout
    assert f"archive {bad!r} is damaged: the header at byte {offset:,}, after member " \
        f"{before!r}, is not a valid tar header" in refused.stderr, refused.stderr
    with Client(daemon.address) as client:
        assert read_dataset(client, "ds") == old
    # What the files sent before the damage became: parked (the default is resumable).
    parked = re.search(r"the ingest is parked with (\d+) files", refused.stderr)
    assert parked, refused.stderr
    held = int(parked.group(1))
    assert 1 <= held <= 3
    assert the_command(refused.stderr, "dlfs discard") == "dlfs discard ds"

    # 2. "run the same command with --resume", once the archive is repaired.
    tar_of(tmp_path / "new.tar", new)
    resumed = run_dlfs(daemon.address, ingest_bad + ["--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed after {held} files" in resumed.stdout
    with Client(daemon.address) as client:
        assert read_dataset(client, "ds") == new

    # 3. Damaged again: the retry without --resume is refused as parked, and its
    # advice ends the parked ingest only; the dataset stays whole.
    offset, before = damage_header(bad, 3)
    assert run_dlfs(daemon.address, ingest_bad).returncode == 1
    good_again = tar_of(tmp_path / "again.tar", old)
    retry = ["ingest", good_again, "ds", "--replace", "--progress", "none"]
    blocked = run_dlfs(daemon.address, retry)
    assert blocked.returncode == 1
    assert f"AlreadyExists: an ingest of dataset 'ds' broke off and is parked with {held} " \
        "files" in blocked.stderr, blocked.stderr
    ended = run_as_printed(daemon.address, the_command(blocked.stderr, "dlfs discard"))
    assert ended.returncode == 0, ended.stderr
    assert ended.stdout.startswith(f"discarded the parked ingest of ds: {held} files")
    assert "dataset ds is untouched: 6 samples" in ended.stdout
    with Client(daemon.address) as client:
        assert read_dataset(client, "ds") == new
    # 4. The same retry now goes through.
    assert run_dlfs(daemon.address, retry).returncode == 0
    with Client(daemon.address) as client:
        assert read_dataset(client, "ds") == old

    # 5. `dlfs rm ds` beside a parked ingest: it removes the dataset, says what stays,
    # and that advice, run as printed, ends the parked ingest.
    assert run_dlfs(daemon.address, ingest_bad).returncode == 1
    removed = run_dlfs(daemon.address, ["rm", "ds"])
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.startswith("removed ds: 6 samples")
    assert f"an ingest of ds is still parked ({held} files" in removed.stdout
    with Client(daemon.address) as client:
        assert client.datasets() == []
        assert [(i.name, i.ingest_state) for i in client.dataset_infos()] == [("ds", "parked")]
    ended = run_as_printed(daemon.address, the_command(removed.stdout, "dlfs discard"))
    assert ended.returncode == 0, ended.stderr
    assert "untouched" not in ended.stdout  # no dataset was left to touch
    with Client(daemon.address) as client:
        assert client.dataset_infos() == []
    assert os.listdir(os.path.join(daemon.data_dir, "extents")) == []
    # Nothing is left to remove: both commands say so, and what there is.
    missing = run_dlfs(daemon.address, ["rm", "ds"])
    assert missing.returncode == 1 and "NotFound: no dataset named 'ds'" in missing.stderr
    nothing = run_dlfs(daemon.address, ["discard", "ds"])
    assert nothing.returncode == 1 and "NotFound: no parked ingest of dataset 'ds'" in \
        nothing.stderr
