"""Checkpoint spaces through the client against real daemons (with data path workers).

What each call promises (server/write/space_machine.py): a file is durable,
whole and visible to every reader when `sync` or `close` returns, and not
before; the tree's changes are durable when they return; errors are typed.
"""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest

import dlfs
from dlfs import Client
from dlfs.crc import crc32c
from dlfs.errors import (AlreadyExists, Busy, DirectoryNotEmpty, InvalidArgument, IsADirectory,
                         NotADirectory, NotFound, Overloaded, ReadOnly, StaleGeneration)
from dlfs.formats.disk_layout import extents_root
from helpers.trees import named_content as content
from helpers.waiting import wait_until

WORKERS = ["--datapath-workers", "2"]
MiB = 1 << 20




@pytest.fixture
def daemon(daemon_factory):
    return daemon_factory(extra_args=WORKERS)


@pytest.fixture
def space(daemon):
    with Client(daemon.address) as client:
        yield client.create_space("ckpt")


def test_a_file_is_visible_whole_once_closed_and_survives_a_restart(daemon, tmp_path):
    client = Client(daemon.address)
    space = client.create_space("ckpt")
    space.mkdir("step1")
    data = os.urandom(3 * MiB + 12345)  # several blocks and a partial one
    with space.open("step1/model.pt", "wb") as f:
        for at in range(0, len(data), 700_000):
            f.write(data[at:at + 700_000])
        # Listed with what reached the daemon so far, not readable yet.
        wait_until(lambda: space.stat("step1/model.pt").size > 0, "the draft's size shown", 30)
        assert space.stat("step1/model.pt").version == 0
        with pytest.raises(Busy):
            space.read("step1/model.pt")
    assert f.state.size == len(data) and f.state.crc32c == crc32c(data)
    entry = space.stat("step1/model.pt")
    assert (entry.size, entry.crc32c, entry.version) == (len(data), crc32c(data),
                                                          f.state.version)
    assert bytes(space.read("step1/model.pt")) == data
    assert bytes(space.read("step1/model.pt", 2 * MiB - 5, 10)) == data[2 * MiB - 5:2 * MiB + 5]
    assert space.open("step1/model.pt", "rb").read() == data
    info = space.info()
    assert (info.kind, info.samples, info.bytes) == ("space", 1, len(data))
    assert [i.kind for i in client.dataset_infos()] == ["space"]
    client.close()
    daemon.kill()
    daemon.start_again()
    with Client(daemon.address) as again:
        space = again.space("ckpt")
        assert [e.name for e in space.listdir("step1")] == ["model.pt"]
        assert bytes(space.read("step1/model.pt")) == data


def test_readers_see_the_previous_version_until_the_close(space):
    with space.open("x", "wb") as f:
        f.write(b"old")
    with space.open("x", "wb") as f:
        f.write(b"new bytes")
        assert bytes(space.read("x")) == b"old"
        assert space.stat("x").size == 3
    assert bytes(space.read("x")) == b"new bytes"


def test_writes_at_any_offset_truncate_and_append(space):
    with space.open("sparse", "wb") as f:
        f.seek(2 * MiB)
        f.write(b"tail")
        f.seek(10)
        f.write(b"head")
    expected = bytearray(2 * MiB + 4)
    expected[10:14] = b"head"
    expected[-4:] = b"tail"
    assert bytes(space.read("sparse")) == bytes(expected)
    with space.open("sparse", "r+b") as f:
        f.truncate(12)
        assert f.read() == bytes(10) + b"he"
    assert bytes(space.read("sparse")) == bytes(10) + b"he"
    with space.open("sparse", "ab") as f:
        f.write(b"!!")
    assert bytes(space.read("sparse")) == bytes(10) + b"he!!"
    assert space.stat("sparse").crc32c == crc32c(bytes(10) + b"he!!")


def test_sync_makes_a_version_and_writing_on_keeps_it_whole(space):
    f = space.open("log", "wb")
    f.write(b"first ")
    synced = f.sync()
    assert bytes(space.read("log")) == b"first "
    f.write(b"second")
    assert bytes(space.read("log")) == b"first "  # the synced version never changes
    f.close()
    assert f.state.version != synced.version
    assert bytes(space.read("log")) == b"first second"


def test_open_flags_and_the_tree_refuse_as_open2_does(space, daemon):
    with pytest.raises(NotFound):
        space.open("missing", "r+b")
    with pytest.raises(NotFound):
        space.open("no/dir/file", "wb")
    space.open("a", "xb").close()
    with pytest.raises(AlreadyExists):
        space.open("a", "xb")
    space.mkdir("d")
    with pytest.raises(IsADirectory):
        space.open("d", "wb")
    with pytest.raises(NotADirectory):
        space.open("a/x", "wb")
    with pytest.raises(AlreadyExists):
        space.mkdir("d")
    space.mkdir("d/e/f", parents=True)
    with pytest.raises(DirectoryNotEmpty):
        space.rmdir("d")
    with pytest.raises(IsADirectory):
        space.remove("d")
    with pytest.raises(InvalidArgument):
        space.rename("d", "d/e/g")
    with pytest.raises(InvalidArgument):
        space.open("../x", "wb")
    assert space.stat("a").size == 0  # an empty file made by open and close


def test_rename_is_atomic_and_replaces_its_target(space):
    with space.open("m.tmp", "wb") as f:
        f.write(b"new metadata")
    with space.open("m", "wb") as f:
        f.write(b"old")
    space.rename("m.tmp", "m")
    assert bytes(space.read("m")) == b"new metadata"
    assert not space.exists("m.tmp")
    space.mkdir("dir1/sub", parents=True)
    with space.open("dir1/sub/f", "wb") as f:
        f.write(b"deep")
    space.rename("dir1", "dir2")
    assert bytes(space.read("dir2/sub/f")) == b"deep"
    assert not space.exists("dir1")


def test_a_file_being_written_holds_its_path(space):
    f = space.open("busy", "wb")
    f.write(b"x")
    with pytest.raises(Busy):
        space.rename("busy", "elsewhere")
    space.mkdir("d")
    g = space.open("d/w", "wb")
    with pytest.raises(DirectoryNotEmpty):
        space.rmdir("d")
    space.remove("d/w")  # never closed: as after unlink(2), its close keeps nothing
    g.write(b"into nothing")
    g.close()
    assert g.state.version == 0 and not space.exists("d/w")
    space.rmdir("d")
    f.close()
    assert bytes(space.read("busy")) == b"x"


def test_a_reader_of_a_removed_file_gets_its_bytes_or_an_error_never_others(space):
    data = content("r", 2 * MiB)
    with space.open("r", "wb") as f:
        f.write(data)
    reader = space.open("r", "rb")
    assert reader.read(100) == data[:100]
    space.remove("r")
    with space.open("r", "wb") as f:
        f.write(b"replacement")
    try:
        rest = reader.read()
    except (StaleGeneration, NotFound):
        return
    assert rest == data[100:len(data)][:len(rest)]


def test_a_space_removed_while_a_reader_holds_a_file(daemon):
    with Client(daemon.address) as client:
        space = client.create_space("gone")
        with space.open("f", "wb") as f:
            f.write(content("f", 3 * MiB))
        reader = space.open("f", "rb").raw  # unbuffered: every read asks the daemon
        head = reader.read(MiB)
        client.delete("gone")
        assert head == content("f", 3 * MiB)[:MiB]
        with pytest.raises((StaleGeneration, NotFound)):
            reader.read()
        with pytest.raises(NotFound):
            client.space("gone")
        assert client.dataset_infos() == []


def test_names_are_shared_with_datasets_and_datasets_stay_read_only(daemon, tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.bin").write_bytes(b"sample")
    with Client(daemon.address) as client:
        client.ingest(str(source), "data")
        with pytest.raises(AlreadyExists):
            client.create_space("data")
        client.create_space("ckpt")
        with pytest.raises(AlreadyExists):
            client.ingest(str(source), "ckpt")
        with pytest.raises(NotFound):
            client.space("data")
        from dlfs.client.spaces import Space
        with pytest.raises(ReadOnly):
            Space(client, "data").open("a.bin", "wb")
        with pytest.raises(ReadOnly):
            Space(client, "data").mkdir("x")
        assert sorted((i.name, i.kind) for i in client.dataset_infos()) == \
            [("ckpt", "space"), ("data", "dataset")]


def test_a_file_is_read_through_every_read_path(daemon):
    data = content("every", 5 * MiB + 3)
    with Client(daemon.address) as client:
        space = client.create_space("ckpt")
        with space.open("every", "wb") as f:
            f.write(data)
        name = dlfs.paths.file_version_name("ckpt", f.state.version)
        assert bytes(client.get_batch([0], dataset=name)[0]) == data
    with Client(daemon.address, data_path=False) as grpc_only:
        assert bytes(grpc_only.read(name, 0, 7, 11)) == data[7:18]
    with Client(daemon.address, direct=True) as direct:
        assert bytes(direct.get_batch([0], dataset=name)[0]) == data
        reader = direct.extent_reader(name)
        assert bytes(reader.read_range(0, MiB + 1, 100)) == data[MiB + 1:MiB + 101]


def test_the_files_limit_refuses_a_new_file_and_loses_nothing(daemon_factory):
    daemon = daemon_factory(extra_args=["--space-files-max", "2"])
    with Client(daemon.address) as client:
        space = client.create_space("ckpt")
        for name in ("a", "b"):
            with space.open(name, "wb") as f:
                f.write(name.encode())
        with pytest.raises(Overloaded, match="space-files-max"):
            space.open("c", "wb")
        with space.open("a", "wb") as f:  # a new version of a file is no new file
            f.write(b"again")
        assert bytes(space.read("a")) == b"again" and bytes(space.read("b")) == b"b"


def _write_files(address: str, prefix: str, count: int, size: int) -> None:
    with Client(address) as client:
        space = client.space("ckpt")
        for i in range(count):
            name = f"{prefix}/f{i}"
            with space.open(name, "wb") as f:
                data = content(name, size + i)
                for at in range(0, len(data), MiB):
                    f.write(data[at:at + MiB])


def test_four_processes_write_into_one_space_while_others_read(daemon):
    with Client(daemon.address) as client:
        space = client.create_space("ckpt")
        for rank in range(4):
            space.mkdir(f"rank{rank}")
        with space.open("ready", "wb") as f:
            f.write(content("ready", 3 * MiB))
        stop, wrong = threading.Event(), []

        def read_on() -> None:
            while not stop.is_set():
                if bytes(space.read("ready")) != content("ready", 3 * MiB):
                    wrong.append("ready")

        readers = [threading.Thread(target=read_on) for _ in range(2)]
        for reader in readers:
            reader.start()
        context = multiprocessing.get_context("spawn")
        writers = [context.Process(target=_write_files,
                                   args=(daemon.address, f"rank{rank}", 5, 2 * MiB + rank))
                   for rank in range(4)]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join(120)
        stop.set()
        for reader in readers:
            reader.join()
        assert [w.exitcode for w in writers] == [0] * 4 and wrong == []
        for rank in range(4):
            for i in range(5):
                name = f"rank{rank}/f{i}"
                assert bytes(space.read(name)) == content(name, 2 * MiB + rank + i), name
        assert space.info().samples == 21


def test_a_writer_that_goes_away_loses_its_file_and_gives_its_space_back(daemon):
    data_dir = daemon.data_dir
    with Client(daemon.address) as client:
        space = client.create_space("ckpt")
        with space.open("kept", "wb") as f:
            f.write(b"kept")
        f = space.open("lost", "wb")
        f.write(content("lost", 9 * MiB))
        f._writer.abandon()  # as a killed process: the connection just closes
        wait_until(lambda: not space.exists("lost"), "the daemon dropped the draft", 30)
        with space.open("kept", "wb") as g:  # a new version: the old one is freed
            g.write(b"kept again")

    def extent_dirs() -> int:
        return len(os.listdir(extents_root(data_dir)))

    wait_until(lambda: extent_dirs() == 1, "every dead version's extents removed", 30)


def test_the_cli_makes_lists_shows_and_removes_a_space(daemon, capsys):
    from dlfs.cli import main

    server = ["--server", daemon.address]
    assert main([*server, "mkspace", "ckpt"]) == 0
    assert main([*server, "mkspace", "ckpt"]) == 1
    out = capsys.readouterr()
    assert "created checkpoint space ckpt" in out.out
    assert "AlreadyExists: checkpoint space 'ckpt' exists already" in out.err
    with Client(daemon.address) as client:
        space = client.space("ckpt")
        space.mkdir("s1")
        with space.open("s1/x.txt", "wb") as f:
            f.write(b"hello\n")
        version = f.state.version
    assert main([*server, "datasets"]) == 0
    assert capsys.readouterr().out == "ckpt\t1 file\t6 B  (checkpoint space)\n"
    assert main([*server, "stat", "ckpt/s1/x.txt"]) == 0
    assert f"  version: {version:x}\n" in capsys.readouterr().out
    assert main([*server, "cat", "ckpt/s1/x.txt"]) == 0
    assert capsys.readouterr().out == "hello\n"
    assert main([*server, "rm", "ckpt"]) == 0
    assert capsys.readouterr().out == "removed ckpt: 1 file, 6 B freed\n"
