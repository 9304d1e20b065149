"""A real daemon's /metrics: state read when scraped, Prometheus names, process metrics."""

from __future__ import annotations

import pytest

import dlfs
from dlfs import Client
from helpers.daemons import metric_samples
from helpers.trees import write_tree


def test_stored_state_is_current_at_every_scrape(daemon_factory, tmp_path):
    daemon = daemon_factory(extra_args=["--metrics-listen", "127.0.0.1:0"])
    write_tree(tmp_path / "src", {f"{i}.bin": b"x" * 100 for i in range(5)})
    with Client(daemon.address) as client:
        assert metric_samples(client)[("dlfs_datasets", ())] == 0
        for name in ("a", "b", "c", "d"):
            client.ingest(str(tmp_path / "src"), name)
        # No Status call in between (`dlfs status` used to be what refreshed them).
        values = metric_samples(client)
        assert values[("dlfs_datasets", ())] == 4
        assert values[("dlfs_stored_samples", ())] == 20
        assert values[("dlfs_stored_bytes", ())] == 2000
        assert values[("dlfs_ingests", (("state", "receiving"),))] == 0
        client.delete("b")
        values = metric_samples(client)
        assert (values[("dlfs_datasets", ())], values[("dlfs_stored_samples", ())]) == (3, 15)
        status = client.status()
        assert (status.datasets, status.samples, status.bytes) == (3, 15, 1500)


def test_names_labels_and_process_metrics(daemon_factory, tmp_path):
    daemon = daemon_factory(extra_args=["--metrics-listen", "127.0.0.1:0"])
    write_tree(tmp_path / "src", {f"{i}.bin": bytes([i]) * 1000 for i in range(8)})
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")
        client.get_batch(range(8), dataset="ds")
        with pytest.raises(dlfs.NotFound):
            client.stat("ds", "missing.bin")
        values = metric_samples(client)
    names = {name for name, _ in values}
    assert not [name for name in names if name.endswith("_created")]
    assert values[("dlfs_build_info", (("version", dlfs.__version__),))] == 1
    assert values[("process_resident_memory_bytes", ())] > 0
    assert values[("process_open_fds", ())] > 0
    assert any(name == "python_info" for name in names)
    assert values[("dlfs_errors_total", (("code", "NOT_FOUND"), ("method", "Stat")))] == 1
    assert values[("dlfs_served_samples_total", ())] == 8
    assert values[("dlfs_served_bytes_total", ())] == 8000
    assert values[("dlfs_reads_total", (("method", "DataBatch"),))] == 1
    hits = values[("dlfs_cache_ranges_total", (("result", "hit"),))]
    misses = values[("dlfs_cache_ranges_total", (("result", "miss"),))]
    assert hits + misses >= 1
    # Counters end in _total, byte metrics in _bytes (units last).
    assert {"dlfs_served_bytes_total", "dlfs_ingested_bytes_total", "dlfs_sendfile_bytes_total",
            "dlfs_warm_bytes_total", "dlfs_stored_bytes", "dlfs_catalog_bytes"} <= names
