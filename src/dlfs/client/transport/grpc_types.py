"""Client-side value types and their conversion from the generated messages."""

from __future__ import annotations

import dataclasses

from dlfs.proto import dlfs_pb2 as pb
from dlfs.types import DaemonStatus, DataWorkerStatus, DatasetInfo, Entry


def dataset_info(message: pb.DatasetInfo) -> DatasetInfo:
    return DatasetInfo(message.name, message.samples, message.bytes, message.sealed,
                       message.created_unix_ns, message.extents, tuple(message.members),
                       message.replicas, message.member_index, message.generation,
                       ingest_state=message.ingest_state)


def entry(message: pb.Entry) -> Entry:
    return Entry(message.name, message.path, message.kind == pb.DIRECTORY, message.size,
                 message.mode, message.mtime_ns, message.id, message.crc32c, message.children)


def daemon_status(address: str, m: pb.StatusReply) -> DaemonStatus:
    """The DaemonStatus a StatusReply carries (field for field), as `address` answered it."""
    fields = {f.name: getattr(m, f.name) for f in dataclasses.fields(DaemonStatus)
              if f.name != "address"}
    fields["errors"] = dict(m.errors)
    fields["data_workers"] = tuple(
        DataWorkerStatus(**{f.name: getattr(w, f.name) for f in dataclasses.fields(
            DataWorkerStatus)}) for w in m.data_workers)
    return DaemonStatus(address=address, **fields)
