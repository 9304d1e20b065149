"""Client-side value types and their conversion from the generated messages."""

from __future__ import annotations

import dataclasses

from dlfs.proto import dlfs_pb2 as pb
from dlfs.types import DatasetInfo, Entry


def dataset_info(message: pb.DatasetInfo) -> DatasetInfo:
    return DatasetInfo(message.name, message.samples, message.bytes, message.sealed,
                       message.created_unix_ns, message.extents, tuple(message.members),
                       message.replicas, message.member_index, message.generation)


def entry(message: pb.Entry) -> Entry:
    return Entry(message.name, message.path, message.kind == pb.DIRECTORY, message.size,
                 message.mode, message.mtime_ns, message.id, message.crc32c, message.children)


@dataclasses.dataclass(frozen=True)
class DaemonStatus:
    address: str
    version: str
    uptime_s: float
    data_dir: str
    metrics_address: str
    datasets: int
    samples: int
    bytes: int
    catalog_bytes: int
    ingests_running: int
    rpcs_in_flight: int
    samples_served: int
    bytes_served: int
    batches_served: int
    cache_hit_ranges: int
    cache_miss_ranges: int
    errors: dict
    data_connections: int = 0


def daemon_status(address: str, m: pb.StatusReply) -> DaemonStatus:
    return DaemonStatus(address, m.version, m.uptime_s, m.data_dir, m.metrics_address, m.datasets,
                        m.samples, m.bytes, m.catalog_bytes, m.ingests_running, m.rpcs_in_flight,
                        m.samples_served, m.bytes_served, m.batches_served, m.cache_hit_ranges,
                        m.cache_miss_ranges, dict(m.errors), m.data_connections)
