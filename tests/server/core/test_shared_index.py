"""The shared index: a dataset's arrays in one sealed memfd that every serving process maps."""

from __future__ import annotations

import fcntl
import mmap
import os

import numpy as np
import pytest

from dlfs.formats import block_crcs
from dlfs.server.core import shared_index
from dlfs.server.core.catalog_records import SampleBlock
from dlfs.server.core.directory import Cluster, DatasetIndex


def dataset(n: int, *, cluster: bool = False, large: bool = False) -> DatasetIndex:
    rng = np.random.default_rng(n)
    lengths = rng.integers(1, 5000, n).astype(np.uint64)
    if large and n:
        lengths[n // 2] = 3 * block_crcs.BLOCK_BYTES + 5
    counts = block_crcs.block_counts(lengths, block_crcs.BLOCK_BYTES)
    block = SampleBlock(
        [f"d{i % 7}/f{i:05d}" for i in range(n)][::-1], np.arange(n, dtype=np.uint32) % 3,
        np.cumsum(lengths) - lengths, lengths, rng.integers(0, 2**32, n).astype(np.uint32),
        np.full(n, 0o100644, np.uint32), np.arange(n, dtype=np.int64),
        holders=rng.integers(0, 3, (n, 2)).astype(np.uint16) if cluster else None,
        block_crc=rng.integers(0, 2**32, int(counts[counts > 1].sum())).astype(np.uint32))
    return DatasetIndex("ds", 42, 7, block,
                        Cluster(("a:1", "b:2", "c:3"), 2, 1, 99) if cluster else None)


@pytest.mark.parametrize("n, cluster, large", [(0, False, False), (1, False, False),
                                               (300, True, False), (50, False, True)])
def test_a_loaded_index_answers_as_the_original(n, cluster, large):
    original = dataset(n, cluster=cluster, large=large)
    fd = shared_index.export(original)
    try:
        mapped = shared_index.load(fd)
    finally:
        os.close(fd)  # the mapping outlives the descriptor
    assert mapped.summary() == original.summary()
    assert len(mapped) == len(original) and mapped.generation == original.generation
    for field in ("extent", "offset", "length", "crc", "mode", "mtime_ns"):
        assert np.array_equal(getattr(mapped, field), getattr(original, field)), field
        assert not getattr(mapped, field).flags.writeable
    assert (mapped.holders is None) == (original.holders is None)
    if cluster:
        assert np.array_equal(mapped.holders, original.holders)
    for sample_id in range(n):
        got, want = mapped.block_crcs(sample_id), original.block_crcs(sample_id)
        assert (got is None and want is None) or np.array_equal(got, want)
    ids = np.arange(n)[::3]
    assert np.array_equal(mapped.check_ids(ids), original.check_ids(ids))


def test_the_index_is_sealed_against_every_change():
    fd = shared_index.export(dataset(10))
    try:
        with pytest.raises(PermissionError):
            os.write(fd, b"x")
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
        with pytest.raises(PermissionError):
            mmap.mmap(fd, 64, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def test_the_main_index_adopts_the_shared_copy():
    original = dataset(100, large=True)
    offsets = original.offset.copy()
    fd = shared_index.export(original)
    shared_index.adopt(original, fd)
    os.close(fd)
    assert np.array_equal(original.offset, offsets)
    assert not original.offset.flags.owndata  # a view of the mapping, not its own copy
    original.check_invariants()
    assert original.path(5) and original.block_crcs(50) is not None


def test_only_sealed_indexes_of_this_format_are_loaded():
    fd = os.memfd_create("not-sealed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, b"DLFSIDX\0" + bytes(64))
        with pytest.raises(ValueError, match="sealed"):
            shared_index.load(fd)
    finally:
        os.close(fd)
    exported = shared_index.export(dataset(3))
    copy = os.memfd_create("bad-magic", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        data = os.pread(exported, os.fstat(exported).st_size, 0)
        os.write(copy, b"NOTANIDX" + data[8:])
        fcntl.fcntl(copy, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW
                    | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
        with pytest.raises(ValueError, match="not a shared index"):
            shared_index.load(copy)
    finally:
        os.close(copy)
        os.close(exported)
