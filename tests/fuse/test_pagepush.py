"""After the first read of a `--dataset` mount, the small files a reader listed are
pushed into the page cache in batches: reading them later sends the mount nothing."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from dlfs import Client
from helpers import mounts
from helpers.trees import write_tree
from helpers.waiting import wait_until

pytestmark = pytest.mark.mount

KiB = 1024
PUSH_TIMEOUT_S = 60.0  # a bound for a hang on a loaded machine, not a speed target


def tree_of(count: int) -> dict[str, bytes]:
    rng = np.random.default_rng(4)
    return {f"c{i % 3}/{i:03d}.jpg": rng.bytes(20 * KiB + i) for i in range(count)}


def pushed(mount) -> tuple[int, int] | None:
    """(files, MiB) of the mount's push, once its log says it ended."""
    found = re.findall(r"pushed (\d+) files \((\d+) MiB\)", mount.log())
    return (int(found[-1][0]), int(found[-1][1])) if found else None


def mount_listed(daemon, mount_factory, tmp_path, tree, *args):
    write_tree(tmp_path / "src", tree)
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds", progress=False)
    m = mount_factory(daemon.address, "--dataset", "ds", *args)
    for c in range(3):
        os.listdir(os.path.join(m.mountpoint, f"c{c}"))  # the kernel now knows every file
    return m


def read_all(m, tree) -> None:
    for rel, data in sorted(tree.items()):
        with open(os.path.join(m.mountpoint, rel), "rb") as f:
            assert f.read() == data


def test_listed_files_are_pushed_after_the_first_read(daemon, mount_factory, tmp_path):
    tree = tree_of(60)
    m = mount_listed(daemon, mount_factory, tmp_path, tree)
    first = sorted(tree)[0]
    with open(os.path.join(m.mountpoint, first), "rb") as f:
        assert f.read() == tree[first]
    wait_until(lambda: pushed(m) is not None, "the push ended", PUSH_TIMEOUT_S)
    assert pushed(m)[0] == len(tree) - 1, m.log()[-3000:]  # the file read first: not again
    before = m.request_counts()
    reclaimed = 0  # files the host's proactive reclaim took back since the push
    for rel, data in sorted(tree.items()):
        path = os.path.join(m.mountpoint, rel)
        reclaimed += not mounts.page_cache_holds(path)
        with open(path, "rb") as f:
            assert f.read() == data
    after = m.request_counts()
    # Every file held by the page cache was read from it, without a READ.
    assert after.get("read", 0) - before.get("read", 0) <= reclaimed, \
        (before, after, reclaimed, m.log()[-3000:])
    assert reclaimed <= len(tree) // 4, reclaimed  # the push did fill the page cache


def test_no_push_when_the_daemon_does_not_warm_the_dataset(daemon_factory, mount_factory,
                                                            tmp_path):
    daemon = daemon_factory(extra_args=["--warm-on-first-read", "off"])
    tree = tree_of(30)
    m = mount_listed(daemon, mount_factory, tmp_path, tree)
    read_all(m, tree)
    wait_until(lambda: pushed(m) is not None, "the push ended", PUSH_TIMEOUT_S)
    assert pushed(m) == (0, 0)
    assert m.request_counts().get("read", 0) >= len(tree)  # every file read on demand


def test_the_push_stays_within_half_the_daemons_warm_up_budget(daemon_factory, mount_factory,
                                                                tmp_path):
    tree = tree_of(90)  # about 1.8 MiB
    total = sum(len(d) for d in tree.values())
    with open("/proc/meminfo") as f:
        memory = int(f.readline().split()[1]) * KiB
    budget = total // 2  # the daemon's budget: half the data, so the push may take a quarter
    daemon = daemon_factory(extra_args=["--warm-memory-share", f"{budget / memory:.9f}"])
    m = mount_listed(daemon, mount_factory, tmp_path, tree)
    read_all(m, dict(sorted(tree.items())[:1]))
    wait_until(lambda: pushed(m) is not None, "the push ended", PUSH_TIMEOUT_S)
    files = pushed(m)[0]
    assert 0 < files and sum(len(tree[k]) for k in sorted(tree)[:files]) <= budget // 2 + 64 * KiB
    read_all(m, tree)  # the rest is read on demand


@pytest.mark.parametrize("how", ["through-daemon", "extents", "splice"])
def test_large_files_are_pushed_too_in_pieces(daemon, mount_factory, tmp_path, how,
                                              request):
    """Files over the whole-file limit (DLIO's NPZ volumes) follow the small ones,
    fetched and stored in ranged pieces (co-located: read from the extents, or with
    `--splice auto` spliced from their pages; the daemon sends nothing); a reader
    then sends the mount nothing."""
    if how == "splice":
        request.getfixturevalue("splice_pipes")
    options = {"through-daemon": ["--extent-reads", "off"], "extents": ["--splice", "off"],
               "splice": ["--splice", "auto"]}[how]
    rng = np.random.default_rng(9)
    tree = {f"c{i % 3}/vol{i}.npz": rng.bytes(size)
            for i, size in enumerate((9 * 2**20 + 5, 17 * 2**20 + 333, 33 * 2**20))}
    tree["c0/small.txt"] = b"small"
    m = mount_listed(daemon, mount_factory, tmp_path, tree, *options)
    with open(os.path.join(m.mountpoint, "c0/small.txt"), "rb") as f:
        assert f.read() == b"small"
    wait_until(lambda: pushed(m) is not None, "the push ended", PUSH_TIMEOUT_S)
    # small.txt, read before the push, is not pushed again.
    assert pushed(m) == (len(tree) - 1, sum(len(d) for d in tree.values()) // 2**20)
    before = m.request_counts()
    read_all(m, tree)
    # Nearly all from the page cache: unpushed, these 59 MiB cost hundreds of READs;
    # the kernel may still drop a few pushed pages before the reader gets to them.
    assert m.request_counts().get("read", 0) - before.get("read", 0) <= len(tree) * 2
    daemon_reads = m.request_counts(label="daemon calls").get("read", 0)
    volumes = sum(len(d) for name, d in tree.items() if name.endswith(".npz"))
    if how == "splice":
        assert daemon_reads == 0
        assert mounts.splice_reads(m)["stored_bytes"] == volumes
    elif how == "extents":
        assert daemon_reads == 0
        assert mounts.extent_reads(m)["range_bytes"] >= volumes
    else:
        assert daemon_reads >= 4  # the pieces of the large files


def test_files_readers_fetched_whole_are_not_pushed_again(daemon, tmp_path):
    """In-process over a real daemon: the push skips a file whose bytes readers had
    fetched whole (`Node.fetched_bytes`), and pushes one they read only a part of."""
    import trio

    from dlfs.fuse.backend import Backend
    from dlfs.fuse.inodes import Node
    from dlfs.fuse.pagepush import PagePush

    rng = np.random.default_rng(5)
    tree = {"a.jpg": rng.bytes(30 * KiB), "b.jpg": rng.bytes(40 * KiB),
            "big.npz": rng.bytes(9 * 2**20 + 1), "bigger.npz": rng.bytes(10 * 2**20 + 3)}
    write_tree(tmp_path / "src", tree)
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "skip", progress=False)
        entries = {e.path: e for e in client.dataset("skip").lookup(sorted(tree))}
        generation = client.dataset("skip").info.generation
    nodes = {path: Node(10 + i, ("skip", generation, path), False, e.size, 0o100644, 0,
                        lookups=1, sample_id=e.id)
             for i, (path, e) in enumerate(sorted(entries.items()))}
    nodes["a.jpg"].fetched_bytes = nodes["a.jpg"].size  # a reader fetched it whole
    nodes["big.npz"].fetched_bytes = nodes["big.npz"].size
    nodes["bigger.npz"].fetched_bytes = 2**20  # only its first MiB
    stored: dict[str, bytearray] = {}
    backend = Backend(daemon.address)

    def store(node, offset, data):
        page = stored.setdefault(node.path, bytearray(node.size))
        page[offset:offset + len(data)] = data

    async def main():
        push = PagePush(lambda: list(nodes.values()), lambda: 1 << 30,
                        lambda batch: backend.read_batch("skip", [n.sample_id for n in batch],
                                                         generation),
                        lambda node, offset, length: backend.read(
                            "skip", node.sample_id, offset, length, generation),
                        store, trio.to_thread.run_sync)
        push.notice_read()
        await push.run()
        return push

    try:
        push = trio.run(main)
    finally:
        backend.close()
    assert sorted(stored) == ["b.jpg", "bigger.npz"]
    assert all(bytes(stored[p]) == tree[p] for p in stored)
    assert (push.pushed_files, push.pushed_bytes) == (2, len(tree["b.jpg"]) +
                                                      len(tree["bigger.npz"]))
