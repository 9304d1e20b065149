"""BLOCKS and DIRS catalog records: written at ingest, replayed, compacted, indexed."""

from __future__ import annotations

import crc32c
import numpy as np
import pytest

from dlfs.formats import block_crcs
from dlfs.errors import InvalidArgument
from dlfs.server.core import catalog as cat
from dlfs.server.core import catalog_records as records
from dlfs.server.core import catalog_replay
from dlfs.server.config import ServerConfig
from dlfs.server.store import Store

B = block_crcs.BLOCK_BYTES


def open_store(path) -> Store:
    return Store.open(ServerConfig(data_dir=str(path), extent_bytes_max=8 * B))


def expected_blocks(data: bytes) -> list[int]:
    return [crc32c.crc32c(data[i:i + B]) for i in range(0, len(data), B)]


def ingest(store, name, files: dict[str, bytes], dirs=()):
    session = store.ingests.begin(name)
    for path in dirs:
        session.add_directory(path)
    for path, data in files.items():  # arrival order differs from id order on purpose
        session.start_file(path, len(data), 0o100644, 1)
        for i in range(0, len(data), 300_000):  # pieces that straddle blocks
            session.write(data[i:i + 300_000])
        if not data:
            session.write(b"")
    return store.ingests.commit(session)


FILES = {"z/large.bin": bytes(range(256)) * (3 * B // 256 + 7),
         "a/exact.bin": b"\x07" * B,  # one block: no block CRCs
         "m/two.bin": b"\x01" * (B + 1),
         "b/small": b"abc", "e": b""}


def check(dataset) -> None:
    dataset.check_invariants()
    for path, data in FILES.items():
        i = dataset.id_of(path)
        crcs = dataset.block_crcs(i)
        if len(data) <= B:
            assert crcs.tolist() == [crc32c.crc32c(data)]
        else:
            assert crcs.tolist() == expected_blocks(data)
    assert dataset.empty_dirs == ["a/empty", "valid", "x/y/z"]
    assert dataset.stat("x/y/z").is_dir and dataset.stat("x/y").children == 1
    assert dataset.listdir("valid") == ([], False)


def test_block_crcs_and_empty_dirs_survive_restart_and_compaction(tmp_path):
    store = open_store(tmp_path / "data")
    ingest(store, "ds", FILES, dirs=["valid", "x/y/z", "a/empty"])
    check(store.dataset("ds"))
    store.close()
    store = open_store(tmp_path / "data")  # replayed from BLOCKS and DIRS records
    try:
        check(store.dataset("ds"))
        found = cat.scan(str(tmp_path / "data" / "catalog.log")).records
    finally:
        store.close()
    kinds = [t for t, _ in found]
    assert kinds.count(records.RecordType.BLOCKS) == 1 and kinds.count(records.RecordType.DIRS) == 1
    # What compaction writes for a live dataset replays to the same dataset.
    replayed, _ = catalog_replay.replay(found)
    [(dataset_id, entry)] = replayed.items()
    rewritten = records.start_records(dataset_id, entry.created_ns, entry.name)
    for block in entry.blocks:
        rewritten += records.block_records(dataset_id, block)
    rewritten += records.dirs_records(dataset_id, entry.dirs)
    rewritten.append((records.RecordType.SEAL, records.encode_seal(dataset_id)))
    again, _ = catalog_replay.replay(rewritten)
    assert again[dataset_id].dirs == entry.dirs
    block = records.SampleBlock.concat(again[dataset_id].blocks)
    assert block.block_crc.tolist() == records.SampleBlock.concat(entry.blocks).block_crc.tolist()


def test_a_blocks_record_that_does_not_fit_its_samples_is_ignored(tmp_path):
    store = open_store(tmp_path / "data")
    ingest(store, "ds", FILES)
    store.close()
    path = str(tmp_path / "data" / "catalog.log")
    found = []
    for record_type, payload in cat.scan(path).records:
        if record_type is records.RecordType.BLOCKS:  # one CRC short
            dataset_id, block_bytes, crcs = records.decode_blocks(payload)
            payload = records.encode_blocks(dataset_id, block_bytes, crcs[:-1])
        found.append((record_type, payload))
    replayed, _ = catalog_replay.replay(found)
    [entry] = replayed.values()
    block = records.SampleBlock.concat(entry.blocks)
    assert block.block_crc is None  # whole-sample CRCs only, as for format 1


def test_a_directory_that_is_a_file_or_bad_is_refused(tmp_path):
    store = open_store(tmp_path / "data")
    try:
        session = store.ingests.begin("ds")
        with pytest.raises(InvalidArgument):
            session.add_directory("a/../b")
        session.add_directory("f/sub")
        session.start_file("f", 1, 0o100644, 1)
        session.write(b"x")
        with pytest.raises(InvalidArgument, match="'f' occurs as a file and a directory"):
            store.ingests.commit(session)
    finally:
        store.close()


def test_block_records_split_at_the_crc_bound(tmp_path, monkeypatch):
    monkeypatch.setattr("dlfs.limits.catalog_block_crcs_per_record", 4)
    store = open_store(tmp_path / "data")
    data = {f"s{i}": np.random.default_rng(i).bytes(3 * B + 5) for i in range(3)}
    ingest(store, "ds", data)
    store.close()
    store = open_store(tmp_path / "data")
    try:
        dataset = store.dataset("ds")
        for path, value in data.items():
            assert dataset.block_crcs(dataset.id_of(path)).tolist() == expected_blocks(value)
        dataset.check_invariants()
    finally:
        store.close()
    kinds = [t for t, _ in cat.scan(str(tmp_path / "data" / "catalog.log")).records]
    assert kinds.count(records.RecordType.BLOCKS) == 3
