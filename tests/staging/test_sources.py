"""Sources of an ingest: tar archives (members, links, names) and how paths are named."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from dlfs.staging.source_set import open_sources
from dlfs.staging.tar_archive import TarSource
from dlfs.staging.tar_members import member_path
from dlfs.errors import InvalidArgument, NotFound


def make_tar(path, members, mode="w"):
    """`members`: (name, bytes) regular files, or (name, TarInfo-type, linkname)."""
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as tf:
        for member in members:
            info = tarfile.TarInfo(member[0])
            info.mtime = 1_700_000_000
            info.mode = 0o640
            if len(member) == 2:
                info.size = len(member[1])
                tf.addfile(info, io.BytesIO(member[1]))
            else:
                info.type, info.linkname = member[1], member[2]
                tf.addfile(info)
    return str(path)


def entries(source):
    return [(f.path, f.size) for f in source.entries()]


def test_member_names_become_dataset_paths():
    assert member_path("a.tar", "./train/cat/1.jpg") == "train/cat/1.jpg"
    assert member_path("a.tar", "train//cat/./1.jpg") == "train/cat/1.jpg"
    assert member_path("a.tar", "./") == ""
    for bad in ("/etc/passwd", "../x", "a/../../x", "a/../b"):
        with pytest.raises(InvalidArgument, match="a.tar"):
            member_path("a.tar", bad)
    with pytest.raises(InvalidArgument, match="not valid UTF-8"):
        member_path("a.tar", b"caf\xe9.jpg".decode("utf-8", "surrogateescape"))


def test_webdataset_members_stay_separate_files(tmp_path):
    path = make_tar(tmp_path / "shard-000.tar", [("000123.jpg", b"jpeg"), ("000123.cls", b"7"),
                                                 ("000124.jpg", b"jpeg2"), ("000124.cls", b"3")])
    assert entries(TarSource(path)) == [("000123.jpg", 4), ("000123.cls", 1),
                                        ("000124.jpg", 5), ("000124.cls", 1)]


def test_links_hidden_and_special_members_follow_the_rules(tmp_path):
    path = make_tar(tmp_path / "a.tar", [
        ("dir/", tarfile.DIRTYPE, ""),
        ("dir/real.bin", b"12345"),
        ("dir/hard.bin", tarfile.LNKTYPE, "dir/real.bin"),
        ("dir/soft.bin", tarfile.SYMTYPE, "real.bin"),
        ("dir/outside.bin", tarfile.SYMTYPE, "../../etc/passwd"),
        ("dir/.hidden", b"h"),
        ("fifo", tarfile.FIFOTYPE, ""),
    ])
    plain = TarSource(path)
    assert entries(plain) == [("dir/real.bin", 5), ("dir/hard.bin", 5)]  # links come last
    assert plain.skipped.counts == {"hidden": 1, "symlink": 2, "special": 1, "loop": 0,
                                    "unreadable": 0}
    following = TarSource(path, follow_symlinks=True, include_hidden=True)
    assert entries(following) == [("dir/real.bin", 5), ("dir/.hidden", 1), ("dir/hard.bin", 5),
                                  ("dir/soft.bin", 5)]
    assert following.skipped.counts["symlink"] == 1  # the one pointing outside


def test_compressed_archives_are_read_like_plain_ones(tmp_path):
    members = [(f"k{i}.txt", os.urandom(100 + i)) for i in range(20)]
    plain = entries(TarSource(make_tar(tmp_path / "a.tar", members)))
    for suffix, mode in ((".tar.gz", "w:gz"), (".tar.bz2", "w:bz2"), (".tar.xz", "w:xz")):
        assert entries(TarSource(make_tar(tmp_path / f"a{suffix}", members, mode))) == plain


def test_open_sources_takes_lists_globs_and_directories_of_archives(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(3):
        make_tar(shards / f"s{i}.tar", [(f"{i}.bin", b"x")])
    (shards / "notes.txt").write_text("not an archive")
    by_glob = open_sources([str(shards / "s*.tar")])
    by_dir = open_sources([str(shards)], archives=True)
    by_list = open_sources([str(shards / f"s{i}.tar") for i in range(3)])
    for found in (by_glob, by_dir, by_list):
        assert [f.path for f in found.entries()] == ["0.bin", "1.bin", "2.bin"]
    tree = open_sources([str(shards)])
    assert tree.sources[0].kind == "tree"
    with pytest.raises(NotFound):
        open_sources([str(tmp_path / "nothing*.tar")])
    single = open_sources([str(shards / "notes.txt")])  # no archive: one sample
    assert [(f.path, f.size) for f in single.entries()] == [("notes.txt", 14)]


def test_a_damaged_archive_is_named(tmp_path):
    path = make_tar(tmp_path / "a.tar", [("x.bin", os.urandom(50_000))])
    with open(path, "r+b") as f:
        f.truncate(20_000)
    source = open_sources([path])

    class Ctx:
        chunk_bytes = 1 << 20

        def reserve(self, n):
            pass

        def push(self, *args):
            pass

    with pytest.raises(InvalidArgument, match="a.tar"):
        for unit in source.units():
            unit(Ctx())


def test_the_sequential_reader_returns_what_a_plain_file_does(tmp_path):
    from dlfs.staging.sequential_reads import SequentialReader

    path = tmp_path / "blob"
    data = os.urandom(3 * SequentialReader.CHUNK + 12345)
    path.write_bytes(data)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        pytest.skip("this file system does not take O_DIRECT")
    reader = io.BufferedReader(SequentialReader(fd, len(data)), buffer_size=65536)
    rng = __import__("random").Random(4)
    position = 0
    for _ in range(300):
        if rng.random() < 0.1:  # tarfile seeks, mostly forward
            position = rng.randrange(len(data) + 10)
            reader.seek(position)
        n = rng.choice([1, 512, 4096, 70_000, 3_000_000])
        got = reader.read(n)
        assert got == data[position:position + n]
        position += len(got)
        assert reader.tell() == position
    reader.close()


def test_a_cold_archive_is_read_with_o_direct_and_the_same_members_come_out(tmp_path):
    from dlfs.staging.sequential_reads import SequentialReader, open_sequential

    members = [(f"k{i:03d}.bin", os.urandom(1000 * i)) for i in range(40)]
    path = make_tar(tmp_path / "cold.tar", members)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    opened = open_sequential(path)
    direct = isinstance(getattr(opened, "raw", None), SequentialReader)
    opened.close()
    with tarfile.open(path) as tf:
        expected = {m.name: tf.extractfile(m).read() for m in tf if m.isreg()}

    got = {}

    class Ctx:
        chunk_bytes = 1 << 20
        name = None

        def reserve(self, n):
            pass

        def push(self, file, data, last, source_bytes, reserved):
            if file is not None:
                Ctx.name = file.path
                got[file.path] = b""
            got[Ctx.name] += data

    for unit in open_sources([path]).units():
        unit(Ctx())
    assert got == expected
    if not direct:
        pytest.skip("read through the page cache here (O_DIRECT unavailable or still cached)")


@pytest.mark.parametrize("size", [0, 1, 4096, 110_000, 1_048_577, 3 * 1_048_576 + 7])
def test_tree_files_read_cold_or_warm_come_out_whole(tmp_path, size):
    from dlfs.staging.file_reads import ReadHints, read_file
    from dlfs.staging.source_files import SourceFile

    data = os.urandom(size)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    for cold in (True, False):
        if cold:
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        chunks = []

        class Ctx:
            chunk_bytes = 1 << 20

            def reserve(self, n):
                pass

            def push(self, file, chunk, last, source_bytes, reserved):
                chunks.append((chunk, last))

        read_file(SourceFile("f.bin", str(path), size, 0o100644, 0), Ctx(), ReadHints())
        assert b"".join(c for c, _ in chunks) == data and chunks[-1][1]
        assert all(len(c) <= Ctx.chunk_bytes for c, _ in chunks)
    if size:
        with pytest.raises(InvalidArgument, match="grew"):
            read_file(SourceFile("f.bin", str(path), size - 1, 0o100644, 0), Ctx(), ReadHints())
