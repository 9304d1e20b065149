"""The daemon's metrics: Prometheus counters and histograms, and the state read at scrape.

One registry per daemon (not prometheus_client's global one), so several
stores in one process (tests) keep separate counts.  `dlfs-server
--metrics-listen HOST:PORT` serves it over HTTP for Prometheus; the Status
RPC (`dlfs status`) reads the same values.

Two kinds of metric:

- events (reads served, bytes, errors, ingests, warm-ups) are counted where
  they happen.  A counter costs about a microsecond, so they are bumped per
  call, never per sample;
- state (datasets, stored samples and bytes, catalog size, open extent
  files, ingests by state) is read from the Store when Prometheus scrapes
  (`StoredState`, registered with `read_state_from`), so it is never stale.
  Cost: O(datasets) per scrape.

Names follow Prometheus' conventions: `dlfs_` prefix, base units, the unit
last and `_total` on counters (`dlfs_served_bytes_total`); one metric with
a label rather than twins (`dlfs_cache_ranges_total{result="hit"|"miss"}`).
No `_created` series.  The process metrics (`process_*`, `python_*`) come
from prometheus_client's collectors; `dlfs_build_info{version}` is 1.

Counts other processes keep (the data path's worker processes) are added
at every Status call and scrape: `add_source(samples)` names a function
returning (sample name, labels, value) triples, summed into this
registry's samples of the same name and labels (`MergedRegistry`).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Callable, Iterable

import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.samples import Sample

from dlfs.types import DaemonStatus
from dlfs.version import __version__

# Every counter's `_created` twin doubles the series and says nothing a
# `process_start_time_seconds` does not; prometheus_client's switch is global.
prometheus_client.disable_created_metrics()

# Read latency buckets, seconds: from a warm small batch to a large cold one.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
                     10.0, 30.0)

# Failures that say something about the daemon (its disk, its data, its load)
# rather than about the request; an operator should see them in the log.
OPERATOR_CODES = frozenset({"DATA_LOSS", "RESOURCE_EXHAUSTED", "UNAVAILABLE"})

# The read calls counted in dlfs_reads_total (its "method" label).
READ_METHODS = ("GetBatch", "GetSmallBatch", "ReadRange", "DataBatch", "DataRange")

# Ingest states of dlfs_ingests{state}.
INGEST_STATES = ("receiving", "prepared", "parked")


@dataclasses.dataclass(frozen=True)
class StoredState:
    """What the daemon holds now, read at each scrape and each Status call."""

    datasets: int  # sealed
    samples: int  # in sealed datasets
    bytes: int  # in sealed datasets
    catalog_bytes: int
    open_extent_files: int
    ingests: dict  # state (INGEST_STATES) -> count


def short_method(method: str) -> str:
    """"Stat" for "/dlfs.v1.Dlfs/Stat"; data path names ("DataBatch") as they are."""
    return method.rpartition("/")[2]


class _StateCollector:
    """Gauges computed from `read()` (a StoredState) when the registry is collected."""

    def __init__(self, read: Callable[[], StoredState]):
        self.read = read

    def collect(self):
        state = self.read()
        for name, doc, value in (
                ("dlfs_datasets", "Sealed datasets", state.datasets),
                ("dlfs_stored_samples", "Samples in sealed datasets", state.samples),
                ("dlfs_stored_bytes", "Payload bytes in sealed datasets", state.bytes),
                ("dlfs_catalog_bytes", "Size of the catalog log", state.catalog_bytes),
                ("dlfs_open_extent_files", "Extent file descriptors held open (LRU)",
                 state.open_extent_files)):
            yield GaugeMetricFamily(name, doc, value=value)
        ingests = GaugeMetricFamily("dlfs_ingests", "Unsealed ingests, by state (receiving, "
                                    "prepared, parked)", labels=["state"])
        for ingest_state in INGEST_STATES:
            ingests.add_metric([ingest_state], state.ingests.get(ingest_state, 0))
        yield ingests


class Metrics:
    def __init__(self):
        self.started = time.time()
        self._served: dict = {}  # method -> its (reads, read_duration) children
        self._read_state: Callable[[], StoredState] | None = None
        self._sources: list[Callable[[], Iterable[tuple[str, dict, float]]]] = []
        self._added: dict[tuple, float] = {}  # (name, sorted labels) -> sum of the sources
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        Gauge("dlfs_build_info", "The DLFS release this daemon runs (value 1)", ["version"],
              registry=r).labels(__version__).set(1)
        self.samples_served = Counter("dlfs_served_samples", "Samples returned by reads",
                                      registry=r)
        self.bytes_served = Counter("dlfs_served_bytes", "Payload bytes returned by reads",
                                    registry=r)
        self.reads = Counter("dlfs_reads", "Read calls served, by method (GetBatch, "
                             "GetSmallBatch, ReadRange; DataBatch, DataRange on the data path)",
                             ["method"], registry=r)
        self.read_duration = Histogram("dlfs_read_duration_seconds",
                                       "Time from a read's request to its last reply byte",
                                       ["method"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.ranges_read = Counter("dlfs_read_ranges",
                                   "Coalesced ranges read (one pread each)", registry=r)
        self.samples_coalesced = Counter(
            "dlfs_coalesced_samples", "Samples that shared a range with another sample",
            registry=r)
        cache_ranges = Counter("dlfs_cache_ranges", "Ranges probed in the page cache: hit "
                               "(served without waiting) or miss (waited for the device)",
                               ["result"], registry=r)
        self.cache_hits = cache_ranges.labels("hit")
        self.cache_misses = cache_ranges.labels("miss")
        self.sendfile_bytes = Counter(
            "dlfs_sendfile_bytes",
            "Payload bytes sent straight from the page cache by sendfile (no copy in the daemon)",
            registry=r)
        self.mapped_send_bytes = Counter(
            "dlfs_mapped_send_bytes",
            "Payload bytes of small cached samples sent from read-only mappings of the "
            "extents (one copy, page cache to socket)", registry=r)
        self.prefetch_hints = Counter("dlfs_prefetch_hints", "Prefetch hints, by outcome",
                                      ["outcome"], registry=r)
        self.errors = Counter("dlfs_errors", "Calls that ended with an error status, by status "
                              "code and method", ["code", "method"], registry=r)
        self.ingested_samples = Counter("dlfs_ingested_samples", "Samples written by ingests",
                                        registry=r)
        self.ingested_bytes = Counter("dlfs_ingested_bytes", "Bytes written by ingests",
                                      registry=r)
        self.rpcs_in_flight = Gauge("dlfs_rpcs_in_flight", "gRPC calls being served",
                                    registry=r)
        self.data_connections = Gauge("dlfs_data_connections",
                                      "Connections served on the data path (past HELLO)",
                                      registry=r)
        self.data_handshakes = Gauge("dlfs_data_handshakes",
                                     "Data path connections accepted and not yet past HELLO",
                                     registry=r)
        self.grpc_connections = Gauge(
            "dlfs_grpc_connections", "gRPC connections at the daemon's door, by state "
            "(pending: before their HTTP/2 preface and SETTINGS; open: relayed to gRPC, no "
            "call yet; calling)", ["state"], registry=r)
        self.grpc_refused = Counter(
            "dlfs_grpc_refused_connections", "gRPC connections the door turned away or broke "
            "off, by reason (handshake_evicted, handshake_deadline, not_http2, idle_evicted, "
            "connections, peer_share, descriptors, threads)", ["reason"], registry=r)
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

    def read_state_from(self, read: Callable[[], StoredState]) -> None:
        """Read the stored-data gauges from `read()` at every scrape and Status call
        (the Store registers itself once)."""
        assert self._read_state is None, "one state source per registry"
        self._read_state = read
        self.registry.register(_StateCollector(read))

    def serve(self, listen: str) -> str:
        """Serve /metrics over HTTP on HOST:PORT (0 picks a port); return the bound address."""
        host, _, port = listen.rpartition(":")
        server, _thread = start_http_server(int(port), addr=host,
                                            registry=MergedRegistry(self))
        return f"{host}:{server.server_port}"

    def add_source(self, source: Callable[[], Iterable[tuple[str, dict, float]]]) -> None:
        """Add `source()`'s samples to this registry's at every Status call and scrape."""
        self._sources.append(source)

    def refresh(self) -> None:
        """Ask the sources for their samples now (what `value` and scrapes add)."""
        added: dict[tuple, float] = collections.defaultdict(float)
        for source in self._sources:
            for name, labels, value in source():
                added[(name, tuple(sorted(labels.items())))] += value
        self._added = dict(added)

    def value(self, name: str, **labels) -> float:
        """Current value of a counted sample, for the Status RPC (0 if never set), with
        the sources' as last refreshed."""
        result = self.registry.get_sample_value(name, labels or None)
        return float(result or 0.0) + self._added.get((name, tuple(sorted(labels.items()))), 0.0)

    def count_read(self, method: str, plan, seconds: float) -> None:
        """Count one read call (one of READ_METHODS) that served `plan` (a
        reader.BatchPlan) in `seconds`.  A few microseconds: once per call."""
        self.reads.labels(method).inc()
        self.read_duration.labels(method).observe(seconds)
        self.samples_served.inc(plan.request_lengths.size)
        self.bytes_served.inc(plan.payload_bytes)
        self.samples_coalesced.inc(plan.sample_ids.size - plan.ranges)

    def count_served(self, method: str, samples: int, payload_bytes: int,
                     seconds: float) -> None:
        """Count one data path request (one of READ_METHODS) of `samples` samples."""
        children = self._served.get(method)
        if children is None:  # once per method: labels() validates and locks each time
            children = self._served[method] = (self.reads.labels(method),
                                               self.read_duration.labels(method))
        children[0].inc()
        children[1].observe(seconds)
        self.samples_served.inc(samples)
        self.bytes_served.inc(payload_bytes)

    def count_error(self, code: str, method: str) -> None:
        """Count a call that ended with status `code` (a status code name); `method` as
        gRPC names it ("/dlfs.v1.Dlfs/Stat") or a data path request ("DataBatch")."""
        self.errors.labels(code, short_method(method)).inc()

    def status(self, data_dir: str, sendfile: str = "", mapped_sends: str = "") -> DaemonStatus:
        """The current values as a Status: the counters, and the stored state read now."""
        assert self._read_state is not None, "the Store registers its state first"
        state = self._read_state()
        self.refresh()
        errors: dict[str, int] = {}
        family = self.errors.describe()[0].name
        for merged in MergedRegistry(self, refresh=False).collect():
            if merged.name != family:
                continue
            for sample in merged.samples:
                if sample.name.endswith("_total"):
                    code = sample.labels["code"]
                    errors[code] = errors.get(code, 0) + int(sample.value)
        return DaemonStatus(
            uptime_s=time.time() - self.started, data_dir=data_dir,
            datasets=state.datasets, samples=state.samples, bytes=state.bytes,
            catalog_bytes=state.catalog_bytes,
            ingests_running=state.ingests.get("receiving", 0) + state.ingests.get("prepared", 0),
            rpcs_in_flight=int(self.value("dlfs_rpcs_in_flight")),
            samples_served=int(self.value("dlfs_served_samples_total")),
            bytes_served=int(self.value("dlfs_served_bytes_total")),
            batches_served=int(sum(self.value("dlfs_reads_total", method=m)
                                   for m in READ_METHODS)),
            cache_hit_ranges=int(self.value("dlfs_cache_ranges_total", result="hit")),
            cache_miss_ranges=int(self.value("dlfs_cache_ranges_total", result="miss")),
            errors=errors, data_connections=int(self.value("dlfs_data_connections")),
            sendfile=sendfile, sendfile_bytes=int(self.value("dlfs_sendfile_bytes_total")),
            mapped_sends=mapped_sends,
            mapped_send_bytes=int(self.value("dlfs_mapped_send_bytes_total")))


class MergedRegistry:
    """A registry's samples with its Metrics' sources added (what /metrics serves):
    a sample of the same name and labels is summed, one the registry lacks is
    appended to its family (in the order the sources gave it)."""

    def __init__(self, metrics: Metrics, refresh: bool = True):
        self._metrics = metrics
        self._refresh = refresh

    def collect(self):
        if self._refresh:
            self._metrics.refresh()
        added = dict(self._metrics._added)
        for family in self._metrics.registry.collect():
            samples = []
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                samples.append(sample._replace(value=sample.value + added.pop(key))
                               if key in added else sample)
            names = {family.name + suffix for suffix in ("", "_total", "_bucket", "_count",
                                                          "_sum")}
            for key in [k for k in added if k[0] in names]:
                samples.append(Sample(key[0], dict(key[1]), added.pop(key)))
            family.samples = samples
            yield family

    def restricted_registry(self, names):
        return self  # the exposition's ?name[]= filter: every family is served
