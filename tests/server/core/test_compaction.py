"""Catalog compaction at start: only live datasets remain, nothing is lost, ids are not reused."""

from __future__ import annotations

import dataclasses
import os

from dlfs.server.config import ServerConfig
from dlfs.server.store import Store
from helpers.stores import store_ingest as ingest
from helpers.stores import store_read


def read_all(store, name):
    dataset = store.dataset(name)
    return store_read(store, dataset, range(len(dataset)))


def test_compaction_keeps_live_data_and_drops_dead_records(tmp_path):
    config = ServerConfig(data_dir=str(tmp_path / "data"))
    catalog = os.path.join(config.data_dir, "catalog.log")
    store = Store.open(config)
    keep = {f"k{i:03d}": bytes([i]) * 50 for i in range(200)}
    ingest(store, "keep", keep)
    for version in range(20):
        ingest(store, "churn", {f"f{i:03d}": bytes([version]) * 10 for i in range(300)},
               replace=version > 0)
    ingest(store, "gone", {"x": b"x"})
    store.delete("gone")
    last_id = store.dataset("churn").dataset_id
    store.close()
    before = os.path.getsize(catalog)

    store = Store.open(config)  # below the size threshold: untouched
    store.close()
    assert os.path.getsize(catalog) == before

    config = dataclasses.replace(config, catalog_compact_dead_bytes_min=0)
    store = Store.open(config)
    after = os.path.getsize(catalog)
    assert after < before / 5
    assert store.directory.names() == ["churn", "keep"]
    assert read_all(store, "keep") == [keep[k] for k in sorted(keep)]
    assert read_all(store, "churn") == [bytes([19]) * 10] * 300
    assert ingest(store, "new", {"n": b"n"}).samples == 1
    assert store.dataset("new").dataset_id > last_id + 1  # "gone" had last_id + 1
    store.close()

    store = Store.open(config)  # the compacted log replays like any other
    assert store.directory.names() == ["churn", "keep", "new"]
    assert read_all(store, "keep") == [keep[k] for k in sorted(keep)]
    store.close()


def test_striped_dataset_survives_restart_and_compaction(tmp_path):
    import crc32c
    import numpy as np
    import pytest

    from dlfs.errors import FailedPrecondition
    from dlfs.server.core.directory import Cluster

    config = ServerConfig(data_dir=str(tmp_path / "data"))
    cluster = Cluster(("a:1", "b:2"), 1, 0)
    store = Store.open(config)
    ingest(store, "churn", {"x": b"1"})
    ingest(store, "churn", {"x": b"2"}, replace=True)
    session = store.ingests.begin("striped", cluster=cluster)
    files = {f"{i:03d}": bytes([i]) * 10 for i in range(40)}
    for i, (path, data) in enumerate(sorted(files.items())):
        if i % 2 == 0:
            session.start_file(path, len(data), 0o100644, 1, holders=(0,))
            session.write(data)
        else:
            session.add_remote(path, len(data), 0o100644, 1, crc32c.crc32c(data), (1,))
    store.ingests.commit(session)
    store.close()

    config = dataclasses.replace(config, catalog_compact_dead_bytes_min=0)
    for _ in range(2):  # a plain restart, then one that compacts
        store = Store.open(config)
        dataset = store.dataset("striped")
        assert dataset.cluster == cluster
        assert dataset.holders[:, 0].tolist() == [i % 2 for i in range(40)]
        assert dataset.summary().members == ("a:1", "b:2")
        dataset.check_invariants()
        _, plan = store.reads.plan(dataset, ids=[0, 2, 38])
        payload = bytearray(plan.payload_bytes)
        for start, window in store.reads.read(dataset, plan):
            payload[start:start + len(window)] = window
        assert bytes(payload) == files["000"] + files["002"] + files["038"]
        with pytest.raises(FailedPrecondition, match="stored on b:2"):
            store.reads.plan(dataset, ids=[1])
        assert np.all(dataset.length == 10)
        store.close()
