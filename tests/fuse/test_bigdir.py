"""A directory of 100,000 entries: listed completely, page by page."""

from __future__ import annotations

import math
import os
import subprocess

import pytest
import trio

from dlfs import Client
from dlfs import limits as fuse_limits
from dlfs.fuse.backend import Backend
from dlfs.fuse.dirlist import Child, DirStream
from dlfs.fuse.attributes import entry_attrs
from helpers.trees import unique_name

ENTRIES = 100_000


def name_of(i: int) -> str:
    return f"{i:06d}.txt"


@pytest.fixture(scope="module")
def big_dataset(shared_daemon, tmp_path_factory):
    source = tmp_path_factory.mktemp("bigdir")
    os.mkdir(source / "d")
    for i in range(ENTRIES):
        with open(source / "d" / name_of(i), "wb") as f:
            f.write(b"%d" % i)
    with open(source / "after.txt", "wb") as f:
        f.write(b"after")
    name = unique_name("big")
    with Client(shared_daemon.address) as client:
        client.ingest(str(source), name, progress=False)
    return shared_daemon.address, name


@pytest.mark.mount
def test_listing_through_the_mount(big_dataset, mount_factory):
    address, name = big_dataset
    m = mount_factory(address)
    directory = os.path.join(m.mountpoint, name, "d")
    expected = [name_of(i) for i in range(ENTRIES)]
    assert os.listdir(directory) == expected  # name order, every entry once
    entries = list(os.scandir(directory))
    assert [e.name for e in entries] == expected
    assert all(e.is_file() and not e.is_dir() for e in entries[::997])
    assert entries[12345].stat().st_size == len(b"12345")
    with open(os.path.join(directory, name_of(99_999)), "rb") as f:
        assert f.read() == b"99999"
    count = subprocess.run(f"ls -f {directory} | wc -l", shell=True, check=True,
                           capture_output=True, text=True).stdout.strip()
    assert int(count) == ENTRIES  # ls -f lists in readdir order, without sorting
    assert sorted(os.listdir(os.path.join(m.mountpoint, name))) == ["after.txt", "d"]


@pytest.mark.slow
def test_pages_are_fetched_one_at_a_time(big_dataset):
    """What the mount does per readdir: one ListDir page per `dir_page_entries`
    entries, one page held, and resuming at a handed-out offset costs one page."""
    address, name = big_dataset
    backend = Backend(address)
    pages: list[int] = []

    async def fetch(start_after: str, count: int):
        entries, more = await trio.to_thread.run_sync(backend.list_page, name, "d",
                                                      start_after, count, 0)
        pages.append(len(entries))
        return [Child(e.name, (name, 0, "d/" + e.name), entry_attrs(e)) for e in entries], more

    async def main():
        stream = DirStream(fetch, fuse_limits.mount_dir_page_entries)
        names, offsets = [], []
        async for next_offset, child in stream.entries_from(0):
            names.append(child.name)
            offsets.append(next_offset)
        assert names == [name_of(i) for i in range(ENTRIES)]
        assert offsets == list(range(1, ENTRIES + 1))
        assert len(pages) == math.ceil(ENTRIES / fuse_limits.mount_dir_page_entries)
        assert max(pages) <= fuse_limits.mount_dir_page_entries
        # The kernel resumes where a full buffer stopped: at most one page each.
        for offset in (0, 1, 4321, 2 * fuse_limits.mount_dir_page_entries, 77_777, ENTRIES - 1):
            fetched = len(pages)
            async for _, child in stream.entries_from(offset):
                assert child.name == name_of(offset)
                break
            assert len(pages) - fetched <= 1
        async for _ in stream.entries_from(ENTRIES):
            raise AssertionError("an offset past the end yields nothing")

    try:
        trio.run(main)
    finally:
        backend.close()
