"""Read requests -> read plans: validation against the daemon's limits.

A batch (ids or paths) or a byte range of one sample is checked against
the dataset and the configured bounds, then planned by `reader.plan_batch`.
Nothing here reads a file or imports grpc.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from dlfs.errors import InvalidArgument
from dlfs.server.config import ServerConfig
from dlfs.server.directory import DatasetIndex
from dlfs.server.reader import BatchPlan, plan_batch


def plan_request(dataset: DatasetIndex, ids: Sequence[int] | None, paths: Sequence[str] | None,
                 config: ServerConfig) -> tuple[np.ndarray, BatchPlan]:
    """Validate a batch and plan its read.  Returns (ids, plan).

    O(k log k) for k samples (paths add a lookup each).  Raises
    InvalidArgument (bad id, both ids and paths, over batch_ids_max or
    batch_bytes_max), NotFound (unknown path) and FailedPrecondition (a
    sample other members store).
    """
    id_count = 0 if ids is None else len(ids)
    path_count = 0 if paths is None else len(paths)
    if id_count and path_count:
        raise InvalidArgument("give either sample ids or paths, not both")
    count = id_count + path_count
    if count > config.batch_ids_max:
        raise InvalidArgument(
            f"batch of {count} samples exceeds the limit of {config.batch_ids_max} "
            "(--batch-ids-max); split it into smaller batches"
        )
    checked = dataset.ids_of(paths) if path_count else dataset.check_ids(ids if id_count else [])
    dataset.check_local(checked)
    plan = plan_batch(checked, dataset.extent, dataset.offset, dataset.length, dataset.crc,
                      coalesce_gap_bytes=config.coalesce_gap_bytes)
    if plan.payload_bytes > config.batch_bytes_max:
        raise InvalidArgument(
            f"batch of {count} samples holds {plan.payload_bytes} bytes, over the limit of "
            f"{config.batch_bytes_max} (--batch-bytes-max); split it into smaller batches"
        )
    return checked, plan


def plan_range(dataset: DatasetIndex, sample_id: int, offset: int, length: int,
               config: ServerConfig) -> tuple[BatchPlan, bool]:
    """Plan the read of `length` bytes (0: to the end) at `offset` of one sample.

    The range is clipped to the sample.  Returns (plan, whole) where
    `whole` says the range covers the entire sample (only then can its
    CRC32C be verified).  Raises InvalidArgument (bad id, past
    batch_bytes_max), FailedPrecondition (stored by other members).
    """
    dataset.check_local(dataset.check_ids([sample_id]))
    size = int(dataset.length[sample_id])
    start = min(offset, size)
    stop = size if length == 0 else min(size, start + length)
    if stop - start > config.batch_bytes_max:
        raise InvalidArgument(
            f"a range of {stop - start} bytes is over the limit of "
            f"{config.batch_bytes_max} (--batch-bytes-max); read it in parts")
    one = slice(sample_id, sample_id + 1)
    plan = plan_batch(np.zeros(1, np.int64), dataset.extent[one], dataset.offset[one] + start,
                      np.array([stop - start], np.uint64), dataset.crc[one])
    plan.sample_ids = np.array([sample_id], np.int64)
    return plan, (start == 0 and stop == size)
