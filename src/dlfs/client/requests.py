"""Read requests built from what callers pass: sample ids or paths, ranges, hints.

Every transport (one daemon, several, co-located) receives its reads as
these messages, so the rules for keys live in one place: a batch names
samples by integer ids or by string paths, never a mix; ids fit in a
signed 64-bit integer; ranges have non-negative offsets and lengths.
"""

from __future__ import annotations

from typing import Iterable, Union

import numpy as np

from dlfs.errors import InvalidArgument
from dlfs.proto import dlfs_pb2 as pb

SampleKey = Union[int, str]


def fill_keys(request, keys, ids_field: str = "ids", paths_field: str = "paths") -> int:
    """Put ids or paths into `request`; return how many.  Raises InvalidArgument.

    Protobuf checks every element's type as it copies them (no Python loop here).
    """
    if isinstance(keys, np.ndarray):
        if keys.dtype.kind not in "iu":
            raise InvalidArgument(f"sample ids must be integers, got an array of {keys.dtype}")
        keys = keys.tolist()
    elif not isinstance(keys, (list, tuple)):
        keys = list(keys)
    if not keys:
        return 0
    field, kind = ((paths_field, "string paths") if isinstance(keys[0], str)
                   else (ids_field, "integer sample ids"))
    try:
        getattr(request, field).extend(keys)
    except (TypeError, ValueError) as exc:
        if "out of range" in str(exc):
            raise InvalidArgument("sample ids must fit in a signed 64-bit integer") from None
        raise InvalidArgument(f"a batch takes either integer sample ids or string paths, not a "
                              f"mix or other types (expected {kind})") from None
    return len(keys)


def batch_request(dataset: str, keys: Iterable[SampleKey], *, verify: bool,
                  prefetch: Iterable[int] = (), generation: int = 0) -> pb.GetBatchRequest:
    """A GetBatchRequest for `keys` of version `generation` (0: the current one), with
    optional prefetch ids riding along."""
    request = pb.GetBatchRequest(dataset=dataset, skip_verify=not verify,
                                 generation=generation)
    fill_keys(request, prefetch, ids_field="prefetch_ids", paths_field="prefetch_ids")
    fill_keys(request, keys)
    return request


def batch_size(request) -> int:
    """Samples a GetBatch or Prefetch request names (ids or paths)."""
    return len(request.ids) + len(request.paths)


def range_request(dataset: str, key: SampleKey, offset: int, length: int, *, verify: bool,
                  generation: int = 0) -> pb.ReadRangeRequest:
    """A ReadRangeRequest for `length` bytes (0: to the end) at `offset` of one sample."""
    if offset < 0 or length < 0:
        raise InvalidArgument(f"offset {offset} and length {length} must not be negative")
    request = pb.ReadRangeRequest(dataset=dataset, offset=offset, length=length,
                                  skip_verify=not verify, generation=generation)
    if isinstance(key, str):
        request.path = key
    elif isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        if key < 0:
            raise InvalidArgument(f"sample id {key} is negative")
        request.id = int(key)
    else:
        raise InvalidArgument(f"a sample is named by an integer id or a path, not {key!r}")
    return request
