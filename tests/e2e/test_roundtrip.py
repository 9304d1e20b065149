"""Ingest real trees through a real daemon and read them back byte for byte."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlfs import Client
from helpers.trees import unique_name, write_tree

# Names a file system and DLFS both accept: unicode, spaces, no '/', no NUL,
# not '.'/'..', at most 255 UTF-8 bytes.  Hidden names are excluded here
# because ingest skips them by default (tested separately).
component = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\x00"),
    min_size=1, max_size=20,
).filter(lambda s: not s.startswith(".") and len(s.encode()) <= 255)

tree_strategy = st.dictionaries(
    keys=st.lists(component, min_size=1, max_size=6).map("/".join),
    values=st.binary(min_size=0, max_size=3000),
    min_size=1, max_size=40,
)


def consistent(tree: dict[str, bytes]) -> bool:
    """No path is both a file and a directory prefix of another path."""
    dirs = {p.rsplit("/", 1)[0] for p in tree if "/" in p}
    prefixes = {"/".join(d.split("/")[:i]) for d in dirs for i in range(1, d.count("/") + 2)}
    return not prefixes & set(tree)


def check_dataset(client: Client, name: str, tree: dict[str, bytes], rng: random.Random) -> None:
    ds = client.dataset(name)
    paths = sorted(tree)
    assert sorted(p.encode() for p in paths) == [p.encode() for p in paths]  # id order = byte order
    assert len(ds) == len(tree)
    assert ds.paths() == paths
    assert [e.id for e in ds.lookup(paths)] == list(range(len(paths)))
    for i in rng.sample(range(len(paths)), min(len(paths), 20)):
        assert ds.path(i) == paths[i] and ds.index(paths[i]) == i
    ids = [rng.randrange(len(paths)) for _ in range(3 * len(paths))]
    assert [bytes(s) for s in ds.get_batch(ids)] == [tree[paths[i]] for i in ids]
    by_path = [paths[i] for i in ids]
    assert [bytes(s) for s in ds.get_batch(by_path)] == [tree[p] for p in by_path]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=tree_strategy.filter(consistent), seed=st.integers(0, 2**32 - 1))
def test_random_trees_round_trip(shared_client, tmp_path_factory, tree, seed):
    source = tmp_path_factory.mktemp("src")
    write_tree(source, tree)
    name = unique_name()
    info = shared_client.ingest(str(source), name)
    assert (info.samples, info.bytes, info.sealed) == (len(tree), sum(map(len, tree.values())), True)
    check_dataset(shared_client, name, tree, random.Random(seed))


def test_large_file_deep_nesting_and_restart(daemon, tmp_path):
    rng = np.random.default_rng(1)
    big = rng.integers(0, 256, 50 * 1024 * 1024, dtype=np.uint8).tobytes()
    deep = "/".join(f"level {i} ü" for i in range(40)) + "/leaf.bin"
    tree = {
        "big/volume.raw": big,
        deep: b"deep",
        "empty.txt": b"",
        "with space/and ünïcödé 名前.jpg": rng.bytes(110 * 1024),
        **{f"train/class{c}/{i:04d}.jpg": rng.bytes(int(rng.integers(1, 8000)))
           for c in range(3) for i in range(50)},
    }
    write_tree(tmp_path / "src", tree)
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "mixed")
        check_dataset(client, "mixed", tree, random.Random(2))
        before = [bytes(s) for s in client.get_batch(range(len(tree)), dataset="mixed")]
    daemon.restart()
    with Client(daemon.address) as client:
        after = [bytes(s) for s in client.get_batch(range(len(tree)), dataset="mixed")]
        assert after == before
        check_dataset(client, "mixed", tree, random.Random(3))
        big_id = client.dataset("mixed").index("big/volume.raw")
        sample = client.get_batch([big_id, big_id], dataset="mixed")
        assert bytes(sample[0]) == big and bytes(sample[1]) == big


def test_samples_support_the_buffer_protocol(shared_client, tmp_path):
    array = np.arange(1000, dtype=np.float32)
    np.save(tmp_path / "a.npy", array)
    name = unique_name()
    shared_client.ingest(str(tmp_path), name)
    sample = shared_client.get_batch([0], dataset=name)[0]
    import io

    assert np.array_equal(np.load(io.BytesIO(sample)), array)
    raw = np.frombuffer(sample, np.uint8)
    assert raw.size == os.path.getsize(tmp_path / "a.npy")


def test_metadata_matches_source(shared_client, tmp_path):
    write_tree(tmp_path, {"a/x.bin": b"12345", "a/b/y.bin": b"", "z.txt": b"zz"})
    os.chmod(tmp_path / "z.txt", 0o640)
    os.utime(tmp_path / "z.txt", ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    name = unique_name()
    shared_client.ingest(str(tmp_path), name)
    entry = shared_client.stat(name, "z.txt")
    assert (entry.size, entry.mode & 0o7777, entry.mtime_ns) == (2, 0o640, 1_600_000_000_123_456_789)
    assert not entry.is_dir and entry.id == 2
    root = [(e.name, e.is_dir) for e in shared_client.listdir(name, "")]
    assert root == [("a", True), ("z.txt", False)]
    assert [e.name for e in shared_client.listdir(name, "a")] == ["b", "x.bin"]
    assert shared_client.stat(name, "a").children == 2


@pytest.mark.parametrize("page_size", [1, 7, 1000])
def test_paged_listing_of_a_large_directory(shared_client, tmp_path, page_size):
    files = {f"many/{i:06d}": b"" for i in range(3000)}
    write_tree(tmp_path, files)
    name = unique_name()
    shared_client.ingest(str(tmp_path), name)
    listed = [e.name for e in shared_client.listdir(name, "many", page_size=page_size)]
    assert listed == sorted(p.split("/")[1] for p in files)


def test_dataset_spanning_several_catalog_records(daemon, tmp_path):
    from dlfs import limits

    count = limits.catalog_samples_per_record + 700
    tree = {f"d{i % 7}/{i:06d}": i.to_bytes(4, "little") for i in range(count)}
    write_tree(tmp_path / "src", tree)
    with Client(daemon.address) as client:
        assert client.ingest(str(tmp_path / "src"), "many").samples == count
    daemon.restart()
    with Client(daemon.address) as client:
        check_dataset(client, "many", tree, random.Random(5))
