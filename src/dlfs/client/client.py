"""The thin client: `Client` talks to a daemon, `Dataset` is one dataset on it.

Every call carries a deadline.  Failures raise the typed errors of
`dlfs.errors`; calls that only read are retried on UNAVAILABLE for up to
`reconnect_timeout_s` (a restarting daemon is waited for, a dead one is
reported with its address).

Samples come back as read-only `memoryview`s into the reply's payload: no
client-side copy, buffer protocol (``np.frombuffer``, ``io.BytesIO``,
``bytes(sample)``).  All samples of one batch share one payload buffer,
which lives as long as any of them does.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from typing import Iterable, Iterator, Sequence, Union

import grpc
import numpy as np

from dlfs import limits, wire
from dlfs.client import convert
from dlfs.client.channel import open_channel
from dlfs.client.convert import DatasetInfo, Entry
from dlfs.client.errors import from_rpc_error
from dlfs.errors import DlfsError, InvalidArgument, NotFound, Overloaded, Unavailable
from dlfs.paths import check_dataset_name, normalize_dir_path
from dlfs.proto import dlfs_pb2 as pb
from dlfs.proto import dlfs_pb2_grpc

SampleKey = Union[int, str]
_RETRY_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)


class Client:
    """Connection to a DLFS daemon.

    `address` is ``HOST:PORT``, or several (a list, or one string separated
    by ','): then datasets striped over those daemons are read from all of
    them, each sample from a live holder, with failover to replicas (see
    `dlfs.client.cluster`).  The client is thread-safe; after `os.fork` make
    a new one in the child.

    `token` (default: $DLFS_TOKEN) authenticates to a daemon started with
    --tokens-file; `tls_ca` (default: $DLFS_TLS_CA) is the CA file that
    signed the daemon's certificate and turns TLS on; `tls_cert`/`tls_key`
    present a client certificate to a daemon that requires one.

    With `direct=True` the client must run on the daemon's host with read
    access to its data dir: batches are then served from the extent files
    mapped into this process, as views of the page cache (see
    `dlfs.client.direct`); metadata still comes from the daemon.
    FailedPrecondition is raised at the first batch otherwise.
    """

    def __init__(self, address: str | Sequence[str], *,
                 timeout_s: float = limits.metadata_timeout_s_default,
                 batch_timeout_s: float = limits.batch_timeout_s_default,
                 reconnect_timeout_s: float = limits.reconnect_timeout_s_default,
                 direct: bool = False, token: str | None = None, tls_ca: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None):
        addresses = [address] if isinstance(address, str) else list(address)
        addresses = list(dict.fromkeys(a.strip() for part in addresses for a in part.split(",")
                                       if a.strip()))
        if not addresses:
            raise InvalidArgument("no daemon address given (HOST:PORT, or several separated by ',')")
        self.timeout_s = timeout_s
        self.batch_timeout_s = batch_timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self._cluster = None
        if len(addresses) > 1:
            if direct:
                raise InvalidArgument("direct=True reads one daemon's files; give one address")
            from dlfs.client.cluster import ClusterRouter

            member_options = dict(timeout_s=timeout_s, batch_timeout_s=batch_timeout_s,
                                  reconnect_timeout_s=min(reconnect_timeout_s,
                                                          limits.failover_timeout_s),
                                  token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)
            self.address = ",".join(addresses)
            self._cluster = ClusterRouter(lambda a: Client(a, **member_options), addresses)
            self._channel = self._stub = None
            self._raw_reads: dict = {}
        else:
            self.address = addresses[0]
            self._channel = open_channel(self.address, token=token, tls_ca=tls_ca,
                                         tls_cert=tls_cert, tls_key=tls_key)
            self._stub = dlfs_pb2_grpc.DlfsStub(self._channel)
            # The read RPCs hand the raw reply to dlfs.wire, which slices the payload without copying.
            self._raw_reads = {
                name: self._channel.unary_stream(f"/dlfs.v1.Dlfs/{name}",
                                                 request_serializer=request_type.SerializeToString,
                                                 response_deserializer=None)
                for name, request_type in (("GetBatch", pb.GetBatchRequest),
                                           ("ReadRange", pb.ReadRangeRequest))
            }
        self.direct = direct
        self._direct_readers: dict = {}
        self._direct_lock = threading.Lock()

    def close(self) -> None:
        with self._direct_lock:
            readers, self._direct_readers = list(self._direct_readers.values()), {}
        for reader in readers:
            reader.close()
        if self._cluster is not None:
            self._cluster.close()
        else:
            self._channel.close()

    def _direct_reader(self, dataset: str):
        """The co-located reader of `dataset` (created on first use)."""
        with self._direct_lock:
            reader = self._direct_readers.get(dataset)
            if reader is None:
                from dlfs.client.direct import DirectReader

                reader = self._direct_readers[dataset] = DirectReader(self, dataset)
            return reader

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.address!r})"

    # --- calls --------------------------------------------------------------

    def _call(self, method: str, request, *, timeout_s: float | None = None, retry: bool = True):
        """Unary call with deadline, typed errors and retry on UNAVAILABLE.

        Several daemons: the first member that answers (see ClusterRouter.call_any).
        """
        if self._cluster is not None:
            return self._cluster.call_any(
                lambda member: member._call(method, request, timeout_s=timeout_s, retry=retry))
        stub_method = getattr(self._stub, method)
        give_up = time.monotonic() + (self.reconnect_timeout_s if retry else 0.0)
        for attempt in range(1 << 30):
            try:
                return stub_method(request, timeout=timeout_s or self.timeout_s)
            except grpc.RpcError as exc:
                if not self._should_retry(exc, attempt, give_up):
                    raise from_rpc_error(exc, self.address) from None

    def _should_retry(self, exc: grpc.RpcError, attempt: int, give_up: float) -> bool:
        if exc.code() != grpc.StatusCode.UNAVAILABLE:
            return False
        pause = _RETRY_BACKOFF_S[min(attempt, len(_RETRY_BACKOFF_S) - 1)]
        if time.monotonic() + pause > give_up:
            return False
        time.sleep(pause)
        return True

    # --- datasets -------------------------------------------------------------

    def datasets(self) -> list[str]:
        """Names of the sealed datasets, sorted."""
        return [info.name for info in self.dataset_infos() if info.sealed]

    def dataset_infos(self) -> list[DatasetInfo]:
        """Summaries of all datasets, including ingests in progress (sealed=False).

        Several daemons: the union over the members that answer.
        """
        if self._cluster is None:
            reply = self._call("ListDatasets", pb.ListDatasetsRequest())
            return [convert.dataset_info(d) for d in reply.datasets]
        found: dict[str, DatasetInfo] = {}
        for result in self._cluster.each(lambda member: member.dataset_infos()).values():
            if isinstance(result, list):
                for info in result:
                    if info.name not in found or (info.sealed and not found[info.name].sealed):
                        found[info.name] = info
        if not found and all(isinstance(r, Exception)
                             for r in self._cluster.each(lambda m: m.address).values()):
            raise Unavailable(f"none of the DLFS daemons {self.address} answers")
        return [found[name] for name in sorted(found)]

    def dataset(self, name: str) -> "Dataset":
        """Open dataset `name`.  Raises NotFound, InvalidArgument."""
        check_dataset_name(name)
        info = convert.dataset_info(self._call("GetDataset", pb.GetDatasetRequest(dataset=name)))
        return Dataset(self, info)

    def delete(self, name: str) -> DatasetInfo:
        """Remove dataset `name` and free its space (on every member that has it).

        Raises NotFound; with several daemons, Unavailable when a member that
        may hold part of it does not answer (delete again once it is back).
        """
        check_dataset_name(name)
        request = pb.DeleteDatasetRequest(dataset=name)
        if self._cluster is None:
            return convert.dataset_info(self._call("DeleteDataset", request, retry=False))
        results = self._cluster.each(
            lambda member: convert.dataset_info(member._call("DeleteDataset", request,
                                                             retry=False)))
        deleted = [r for r in results.values() if isinstance(r, DatasetInfo)]
        down = [a for a, r in results.items() if isinstance(r, Unavailable)]
        if down:
            raise Unavailable(f"dataset {name!r} was deleted on {len(deleted)} daemon(s), but "
                              f"{', '.join(down)} did not answer: delete it again once they are back")
        if not deleted:
            raise NotFound(f"no dataset named {name!r} on {self.address}")
        return deleted[0]

    def ingest(self, source_dir: str, name: str, *, replace: bool = False,
               include_hidden: bool = False, follow_symlinks: bool = False,
               progress: bool | None = None, replicas: int = 1) -> DatasetInfo:
        """Upload every regular file below `source_dir` as dataset `name`.

        See `dlfs.client.ingest.ingest_tree` for the file selection rules.
        Several daemons: the dataset is striped over all of them, each sample
        stored on `replicas` of them (docs/cluster.md).
        """
        from dlfs.client.ingest import ingest_tree, walk_tree

        if self._cluster is None:
            if replicas != 1:
                raise InvalidArgument(f"--replicas {replicas} needs as many daemons; one was given")
            return ingest_tree(self, source_dir, name, replace=replace,
                               include_hidden=include_hidden, follow_symlinks=follow_symlinks,
                               progress=progress)
        from dlfs.client.cluster import ingest_striped

        check_dataset_name(name)
        report = walk_tree(source_dir, include_hidden=include_hidden,
                           follow_symlinks=follow_symlinks)
        info = ingest_striped(self._cluster, report, name, replace=replace, replicas=replicas,
                              progress=progress)
        self._cluster.forget(name)
        return info

    def status(self) -> convert.DaemonStatus:
        """The daemon's health and counters (what `dlfs status` prints).

        Several daemons: the first member that answers; see `statuses`.
        """
        if self._cluster is not None:
            return self._cluster.call_any(lambda member: member.status())
        return convert.daemon_status(self.address, self._call("Status", pb.StatusRequest()))

    def statuses(self) -> dict:
        """Per daemon address: its DaemonStatus, or the error that reaching it raised."""
        if self._cluster is None:
            try:
                return {self.address: self.status()}
            except DlfsError as exc:
                return {self.address: exc}
        return self._cluster.each(lambda member: member.status())

    def scrub(self, name: str, *, progress: bool | None = None) -> ScrubReport:
        """Verify every sample of dataset `name` on the daemon; report the damaged ones.

        Streams progress (a bar on a terminal when `progress` is None).
        Raises NotFound.  Damaged samples are in the report, not raised.
        """
        check_dataset_name(name)
        if self._cluster is not None:
            return _merge_scrubs(name, self._cluster.each(
                lambda member: member.scrub(name, progress=False)))
        show = sys.stderr.isatty() if progress is None else progress
        bar = None
        damaged: list[tuple[Entry, str]] = []
        try:
            for update in self._stub.Scrub(pb.ScrubRequest(dataset=name),
                                           timeout=limits.ingest_timeout_s_default):
                if show and bar is None:
                    from tqdm import tqdm

                    bar = tqdm(total=update.bytes_checked if update.done else None, unit="B",
                               unit_scale=True, unit_divisor=1024, desc=f"scrub {name}",
                               file=sys.stderr)
                if bar is not None:
                    bar.update(update.bytes_checked - bar.n)
                damaged.extend(zip(map(convert.entry, update.damaged), update.reasons))
                if update.done:
                    return ScrubReport(update.samples_checked, update.bytes_checked, damaged)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.address) from None
        finally:
            if bar is not None:
                bar.close()
        raise Unavailable(f"the scrub of {name!r} on {self.address} ended early")

    # --- samples --------------------------------------------------------------------

    def get_batch(self, keys: Iterable[SampleKey], *, dataset: str, verify: bool = True,
                  prefetch: Iterable[int] = ()) -> list[memoryview]:
        """Shorthand for ``client.dataset(dataset).get_batch(keys)`` without the lookup."""
        return fetch_batch(self, dataset, keys, verify=verify, prefetch=prefetch)

    def stat(self, dataset: str, path: str) -> Entry:
        """Metadata of a file or directory ("" is the dataset root)."""
        request = pb.StatRequest(dataset=dataset, path=normalize_dir_path(path))
        return convert.entry(self._call("Stat", request))

    def listdir(self, dataset: str, path: str = "", *,
                page_size: int = limits.list_page_entries_default) -> Iterator[Entry]:
        """Entries of a directory in name order, fetched page by page."""
        start_after = ""
        while True:
            entries, more = self.list_page(dataset, path, start_after, page_size)
            yield from entries
            if not more or not entries:
                return
            start_after = entries[-1].name

    def list_page(self, dataset: str, path: str = "", start_after: str = "",
                  page_size: int = limits.list_page_entries_default) -> tuple[list[Entry], bool]:
        """One page of a directory: at most `page_size` entries after name
        `start_after`, in name order, and whether more follow.  One round trip."""
        reply = self._call("ListDir", pb.ListDirRequest(
            dataset=dataset, path=normalize_dir_path(path), start_after=start_after,
            page_size=page_size))
        return [convert.entry(e) for e in reply.entries], reply.more


@dataclasses.dataclass(frozen=True)
class ScrubReport:
    samples: int
    bytes: int
    damaged: list  # (Entry, reason) of each sample that failed its checksum


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
            ids = np.asarray(self._ids(request), dtype=np.int64)
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
        if self.client._cluster is not None:
            return self._on_holder(key, lambda ds: ds.read(self._id(key), offset, length,
                                                           verify=verify))
        request = _range_request(self.name, key, offset, length, verify=verify)
        return _call_stream(self.client, "ReadRange", request)[0]

    def _id(self, key: SampleKey) -> int:
        return self.index(key) if isinstance(key, str) else int(key)

    def _ids(self, request) -> list[int]:
        """The ids of a request filled by _fill_keys (paths resolved with one Lookup)."""
        if request.paths:
            return [e.id for e in self.lookup(list(request.paths))]
        return list(request.ids)

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
        result: list[str] = []
        step = limits.lookup_items_max
        for start in range(0, len(self), step):
            result.extend(e.path for e in self.lookup(range(start, min(start + step, len(self)))))
        return result

    def stat(self, path: str = "") -> Entry:
        return self.client.stat(self.name, path)

    def listdir(self, path: str = "", **kwargs) -> Iterator[Entry]:
        return self.client.listdir(self.name, path, **kwargs)


def _range_request(dataset: str, key: SampleKey, offset: int, length: int, *, verify: bool
                   ) -> pb.ReadRangeRequest:
    if offset < 0 or length < 0:
        raise InvalidArgument(f"offset {offset} and length {length} must not be negative")
    request = pb.ReadRangeRequest(dataset=dataset, offset=offset, length=length,
                                  skip_verify=not verify)
    if isinstance(key, str):
        request.path = key
    elif isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        if key < 0:
            raise InvalidArgument(f"sample id {key} is negative")
        request.id = int(key)
    else:
        raise InvalidArgument(f"a sample is named by an integer id or a path, not {key!r}")
    return request


def _fill_keys(request, keys, ids_field: str = "ids", paths_field: str = "paths") -> int:
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


def fetch_batch(client: Client, dataset: str, keys, *, verify: bool = True,
                prefetch: Iterable[int] = ()) -> list[memoryview]:
    """One GetBatch round trip; the samples as memoryviews in request order."""
    request = pb.GetBatchRequest(dataset=dataset, skip_verify=not verify)
    _fill_keys(request, prefetch, ids_field="prefetch_ids", paths_field="prefetch_ids")
    if not _fill_keys(request, keys):
        return []
    if client._cluster is not None:
        if request.paths:
            lookup = pb.LookupRequest(dataset=dataset, paths=request.paths)
            ids = [e.id for e in client._call("Lookup", lookup).entries]
        else:
            ids = request.ids
        return client._cluster.get_batch(dataset, np.asarray(ids, dtype=np.int64), verify=verify,
                                         prefetch=np.asarray(request.prefetch_ids, dtype=np.int64))
    if client.direct:
        if request.paths:
            lookup = pb.LookupRequest(dataset=dataset, paths=request.paths)
            ids = [e.id for e in client._call("Lookup", lookup).entries]
        else:
            ids = request.ids
        reader = client._direct_reader(dataset)
        if request.prefetch_ids:
            reader.prefetch(request.prefetch_ids)
        return reader.get_batch(ids, verify=verify)
    return _call_stream(client, "GetBatch", request)


def _call_stream(client: Client, method: str, request) -> list[memoryview]:
    """A BatchChunk-streaming call with deadline, typed errors and retry on UNAVAILABLE."""
    stub_method = client._raw_reads[method]
    give_up = time.monotonic() + client.reconnect_timeout_s
    for attempt in range(1 << 30):
        try:
            return _assemble(stub_method(request, timeout=client.batch_timeout_s))
        except grpc.RpcError as exc:
            if not client._should_retry(exc, attempt, give_up):
                raise from_rpc_error(exc, client.address) from None


def _assemble(chunks) -> list[memoryview]:
    """Join a raw BatchChunk stream into one payload and slice it per sample."""
    first, data = wire.decode_chunk(next(chunks))
    if len(data) == first.payload_bytes:
        payload = data.toreadonly()
    else:
        buffer = bytearray(first.payload_bytes)
        buffer[: len(data)] = data
        filled = len(data)
        for raw in chunks:
            header, piece = wire.decode_chunk(raw)
            if header.data_offset != filled:
                raise Unavailable(f"reply chunks out of order ({header.data_offset} != {filled})")
            buffer[filled:filled + len(piece)] = piece
            filled += len(piece)
        if filled != first.payload_bytes:
            raise Unavailable(f"reply ended after {filled} of {first.payload_bytes} bytes")
        payload = memoryview(buffer).toreadonly()
    for _ in chunks:  # drain so the call completes and its status is checked
        pass
    return [payload[o:o + n] for o, n in zip(first.offsets, first.lengths)]


def _merge_scrubs(name: str, results: dict) -> ScrubReport:
    """One report from every member's scrub of its own samples."""
    reports = [r for r in results.values() if isinstance(r, ScrubReport)]
    down = [a for a, r in results.items() if isinstance(r, Unavailable)]
    if down:
        raise Unavailable(f"cannot scrub {name!r} on {', '.join(down)}: not answering")
    if not reports:
        raise NotFound(f"no dataset named {name!r} on any daemon")
    return ScrubReport(sum(r.samples for r in reports), sum(r.bytes for r in reports),
                       [d for r in reports for d in r.damaged])
