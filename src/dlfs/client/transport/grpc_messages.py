"""The generated messages and the client's plain values, converted both ways.

The one place where the client's requests (`read_requests`,
`ingest_requests`) become protobuf and the daemon's answers become
`dlfs.types` and `control_replies` values.  Each conversion is field for field;
id arrays are copied into a message once (`tolist`, in C).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dlfs.client.transport.ingest_requests import IngestStart
from dlfs.client.transport.read_requests import BatchRequest, PrefetchRequest, RangeRequest
from dlfs.client.transport.control_replies import (
    DataPathOffer,
    SampleLocations,
    ScrubUpdate,
    UnsealedIngest,
)
from dlfs.proto import dlfs_pb2 as pb
from dlfs.types import DaemonStatus, DatasetInfo, DataWorkerStatus, Entry, WarmInfo


# --- requests --------------------------------------------------------------------------

def batch_message(request: BatchRequest) -> pb.GetBatchRequest:
    message = pb.GetBatchRequest(dataset=request.dataset, skip_verify=not request.verify,
                                 generation=request.generation)
    if request.paths is not None:
        message.paths.extend(request.paths)
    else:
        message.ids.extend(request.ids.tolist())
    if request.prefetch_ids.size:
        message.prefetch_ids.extend(request.prefetch_ids.tolist())
    return message


def prefetch_message(request: PrefetchRequest) -> pb.PrefetchRequest:
    message = pb.PrefetchRequest(dataset=request.dataset)
    if request.paths is not None:
        message.paths.extend(request.paths)
    else:
        message.ids.extend(request.ids.tolist())
    return message


def range_message(request: RangeRequest) -> pb.ReadRangeRequest:
    message = pb.ReadRangeRequest(dataset=request.dataset, offset=request.offset,
                                  length=request.length, skip_verify=not request.verify,
                                  generation=request.generation)
    if request.path is not None:
        message.path = request.path
    else:
        message.id = request.sample_id
    return message


def lookup_message(dataset: str, ids: np.ndarray | None, paths) -> pb.LookupRequest:
    message = pb.LookupRequest(dataset=dataset)
    if paths is not None:
        message.paths.extend(paths)
    if ids is not None:
        message.ids.extend(np.asarray(ids, dtype=np.int64).tolist())
    return message


def start_message(start: IngestStart) -> pb.IngestStart:
    return pb.IngestStart(dataset=start.dataset, replace=start.replace,
                          resumable=start.resumable, resume=start.resume_from is not None,
                          resume_from=start.resume_from or 0, members=start.members,
                          replicas=start.replicas, member_index=start.member_index,
                          prepare_only=start.prepare_only, generation=start.generation)


# --- answers ---------------------------------------------------------------------------

def dataset_info(message: pb.DatasetInfo) -> DatasetInfo:
    return DatasetInfo(message.name, message.samples, message.bytes, message.sealed,
                       message.created_unix_ns, message.extents, tuple(message.members),
                       message.replicas, message.member_index, message.generation,
                       ingest_state=message.ingest_state, kind=message.kind or "dataset")


def entry(message: pb.Entry) -> Entry:
    return Entry(message.name, message.path, message.kind == pb.DIRECTORY, message.size,
                 message.mode, message.mtime_ns, message.id, message.crc32c, message.children,
                 message.version)


def daemon_status(address: str, m: pb.StatusReply) -> DaemonStatus:
    """The DaemonStatus a StatusReply carries (field for field), as `address` answered it."""
    fields = {f.name: getattr(m, f.name) for f in dataclasses.fields(DaemonStatus)
              if f.name != "address"}
    fields["errors"] = dict(m.errors)
    fields["data_workers"] = tuple(
        DataWorkerStatus(**{f.name: getattr(w, f.name) for f in dataclasses.fields(
            DataWorkerStatus)}) for w in m.data_workers)
    return DaemonStatus(address=address, **fields)


def warm_info(address: str, reply: pb.WarmReply) -> WarmInfo:
    return WarmInfo(address, reply.dataset, reply.generation, reply.state, reply.bytes_total,
                    reply.bytes_warmed, reply.budget_bytes, reply.fits, reply.message,
                    reply.bytes_resident)


def unsealed_ingest(m: pb.IngestProgress) -> UnsealedIngest:
    return UnsealedIngest(m.dataset, m.state, m.samples, m.bytes, m.digest, m.last_path,
                          m.replace, tuple(m.members), m.replicas, m.member_index,
                          m.generation, m.parked_unix_ns, m.expires_in_s)


def scrub_update(m: pb.ScrubProgress) -> ScrubUpdate:
    return ScrubUpdate(m.samples_checked, m.bytes_checked, m.samples_total,
                       tuple(entry(e) for e in m.damaged), tuple(m.reasons), m.done)


def sample_locations(chunks: list[pb.IndexChunk]) -> SampleLocations:
    """A GetIndex stream's chunks (in order) as one index: arrays joined, no per-sample work."""
    if not chunks:
        empty = np.empty(0, np.uint32)
        return SampleLocations(0, 0, empty, empty.astype(np.uint64), empty.astype(np.uint64),
                               empty)
    members, replicas = (), 0
    for chunk in chunks:
        if chunk.members:
            members, replicas = tuple(chunk.members), chunk.replicas

    def joined(field: str, dtype: str) -> np.ndarray:
        return np.frombuffer(b"".join(getattr(c, field) for c in chunks), dtype)

    holders = joined("holders", "<u2").reshape(-1, replicas) if members else None
    first = chunks[0]
    return SampleLocations(first.generation, first.samples, joined("extent", "<u4"),
                           joined("offset", "<u8"), joined("length", "<u8"),
                           joined("crc32c", "<u4"), members, replicas, holders)


def data_path_offer(m: pb.DataPathInfo) -> DataPathOffer:
    return DataPathOffer(m.enabled, m.reason, m.port, m.unix_socket, m.instance, m.version)
