"""Read requests as every transport takes them: plain values, sample ids as int64 arrays.

A batch names its samples by integer ids or by string paths, never a mix;
ids fit in a signed 64-bit integer; ranges have non-negative offsets and
lengths.  The rules live here once, checked when a request is made, with
the same messages for every transport.  Ids stay one int64 array from the
caller to the wire: the data path sends it as it is, only the gRPC
transport copies it into a protobuf message (`grpc_messages`).
"""

from __future__ import annotations

import array
import dataclasses
from typing import Callable, Iterable, Sequence, Union

import numpy as np

from dlfs.errors import InvalidArgument
from dlfs.types import Entry

SampleKey = Union[int, str]

# An empty id array, shared (read-only).
NO_IDS = np.empty(0, np.int64)
NO_IDS.flags.writeable = False
_INT64_MAX = np.iinfo(np.int64).max


@dataclasses.dataclass(frozen=True, eq=False)
class BatchRequest:
    """Whole samples of one dataset: `ids` (int64) or `paths` (the other is None), in
    request order, duplicates allowed; `prefetch_ids` ride along as a read-ahead hint;
    `generation` names the version the ids refer to (0: the current one).  Compared
    by identity (it holds arrays)."""

    dataset: str
    ids: np.ndarray | None
    paths: tuple[str, ...] | None = None
    verify: bool = True
    prefetch_ids: np.ndarray = dataclasses.field(default_factory=lambda: NO_IDS)
    generation: int = 0

    @property
    def size(self) -> int:
        """How many samples it names."""
        return len(self.paths) if self.paths is not None else self.ids.size


@dataclasses.dataclass(frozen=True, eq=False)
class PrefetchRequest:
    """A read-ahead hint: samples `ids` (int64) or `paths` of one dataset."""

    dataset: str
    ids: np.ndarray | None
    paths: tuple[str, ...] | None = None

    @property
    def size(self) -> int:
        return len(self.paths) if self.paths is not None else self.ids.size


@dataclasses.dataclass(frozen=True)
class RangeRequest:
    """`length` bytes (0: to the end) at `offset` of one sample, named by `sample_id` or
    by `path` (the other is None), of version `generation` (0: the current one)."""

    dataset: str
    sample_id: int | None
    path: str | None
    offset: int
    length: int
    verify: bool = True
    generation: int = 0


def sample_keys(keys: Iterable[SampleKey] | np.ndarray
                ) -> tuple[np.ndarray | None, tuple[str, ...] | None]:
    """(ids, None) or (None, paths) for `keys`; (NO_IDS, None) when there are none.

    Raises InvalidArgument for a mix of ids and paths or other types, ids
    outside a signed 64-bit integer, a non-integer array.  An integer array
    is taken as it is (converted only if it is not int64); a list is
    checked and converted in C, no Python loop per sample.
    """
    if isinstance(keys, np.ndarray):
        if keys.dtype.kind not in "iu":
            raise InvalidArgument(f"sample ids must be integers, got an array of {keys.dtype}")
        if keys.size == 0:
            return NO_IDS, None
        if keys.ndim != 1:
            raise _mixed("integer sample ids")
        if keys.dtype.kind == "u" and keys.max() > _INT64_MAX:
            raise _too_large()
        return np.ascontiguousarray(keys, dtype=np.int64), None
    if not isinstance(keys, (list, tuple)):
        keys = list(keys)
    if not keys:
        return NO_IDS, None
    types = set(map(type, keys))
    if isinstance(keys[0], str):
        if types != {str}:
            raise _mixed("string paths")
        return None, tuple(keys)
    if bool in types:  # an int to Python, never a sample id
        raise _mixed("integer sample ids")
    try:
        return np.frombuffer(array.array("q", keys), dtype=np.int64), None
    except OverflowError:
        raise _too_large() from None
    except TypeError:
        raise _mixed("integer sample ids") from None


def batch_request(dataset: str, keys: Iterable[SampleKey], *, verify: bool = True,
                  prefetch: Iterable[int] = (), generation: int = 0) -> BatchRequest:
    """The request for `keys` of version `generation` (0: the current one), with optional
    prefetch ids riding along.  Raises InvalidArgument (see `sample_keys`)."""
    hint_ids, hint_paths = sample_keys(prefetch)
    if hint_paths is not None:
        raise _mixed("string paths")  # hints ride by id only
    ids, paths = sample_keys(keys)
    return BatchRequest(dataset, ids, paths, verify, hint_ids, generation)


def prefetch_request(dataset: str, keys: Iterable[SampleKey]) -> PrefetchRequest:
    """The hint for samples `keys` of `dataset`.  Raises InvalidArgument."""
    ids, paths = sample_keys(keys)
    return PrefetchRequest(dataset, ids, paths)


def range_request(dataset: str, key: SampleKey, offset: int, length: int, *, verify: bool,
                  generation: int = 0) -> RangeRequest:
    """The request for `length` bytes (0: to the end) at `offset` of one sample.

    Raises InvalidArgument for a negative offset, length or id, or a key
    that is neither an integer id nor a path.
    """
    if offset < 0 or length < 0:
        raise InvalidArgument(f"offset {offset} and length {length} must not be negative")
    if isinstance(key, str):
        return RangeRequest(dataset, None, key, offset, length, verify, generation)
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        if key < 0:
            raise InvalidArgument(f"sample id {key} is negative")
        return RangeRequest(dataset, int(key), None, offset, length, verify, generation)
    raise InvalidArgument(f"a sample is named by an integer id or a path, not {key!r}")


Lookup = Callable[..., Sequence[Entry]]


def request_ids(request: BatchRequest | PrefetchRequest, lookup: Lookup) -> np.ndarray:
    """The sample ids a request names; paths cost one `lookup(dataset, paths=...)`."""
    if request.paths is None:
        return request.ids
    entries = lookup(request.dataset, paths=request.paths)
    return np.fromiter((e.id for e in entries), dtype=np.int64, count=len(entries))


def range_id(request: RangeRequest, lookup: Lookup) -> int:
    """The id of the sample a range request names; a path costs one `lookup`."""
    if request.path is None:
        return request.sample_id
    return lookup(request.dataset, paths=(request.path,))[0].id


def _mixed(kind: str) -> InvalidArgument:
    return InvalidArgument(f"a batch takes either integer sample ids or string paths, not a "
                           f"mix or other types (expected {kind})")


def _too_large() -> InvalidArgument:
    return InvalidArgument("sample ids must fit in a signed 64-bit integer")
