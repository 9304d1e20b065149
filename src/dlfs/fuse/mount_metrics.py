"""The mount's Prometheus metrics (`dlfs-mount --metrics-listen [HOST:]PORT`).

Everything is read from the mount's own counters when Prometheus scrapes
(`MountCollector`), so nothing is counted twice and nothing goes stale:

- `dlfs_mount_requests_total{op}`: FUSE requests the kernel sent, by operation;
- `dlfs_mount_daemon_calls_total{kind}`: calls the mount made to the daemon;
- `dlfs_mount_extent_read_files_total`, `dlfs_mount_extent_read_bytes_total`:
  files read straight from the daemon's extents (on the daemon's host);
- `dlfs_mount_splice_reads_total`, `dlfs_mount_splice_read_bytes_total`:
  READs answered by splice from the extent pages;
- `dlfs_mount_daemon_up`: 1 while the daemon answers, 0 while the mount waits
  for it;
- `dlfs_build_info{version}`, and the process and Python metrics.

Cost of a scrape: a copy of each counter table under its lock.
"""

from __future__ import annotations

import prometheus_client
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from dlfs.version import __version__

prometheus_client.disable_created_metrics()  # as the daemon: no `_created` twins


class MountCollector:
    """The mount's counters as metric families, read at each scrape.  `operations` is the
    mount's DlfsOperations: its backend, and its extent and splice readers (None when off)."""

    def __init__(self, session, operations):
        self.session = session
        self.operations = operations

    def collect(self):
        requests = CounterMetricFamily("dlfs_mount_requests", "FUSE requests the kernel sent, "
                                       "by operation", labels=["op"])
        for op, n in sorted(self.session.request_counts().items()):
            requests.add_metric([op], n)
        yield requests
        backend = self.operations.backend
        calls = CounterMetricFamily("dlfs_mount_daemon_calls", "Calls the mount made to the "
                                    "daemon, by kind", labels=["kind"])
        for kind, n in sorted(backend.call_counts().items()):
            calls.add_metric([kind], n)
        yield calls
        yield GaugeMetricFamily("dlfs_mount_daemon_up", "1 while the daemon answers, 0 while "
                                "the mount waits for it", value=0 if backend.down else 1)
        extents = self.operations.extents.counts() if self.operations.extents else {}
        yield CounterMetricFamily("dlfs_mount_extent_read_files", "Files read straight from "
                                  "the daemon's extents", value=extents.get("files", 0))
        yield CounterMetricFamily("dlfs_mount_extent_read_bytes", "Bytes read straight from "
                                  "the daemon's extents", value=extents.get("bytes", 0))
        splice = self.operations.splice
        yield CounterMetricFamily("dlfs_mount_splice_reads", "READs answered by splice from "
                                  "the extent pages", value=splice.reads if splice else 0)
        yield CounterMetricFamily("dlfs_mount_splice_read_bytes", "Bytes of READs answered "
                                  "by splice", value=splice.bytes if splice else 0)
        info = GaugeMetricFamily("dlfs_build_info", "The DLFS release this mount runs "
                                 "(value 1)", labels=["version"])
        info.add_metric([__version__], 1)
        yield info


def serve_metrics(listen: str, session, operations) -> str:
    """Serve the mount's metrics at http://HOST:PORT/metrics (`listen` is [HOST:]PORT; a
    port alone listens on 127.0.0.1, port 0 picks one); the bound HOST:PORT."""
    host, _, port = listen.rpartition(":")
    host = host or "127.0.0.1"
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    registry.register(MountCollector(session, operations))
    server, _thread = start_http_server(int(port), addr=host, registry=registry)
    return f"{host}:{server.server_port}"
