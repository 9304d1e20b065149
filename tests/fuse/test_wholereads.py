"""Whole small files read in worker threads, against a real daemon: bytes, fetches, bounds."""

from __future__ import annotations

import concurrent.futures
import threading

import numpy as np
import pytest

from dlfs import Client, NotFound
from dlfs.fuse.backend import Backend
from dlfs.fuse.errno_map import Stale
from dlfs.fuse.inodes import Node
from dlfs.fuse.wholereads import WholeReads
from helpers.trees import unique_name, write_tree

KiB = 1024


@pytest.fixture(scope="module")
def files(shared_daemon, tmp_path_factory):
    rng = np.random.default_rng(3)
    tree = {f"f{i}.bin": rng.bytes(100 * KiB + i) for i in range(8)}
    source = tmp_path_factory.mktemp("wr")
    write_tree(source, tree)
    name = unique_name("wr")
    with Client(shared_daemon.address) as client:
        client.ingest(str(source), name, progress=False)
        ids = {e.path: e.id for e in client.listdir(name)}
    backend = Backend(shared_daemon.address)
    yield backend, name, tree, ids
    backend.close()


def nodes_of(name: str, tree: dict, ids: dict, *, by_id: bool = True) -> dict[str, Node]:
    return {path: Node(10 + i, (name, 1, path), False, len(data), 0o100644, 0,
                       sample_id=ids[path] if by_id else -1)
            for i, (path, data) in enumerate(sorted(tree.items()))}


def fetcher(backend: Backend):
    def fetch(node: Node) -> memoryview:
        return backend.read(node.dataset, node.read_key, 0, 0)
    return fetch


@pytest.mark.parametrize("by_id", [True, False])
def test_pieces_of_a_file_cost_one_fetch_and_it_is_dropped_once_served(files, by_id):
    backend, name, tree, ids = files
    reads = WholeReads(fetcher(backend))
    for path, node in nodes_of(name, tree, ids, by_id=by_id).items():
        got = b"".join(bytes(reads.read(node, offset, 16 * KiB))
                       for offset in range(0, node.size, 16 * KiB))
        assert got == tree[path]
        assert reads.read(node, node.size, 4096) == b""  # at the end: nothing, no fetch
        reads.check_invariants()
        assert len(reads) == 0 and reads.bytes_held == 0  # fully served: the kernel has it
    assert reads.fetches == len(tree)


def test_concurrent_readers_of_one_file_share_its_fetch(files):
    backend, name, tree, ids = files
    gate = threading.Event()
    fetch = fetcher(backend)

    def gated(node: Node) -> memoryview:
        gate.wait()
        return fetch(node)

    reads = WholeReads(gated)
    node = nodes_of(name, tree, ids)["f0.bin"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(reads.read, node, offset, 32 * KiB)
                   for offset in range(0, node.size, 32 * KiB)]
        gate.set()
        pieces = [bytes(f.result()) for f in futures]
    assert b"".join(pieces) == tree["f0.bin"]
    assert reads.fetches == 1
    reads.check_invariants()


def test_bytes_held_stay_within_the_bound(files):
    backend, name, tree, ids = files
    size_max = max(len(d) for d in tree.values())
    reads = WholeReads(fetcher(backend), whole_bytes_max=size_max, bytes_max=3 * size_max)
    for node in nodes_of(name, tree, ids).values():
        assert bytes(reads.read(node, 0, 4096)) == tree[node.path][:4096]  # never fully served
        reads.check_invariants()
        assert reads.bytes_held <= reads.bytes_max
    assert len(reads) == 3


def test_reads_beyond_the_waiting_bound_are_declined(files):
    backend, name, tree, ids = files
    gate = threading.Event()
    fetch = fetcher(backend)
    started = threading.Semaphore(0)

    def gated(node: Node) -> memoryview:
        started.release()
        gate.wait()
        return fetch(node)

    reads = WholeReads(gated, waiting_max=2)
    nodes = list(nodes_of(name, tree, ids).values())
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        waiting = [pool.submit(reads.read, node, 0, node.size) for node in nodes[:2]]
        started.acquire()
        started.acquire()
        assert reads.read(nodes[2], 0, 4096) is None  # a third would wait: declined at once
        assert reads.read(nodes[0], 0, 4096) is None  # waiting for another's fetch counts too
        assert reads.declined == 2
        gate.set()
        assert [bytes(f.result()) for f in waiting] == [tree[n.path] for n in nodes[:2]]
    assert bytes(reads.read(nodes[2], 0, nodes[2].size)) == tree[nodes[2].path]
    reads.check_invariants()


def test_a_failed_fetch_raises_to_every_waiter_and_the_next_read_fetches_again(files):
    backend, name, tree, ids = files
    fetch = fetcher(backend)
    node = nodes_of(name, tree, ids, by_id=False)["f1.bin"]
    missing = Node(99, (name, 1, "nope.bin"), False, 10, 0o100644, 0)
    reads = WholeReads(fetch)
    with pytest.raises(NotFound):
        reads.read(missing, 0, 10)
    reads.check_invariants()
    assert len(reads) == 0
    assert bytes(reads.read(node, 0, node.size)) == tree["f1.bin"]


def test_a_sample_of_another_size_is_stale(files):
    backend, name, tree, ids = files
    node = nodes_of(name, tree, ids)["f2.bin"]
    node.size -= 1  # what a mount sees when the dataset was replaced under it
    reads = WholeReads(fetcher(backend))
    with pytest.raises(Stale):
        reads.read(node, 0, 4096)
    reads.check_invariants()
    assert len(reads) == 0


def test_reads_name_a_sample_by_id_only_within_a_named_version():
    node = Node(5, ("ds", 3, "a/b.jpg"), False, 10, 0o100644, 0, sample_id=7)
    assert node.read_key == 7
    unversioned = Node(5, ("ds", -123, "a/b.jpg"), False, 10, 0o100644, 0, sample_id=7)
    assert unversioned.read_key == "a/b.jpg"  # "any version": an id could name another sample
    assert Node(5, ("ds", 3, "a/b.jpg"), False, 10, 0o100644, 0).read_key == "a/b.jpg"
