"""Read leases: a delete or replace never pulls extents from under a read in flight."""

from __future__ import annotations

import os

import pytest

from dlfs.errors import NotFound
from dlfs.server.config import ServerConfig
from dlfs.server.store import Store
from helpers.stores import store_ingest as ingest
from helpers.stores import store_read as read


@pytest.fixture
def store(tmp_path):
    store = Store.open(ServerConfig(data_dir=str(tmp_path / "data")))
    yield store
    store.close()


def extent_dirs(store) -> list[str]:
    return sorted(os.listdir(os.path.join(store.config.data_dir, "extents")))


def test_a_replace_waits_for_reads_of_the_old_dataset(store):
    ingest(store, "ds", {"a": b"old-a", "b": b"old-b"})
    with store.reading("ds") as old:
        ingest(store, "ds", {"a": b"new-a"}, replace=True)
        assert len(extent_dirs(store)) == 2  # the old extents stay while the read runs
        assert read(store, old, [1, 0]) == [b"old-b", b"old-a"]
        with store.reading("ds") as new:  # new readers get the new dataset at once
            assert read(store, new, [0]) == [b"new-a"]
    assert len(extent_dirs(store)) == 1  # freed when the last old read ended


def test_a_delete_waits_for_every_read_and_then_frees(store):
    ingest(store, "ds", {"a": b"alpha"})
    with store.reading("ds") as first:
        with store.reading("ds") as second:
            store.delete("ds")
            with pytest.raises(NotFound):
                with store.reading("ds"):
                    pass
            assert read(store, second, [0]) == [b"alpha"]
        assert len(extent_dirs(store)) == 1  # one read still runs
        assert read(store, first, [0]) == [b"alpha"]
    assert extent_dirs(store) == []


def test_a_failed_read_releases_its_lease(store):
    ingest(store, "ds", {"a": b"alpha"})
    with pytest.raises(RuntimeError):
        with store.reading("ds"):
            raise RuntimeError("the client went away")
    store.delete("ds")
    assert extent_dirs(store) == []  # nothing held it back
