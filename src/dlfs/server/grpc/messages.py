"""Conversions between the storage core's types and the generated messages.

The only server module besides service.py that touches `dlfs_pb2`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dlfs.proto import dlfs_pb2 as pb
from dlfs import limits
from dlfs.errors import InvalidArgument
from dlfs.server.core.directory import Cluster, DatasetIndex
from dlfs.types import DaemonStatus, DatasetInfo, Entry

# extent u32 + offset u64 + length u64 + crc u32 + holders (u16 x replicas_max at most)
INDEX_BYTES_PER_SAMPLE = 24 + 2 * limits.replicas_max


def dataset_info(summary: DatasetInfo) -> pb.DatasetInfo:
    return pb.DatasetInfo(name=summary.name, samples=summary.samples, bytes=summary.bytes,
                          sealed=summary.sealed, created_unix_ns=summary.created_ns,
                          extents=summary.extents, members=list(summary.members),
                          replicas=summary.replicas, member_index=summary.member_index,
                          generation=summary.generation, ingest_state=summary.ingest_state,
                          kind=summary.kind)


def ingest_progress(info) -> pb.IngestProgress:
    """A `dlfs.server.core.checkpoints.ProgressInfo` as its message."""
    cluster = info.cluster
    return pb.IngestProgress(
        dataset=info.name, state=info.state, samples=info.samples, bytes=info.bytes,
        digest=info.digest, last_path=info.last_path, replace=info.replace,
        members=list(cluster.members) if cluster else [],
        replicas=cluster.replicas if cluster else 0,
        member_index=cluster.member_index if cluster else 0,
        generation=cluster.generation if cluster else 0,
        parked_unix_ns=info.parked_ns, expires_in_s=info.expires_in_s)


def cluster(start: pb.IngestStart) -> Cluster | None:
    """The striping of an ingest (None: one daemon).  Raises InvalidArgument."""
    members = list(start.members)
    if not members:
        if start.replicas or start.member_index or start.generation:
            raise InvalidArgument("replicas, member_index and generation need the list of "
                                  "members")
        return None
    if start.generation and start.generation < limits.cluster_generation_min:
        raise InvalidArgument(f"a striped ingest's generation must be at least "
                              f"{limits.cluster_generation_min} (apart from dataset ids)")
    if len(members) > limits.members_max or len(set(members)) != len(members) or not all(members):
        raise InvalidArgument(f"members must be 1..{limits.members_max} distinct, non-empty "
                              "daemon addresses")
    if not 1 <= start.replicas <= min(len(members), limits.replicas_max):
        raise InvalidArgument(f"replicas {start.replicas} must be in 1..{min(len(members), limits.replicas_max)} "
                              f"for {len(members)} members")
    if start.member_index >= len(members):
        raise InvalidArgument(f"member_index {start.member_index} is not below {len(members)}")
    return Cluster(tuple(members), start.replicas, start.member_index, start.generation)


def entry(info: Entry) -> pb.Entry:
    return pb.Entry(name=info.name, path=info.path,
                    kind=pb.DIRECTORY if info.is_dir else pb.FILE, size=info.size,
                    mode=info.mode, mtime_ns=info.mtime_ns, id=info.id, crc32c=info.crc32c,
                    children=info.children, version=info.version)


def ids_array(repeated) -> np.ndarray:
    """A repeated int64 field as an int64 array (one C-level pass)."""
    return np.fromiter(repeated, dtype=np.int64, count=len(repeated))


def batch_header(chunk: pb.BatchChunk, payload_bytes: int, offsets: np.ndarray,
                 lengths: np.ndarray) -> pb.BatchChunk:
    """Fill the first chunk's payload size and per-sample offsets and lengths."""
    chunk.payload_bytes = payload_bytes
    chunk.offsets.extend(offsets.tolist())
    chunk.lengths.extend(lengths.tolist())
    return chunk


def index_chunk(dataset: DatasetIndex, first: int, stop: int) -> pb.IndexChunk:
    """Location arrays of samples [first, stop) as little-endian bytes."""
    part = slice(first, stop)
    return pb.IndexChunk(
        first_id=first,
        extent=dataset.extent[part].astype("<u4").tobytes(),
        offset=dataset.offset[part].astype("<u8").tobytes(),
        length=dataset.length[part].astype("<u8").tobytes(),
        crc32c=dataset.crc[part].astype("<u4").tobytes(),
        holders=(dataset.holders[part].astype("<u2").tobytes()
                 if dataset.holders is not None else b""),
    )


def status_reply(status: DaemonStatus, version: str, metrics_address: str) -> pb.StatusReply:
    """The StatusReply of `status`, with what only the service knows."""
    fields = dataclasses.asdict(status)
    del fields["address"]
    fields.update(version=version, metrics_address=metrics_address,
                  data_workers=[pb.DataWorker(**worker) for worker in fields["data_workers"]])
    return pb.StatusReply(**fields)


def data_path_info(info) -> pb.DataPathInfo:
    """GetDataPath's reply from a `datapath.DataPathInfo`."""
    return pb.DataPathInfo(enabled=info.enabled, reason=info.reason, version=info.version,
                           port=info.port, unix_socket=info.unix_socket, instance=info.instance)
