"""The daemon's metrics: Prometheus counters and histograms in one registry.

One registry per daemon (not prometheus_client's global one), so several
stores in one process (tests) keep separate counts.  `dlfs-server
--metrics-listen HOST:PORT` serves it over HTTP for Prometheus; the Status
RPC (`dlfs status`) reads the same values.  Updating a counter costs about a
microsecond, so they are bumped per batch, never per sample.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from dlfs.types import DaemonStatus

# Batch latency buckets, seconds: from a warm small batch to a large cold one.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
                     10.0, 30.0)

# Failures that say something about the daemon (its disk, its data, its load)
# rather than about the request; an operator should see them in the log.
OPERATOR_CODES = frozenset({"DATA_LOSS", "RESOURCE_EXHAUSTED", "UNAVAILABLE"})

# The read calls counted in dlfs_batches_total (its "method" label).
READ_METHODS = ("GetBatch", "GetSmallBatch", "ReadRange", "DataBatch", "DataRange")


class Metrics:
    def __init__(self):
        self.started = time.time()
        self._served: dict = {}  # method -> its (batches, batch_latency) children
        self.registry = CollectorRegistry()
        r = self.registry
        self.samples_served = Counter("dlfs_samples_served", "Samples returned by reads", registry=r)
        self.bytes_served = Counter("dlfs_bytes_served", "Payload bytes returned by reads",
                                    registry=r)
        self.batches = Counter("dlfs_batches", "Read calls served (GetBatch, GetSmallBatch, ReadRange)",
                               ["method"], registry=r)
        self.batch_latency = Histogram("dlfs_batch_latency_seconds",
                                       "Time from request to last reply chunk", ["method"],
                                       buckets=LATENCY_BUCKETS_S, registry=r)
        self.ranges_read = Counter("dlfs_ranges_read",
                                   "Coalesced ranges read (one pread each)", registry=r)
        self.samples_coalesced = Counter(
            "dlfs_samples_coalesced", "Samples that shared a range with another sample", registry=r)
        self.cache_hits = Counter("dlfs_cache_hit_ranges",
                                  "Ranges served from the page cache without waiting", registry=r)
        self.cache_misses = Counter("dlfs_cache_miss_ranges",
                                    "Ranges that had to wait for the device", registry=r)
        self.sendfile_bytes = Counter(
            "dlfs_sendfile_bytes",
            "Payload bytes sent straight from the page cache by sendfile (no copy in the daemon)",
            registry=r)
        self.prefetch_hints = Counter("dlfs_prefetch_hints", "Prefetch hints",
                                      ["outcome"], registry=r)
        self.errors = Counter("dlfs_errors", "Calls that ended with an error status",
                              ["code"], registry=r)
        self.ingested_samples = Counter("dlfs_ingested_samples", "Samples written by ingests",
                                        registry=r)
        self.ingested_bytes = Counter("dlfs_ingested_bytes", "Bytes written by ingests",
                                      registry=r)
        self.datasets = Gauge("dlfs_datasets", "Sealed datasets", registry=r)
        self.samples_stored = Gauge("dlfs_samples_stored", "Samples in sealed datasets", registry=r)
        self.bytes_stored = Gauge("dlfs_bytes_stored", "Bytes in sealed datasets", registry=r)
        self.catalog_bytes = Gauge("dlfs_catalog_bytes", "Size of the catalog log", registry=r)
        self.open_extents = Gauge("dlfs_open_extent_files", "Cached extent descriptors",
                                  registry=r)
        self.rpcs_in_flight = Gauge("dlfs_rpcs_in_flight", "Calls being served", registry=r)
        self.data_connections = Gauge("dlfs_data_connections",
                                      "Connections served on the data path (past HELLO)",
                                      registry=r)
        self.data_handshakes = Gauge("dlfs_data_handshakes",
                                     "Data path connections accepted and not yet past HELLO",
                                     registry=r)
        self.data_accept_errors = Counter(
            "dlfs_data_accept_errors", "Failed accepts on the data path's listeners, by errno "
            "(EMFILE, ENFILE: out of descriptors; ENOBUFS, ENOMEM: of kernel memory)",
            ["errno"], registry=r)
        self.data_refused = Counter(
            "dlfs_data_refused_connections", "Data path connections refused or cut off before "
            "they were served, by reason (connections, peer_share, handshake_deadline, "
            "handshake_evicted, unauthenticated, malformed, version, descriptors, threads)",
            ["reason"], registry=r)
        self.data_cut_off = Counter(
            "dlfs_data_cut_off_connections", "Served data path connections the daemon ended "
            "for their client's pace, by reason (idle; a request, or a reply, not whole "
            "within its deadline or stalled)", ["reason"], registry=r)
        self.warm_bytes = Counter("dlfs_warm_bytes",
                                  "Bytes warm-ups read into the page cache", registry=r)
        self.warmups = Counter("dlfs_warmups", "Warm-ups ended, by state (warm, partial, "
                               "stopped, failed)", ["state"], registry=r)
        self.warmups_active = Gauge("dlfs_warmups_active", "Warm-ups queued or running",
                                    registry=r)
        self.warm_budget_bytes = Gauge("dlfs_warm_budget_bytes", "Bytes all warm-ups together "
                                       "may keep in the page cache (--warm-memory-share)",
                                       registry=r)

    def serve(self, listen: str) -> str:
        """Serve /metrics over HTTP on HOST:PORT (0 picks a port); return the bound address."""
        host, _, port = listen.rpartition(":")
        server, _thread = start_http_server(int(port), addr=host, registry=self.registry)
        return f"{host}:{server.server_port}"

    def value(self, name: str, **labels) -> float:
        """Current value of a sample, for the Status RPC (0 if never set)."""
        result = self.registry.get_sample_value(name, labels or None)
        return float(result or 0.0)

    def count_read(self, method: str, plan, seconds: float) -> None:
        """Count one read call (one of READ_METHODS) that served `plan` (a
        reader.BatchPlan) in `seconds`.  A few microseconds: once per call."""
        self.batches.labels(method).inc()
        self.batch_latency.labels(method).observe(seconds)
        self.samples_served.inc(plan.request_lengths.size)
        self.bytes_served.inc(plan.payload_bytes)
        self.samples_coalesced.inc(plan.sample_ids.size - plan.ranges)

    def count_served(self, method: str, samples: int, payload_bytes: int,
                     seconds: float) -> None:
        """Count one data path request (one of READ_METHODS) of `samples` samples."""
        children = self._served.get(method)
        if children is None:  # once per method: labels() validates and locks each time
            children = self._served[method] = (self.batches.labels(method),
                                               self.batch_latency.labels(method))
        children[0].inc()
        children[1].observe(seconds)
        self.samples_served.inc(samples)
        self.bytes_served.inc(payload_bytes)

    def set_stored(self, datasets: list, catalog_bytes: int, open_extents: int) -> None:
        """Bring the stored-data gauges up to date (`datasets`: the sealed
        DatasetIndexes).  O(datasets)."""
        self.datasets.set(len(datasets))
        self.samples_stored.set(sum(len(d) for d in datasets))
        self.bytes_stored.set(sum(d.total_bytes for d in datasets))
        self.catalog_bytes.set(catalog_bytes)
        self.open_extents.set(open_extents)

    def status(self, data_dir: str, ingests_running: int, sendfile: str = "") -> DaemonStatus:
        """The current values as a Status (the stored-data gauges as last set)."""
        errors = {s.labels["code"]: int(s.value) for s in self.errors.collect()[0].samples
                  if s.name.endswith("_total")}
        return DaemonStatus(
            uptime_s=time.time() - self.started, data_dir=data_dir,
            datasets=int(self.value("dlfs_datasets")),
            samples=int(self.value("dlfs_samples_stored")),
            bytes=int(self.value("dlfs_bytes_stored")),
            catalog_bytes=int(self.value("dlfs_catalog_bytes")),
            ingests_running=ingests_running,
            rpcs_in_flight=int(self.value("dlfs_rpcs_in_flight")),
            samples_served=int(self.value("dlfs_samples_served_total")),
            bytes_served=int(self.value("dlfs_bytes_served_total")),
            batches_served=int(sum(self.value("dlfs_batches_total", method=m)
                                   for m in READ_METHODS)),
            cache_hit_ranges=int(self.value("dlfs_cache_hit_ranges_total")),
            cache_miss_ranges=int(self.value("dlfs_cache_miss_ranges_total")),
            errors=errors, data_connections=int(self.value("dlfs_data_connections")),
            sendfile=sendfile, sendfile_bytes=int(self.value("dlfs_sendfile_bytes_total")))
