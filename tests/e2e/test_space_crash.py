"""Checkpoint spaces under kill -9 and a full disk, against real daemons.

The promise (server/write/space_machine.py): a kill -9 at any moment loses
at most the files not yet closed or synced, never a closed one, never leaves
a torn or mixed file visible, and gives the space of lost writes back; a full
disk surfaces at write, sync or close as StorageFull with nothing else lost.
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from dlfs import Client
from dlfs.errors import DlfsError, NotFound, StaleGeneration, StorageFull
from dlfs.formats.disk_layout import extents_root
from helpers.small_disks import ext4_disk
from helpers.trees import named_content as content

MiB = 1 << 20
KILLS = 30


class Writer(threading.Thread):
    """Writes files until stopped, through whatever the daemon does meanwhile.

    Each file f{i} is written in pieces; every third is synced halfway and
    written on (its legal contents: the half or the whole); every fifth is
    written as a temporary file and renamed into place (DCP's commit).
    `done[name]` is the content whose close (or rename) returned.
    """

    def __init__(self, address: str):
        super().__init__(daemon=True)
        self.address = address
        self.stop = threading.Event()
        self.done: dict[str, bytes] = {}
        self.legal: dict[str, set[bytes]] = {}
        self.failures = 0
        self.unexpected: list[BaseException] = []

    def run(self) -> None:
        rng = random.Random(7)
        i = 0
        while not self.stop.is_set():
            try:
                with Client(self.address, reconnect_timeout_s=1.0) as client:
                    space = client.space("ckpt")
                    while not self.stop.is_set():
                        self._one(space, f"f{i}", rng.randrange(0, 3 * MiB), i)
                        i += 1
            except DlfsError:  # the daemon was killed under it: go on once it is back
                self.failures += 1
                i += 1
                self.stop.wait(0.05)
            except BaseException as exc:
                self.unexpected.append(exc)
                return

    def _one(self, space, name: str, size: int, i: int) -> None:
        data = content(name, size)
        half = data[:size // 2]
        target = name
        if i % 5 == 0:
            name = f"{name}.tmp"
        self.legal[target] = self.legal[name] = {data, half} if i % 3 == 0 else {data}
        with space.open(name, "wb") as f:
            f.write(half)
            if i % 3 == 0:
                f.sync()
                if name == target:
                    self.done.setdefault(target + "#half", half)
            for at in range(len(half), size, MiB):
                f.write(data[at:at + MiB])
        if name != target:
            space.rename(name, target)
        self.done[target] = data


def check_space(address: str, writer: Writer) -> int:
    """Every file present holds a legal content of its name; every closed one is there,
    whole.  Returns how many files there are."""
    assert writer.unexpected == [], writer.unexpected
    done = dict(writer.done)  # before the listing: what returned is there
    with Client(address) as client:
        space = client.space("ckpt")
        entries = {e.name: e for e in space.listdir()}
        for name, entry in entries.items():
            got = read_current(space, name, entry)
            if got is not None:
                assert got in writer.legal[name], f"{name} is torn or mixed ({len(got)} bytes)"
        for name, data in done.items():
            if name.endswith("#half"):
                name = name[:-5]
                assert name in entries, f"{name} was synced but is gone"
                continue
            assert name in entries, f"{name} was closed but is gone"
            assert entries[name].size == len(data) and entries[name].version, name
        return len(entries)


def read_current(space, name: str, entry) -> bytes | None:
    """The bytes of the version `name` names now (the writer may replace the one listed:
    a file synced halfway gets its whole version at close); None while it is being
    written and has no closed version yet, or was renamed away."""
    for _ in range(20):
        if not entry.version:
            return None
        try:
            return bytes(space.read(name, entry=entry)) if entry.size else b""
        except (NotFound, StaleGeneration):  # replaced since: read the new one
            try:
                entry = space.stat(name)
            except NotFound:
                return None
    raise AssertionError(f"{name} kept changing")


def test_kill_9_at_random_moments_never_loses_a_closed_file(daemon_factory):
    daemon = daemon_factory(extra_args=["--datapath-workers", "1"])
    with Client(daemon.address) as client:
        client.create_space("ckpt")
    writer = Writer(daemon.address)
    writer.start()
    rng = random.Random(11)
    try:
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.05, 0.5))  # a random point of the writer's work
            daemon.kill()
            daemon.start_again()
            check_space(daemon.address, writer)
    finally:
        writer.stop.set()
        writer.join(60)
    assert writer.unexpected == []
    assert writer.failures >= KILLS // 2  # the kills did land in the middle of writes
    daemon.kill()
    daemon.start_again()
    files = check_space(daemon.address, writer)
    assert len(writer.done) > KILLS
    # Everything written and lost was given back: one extent directory per file.
    assert len(os.listdir(extents_root(daemon.data_dir))) == files


def test_a_full_disk_fails_the_file_being_written_and_loses_nothing_else(daemon_factory,
                                                                         tmp_path):
    with ext4_disk(tmp_path / "small", 96) as disk:
        daemon = daemon_factory(data_dir=str(disk / "data"),
                                extra_args=["--datapath-workers", "1"])
        with Client(daemon.address) as client:
            space = client.create_space("ckpt")
            kept = []
            with pytest.raises(StorageFull, match="no space left"):
                for i in range(100):
                    name = f"f{i}"
                    with space.open(name, "wb") as f:
                        data = content(name, 8 * MiB)
                        for at in range(0, len(data), MiB):
                            f.write(data[at:at + MiB])
                    kept.append(name)
            assert len(kept) >= 3
            assert sorted(e.name for e in space.listdir()) == sorted(kept)
            for name in kept:
                assert bytes(space.read(name)) == content(name, 8 * MiB)
            space.remove(kept[0])
            space.remove(kept[1])
            with space.open("after", "wb") as f:
                f.write(content("after", 4 * MiB))
            assert bytes(space.read("after")) == content("after", 4 * MiB)
        daemon.kill()
        daemon.start_again()
        with Client(daemon.address) as client:
            names = sorted(e.name for e in client.space("ckpt").listdir())
        assert names == sorted(kept[2:] + ["after"])
        assert len(os.listdir(extents_root(daemon.data_dir))) == len(names)
        daemon.kill()
