"""`Dataset`: one dataset on a daemon (or striped over several), as the client sees it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import grpc
import numpy as np

from dlfs import limits, wire
from dlfs.client import convert
from dlfs.client.errors import from_rpc_error
from dlfs.errors import Overloaded, Unavailable
from dlfs.proto import dlfs_pb2 as pb
from dlfs.client.reads import (
    SampleKey,
    _call_stream,
    _fill_keys,
    _range_request,
    fetch_batch,
    resolve_ids,
)
from dlfs.types import DatasetInfo, Entry

if TYPE_CHECKING:
    from dlfs.client.client import Client


class Dataset:
    """One sealed dataset on a daemon.  `len(ds)` samples with ids 0..len-1."""

    def __init__(self, client: Client, info: DatasetInfo):
        self.client = client
        self.info = info
        self.name = info.name

    def __len__(self) -> int:
        return self.info.samples

    def __repr__(self) -> str:
        return f"Dataset({self.name!r}, samples={len(self)}, bytes={self.info.bytes})"

    def get_batch(self, keys: Iterable[SampleKey], *, verify: bool = True,
                  prefetch: Iterable[int] = ()) -> list[memoryview]:
        """Samples by ids or by paths, in request order, duplicates allowed.

        One round trip.  `prefetch` optionally names sample ids wanted next:
        the daemon starts reading them into its page cache with this call
        (as `prefetch` does).  Raises InvalidArgument (bad id, mixed ids and
        paths, batch over the daemon's limit), NotFound (unknown path),
        DataCorruption (stored bytes fail their checksum).
        """
        return fetch_batch(self.client, self.name, keys, verify=verify, prefetch=prefetch)

    def prepare(self) -> None:
        """Set up reading now rather than at the first batch (optional).

        With ``direct=True`` that is fetching the location index and opening
        the extent files; over gRPC there is nothing to do.  Raises what the
        first get_batch would (FailedPrecondition when direct reads are
        impossible here).
        """
        if self.client.direct:
            self.client._direct_reader(self.name)

    def iter_batches(self, order, batch_size: int, prefetch: int = 4, **options):
        """Batches of `order` (sample ids) with `prefetch` batches in flight, so I/O
        overlaps the caller's compute.  See `dlfs.pipeline.iter_batches`."""
        from dlfs import pipeline

        return pipeline.iter_batches(self, order, batch_size, prefetch=prefetch, **options)

    def get(self, key: SampleKey, *, verify: bool = True) -> memoryview:
        """One sample by id or path."""
        return self.get_batch([key], verify=verify)[0]

    def prefetch(self, keys: Iterable[SampleKey]) -> bool:
        """Hint that samples `keys` will be read soon; the daemon starts reading them
        into its page cache and this call returns at once.

        Returns False when the daemon's prefetch queue is full (the hint was
        dropped: only speed is lost).  Raises as get_batch does for bad keys.
        """
        request = pb.PrefetchRequest(dataset=self.name)
        if not _fill_keys(request, keys):
            return True
        if self.client._cluster is not None:
            ids = resolve_ids(self.client, self.name, request)
            self.client._cluster.prefetch(self.name, ids)
            return True
        try:
            self.client._call("Prefetch", request, retry=False)
        except Overloaded:
            return False
        return True

    def read(self, key: SampleKey, offset: int = 0, length: int = 0, *, verify: bool = True
             ) -> memoryview:
        """`length` bytes (0: to the end) at `offset` of one sample, clipped to its size.

        One round trip.  The CRC32C is verified when the range is the whole sample.
        """
        if offset == 0 and length == 0:  # the whole sample: as a batch of one (unary call)
            return self.get_batch([key], verify=verify)[0]
        if self.client._cluster is not None:
            return self._on_holder(key, lambda ds: ds.read(self._id(key), offset, length,
                                                           verify=verify))
        request = _range_request(self.name, key, offset, length, verify=verify)
        return _call_stream(self.client, "ReadRange", request)[0]

    def _id(self, key: SampleKey) -> int:
        return self.index(key) if isinstance(key, str) else int(key)

    def _on_holder(self, key: SampleKey, call):
        """Several daemons: `call(Dataset on a holder of key)`, failing over to replicas."""
        router = self.client._cluster
        sample_id = self._id(key)
        for _attempt in range(limits.replicas_max):
            member = router.holder_of(self.name, sample_id)
            try:
                return call(Dataset(member, self.info))
            except Unavailable as exc:
                router.mark_down(member.address, exc)
        raise Unavailable(f"no holder of sample {sample_id} of dataset {self.name!r} answers")

    def read_chunks(self, key: SampleKey, offset: int = 0, length: int = 0
                    ) -> Iterator[tuple[int, memoryview]]:
        """Like `read`, but hands out the reply's pieces as they arrive.

        Yields (position from `offset`, bytes) in order; one round trip, no
        reply-sized buffer, so a large range reaches the caller piece by
        piece.  Not CRC-verified (a partial range cannot be).  UNAVAILABLE
        before the first piece is retried as every read is; a stream that
        breaks later raises Unavailable.
        """
        if self.client._cluster is not None:
            member = self.client._cluster.holder_of(self.name, self._id(key))
            yield from Dataset(member, self.info).read_chunks(self._id(key), offset, length)
            return
        request = _range_request(self.name, key, offset, length, verify=False)
        call = self.client._raw_reads["ReadRange"]
        give_up = time.monotonic() + self.client.reconnect_timeout_s
        for attempt in range(1 << 30):
            received = 0
            expected = None
            try:
                for raw in call(request, timeout=self.client.batch_timeout_s):
                    header, data = wire.decode_chunk(raw)
                    if expected is None:
                        expected = header.payload_bytes
                    if header.data_offset != received:
                        raise Unavailable(f"DLFS daemon at {self.client.address} sent a read "
                                          f"reply out of order ({header.data_offset} != {received})")
                    if len(data):
                        yield received, data.toreadonly()
                        received += len(data)
            except grpc.RpcError as exc:
                if received == 0 and self.client._should_retry(exc, attempt, give_up):
                    continue
                raise from_rpc_error(exc, self.client.address) from None
            if expected is not None and received != expected:
                raise Unavailable(f"DLFS daemon at {self.client.address} ended a read reply "
                                  f"after {received} of {expected} bytes")
            return

    def path(self, sample_id: int) -> str:
        """Path of sample `sample_id`."""
        return self.lookup([sample_id])[0].path

    def index(self, path: str) -> int:
        """Sample id of `path`."""
        return self.lookup([path])[0].id

    def lookup(self, keys: Sequence[SampleKey]) -> list[Entry]:
        """Entries of samples by ids or paths (at most limits.lookup_items_max)."""
        request = pb.LookupRequest(dataset=self.name)
        _fill_keys(request, keys)
        return [convert.entry(e) for e in self.client._call("Lookup", request).entries]

    def paths(self) -> list[str]:
        """Every sample path, in id order.  One Lookup per 65,536 samples."""
        return self.listing()[0]

    def listing(self) -> tuple[list[str], np.ndarray]:
        """Every sample's path and size in bytes (an int64 array), in id order.

        One Lookup per 65,536 samples.
        """
        paths: list[str] = []
        sizes: list[int] = []
        step = limits.lookup_items_max
        for start in range(0, len(self), step):
            for entry in self.lookup(range(start, min(start + step, len(self)))):
                paths.append(entry.path)
                sizes.append(entry.size)
        return paths, np.asarray(sizes, dtype=np.int64)

    def stat(self, path: str = "") -> Entry:
        return self.client.stat(self.name, path)

    def listdir(self, path: str = "", **kwargs) -> Iterator[Entry]:
        return self.client.listdir(self.name, path, **kwargs)
