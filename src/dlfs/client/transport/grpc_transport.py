"""`DaemonTransport`: everything the client says to one daemon, over gRPC.

A transport is what a `Client` holds: this one for a single daemon,
`dlfs.client.cluster.router.ClusterRouter` for several, `dlfs.client.transport.direct_transport.
DirectTransport` for a co-located client.  They offer the same methods, so
the client never asks which it has:

- control plane: `call` (a unary call with deadline, typed errors and
  bounded retry on UNAVAILABLE), `call_any` and `each` (on one member or on
  every member), `index`, `ingest`, `scrub`, `upload`, `rebalance`;
- reads: `get_batch`, `read_range`, `read_chunks`, `prefetch`, `prepare`.

Read replies arrive as raw BatchChunk messages and are sliced by
`dlfs.formats.grpc_chunks` without copying the payload; all samples of one batch are
read-only memoryviews into one reply buffer.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator, TypeVar

import grpc
import numpy as np

from dlfs import limits, logs
from dlfs.formats import grpc_chunks
from dlfs.client.reply_buffers import copy_into
from dlfs.client.transport.grpc_channel import ChannelSettings, open_channel
from dlfs.client import metadata
from dlfs.client.transport.grpc_errors import from_rpc_error
from dlfs.client.requests import batch_size
from dlfs.client.transport.retry import call_with_retry
from dlfs.errors import DlfsError, InvalidArgument, Overloaded, ReplyTooLarge, Unavailable
from dlfs.proto import dlfs_pb2 as pb
from dlfs.proto import dlfs_pb2_grpc
from dlfs.types import DatasetInfo

T = TypeVar("T")

_READ_REQUEST_TYPES = {"GetBatch": pb.GetBatchRequest, "ReadRange": pb.ReadRangeRequest}


def _serialized(message) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


class _NoUnaryReads(Exception):
    """The daemon predates GetSmallBatch (it answered UNIMPLEMENTED)."""


class DaemonTransport:
    """One daemon's gRPC channel and calls.  Thread-safe; after `os.fork` make a new one.

    Timeouts: `timeout_s` is the deadline of metadata calls,
    `batch_timeout_s` of read calls; `reconnect_timeout_s` bounds how long
    a call waits out UNAVAILABLE (see `dlfs.client.transport.retry`).
    """

    def __init__(self, address: str, *, timeout_s: float, batch_timeout_s: float,
                 reconnect_timeout_s: float, token: str | None = None,
                 tls_ca: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None):
        self.address = address
        self.addresses = (address,)
        self.timeout_s = timeout_s
        self.batch_timeout_s = batch_timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self.settings = ChannelSettings(token=token, tls_ca=tls_ca, tls_cert=tls_cert,
                                        tls_key=tls_key)
        self._grpc: _Channel | None = None
        self._grpc_lock = threading.Lock()
        # False once the daemon answered UNIMPLEMENTED (older than GetSmallBatch).
        self.small_batches = True

    def close(self) -> None:
        with self._grpc_lock:
            channel, self._grpc = self._grpc, None
        if channel is not None:
            channel.channel.close()

    def _channel_now(self) -> "_Channel":
        """The gRPC channel, opened at the first call that needs it: a process that only
        reads over the data path (a forked DataLoader worker) never opens one."""
        with self._grpc_lock:
            if self._grpc is None:
                self._grpc = _Channel(self.address, self.settings)
            return self._grpc

    @property
    def _stub(self) -> dlfs_pb2_grpc.DlfsStub:
        return self._channel_now().stub

    @property
    def _raw_reads(self) -> dict:
        return self._channel_now().raw_reads

    @property
    def _channel(self):
        return self._channel_now().channel

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.address!r})"

    # --- control plane ----------------------------------------------------------------

    def call(self, method: str, request, *, timeout_s: float | None = None,
             retry: bool = True):
        """Unary call `method` with deadline `timeout_s` (default: the metadata deadline).

        UNAVAILABLE is retried for up to `reconnect_timeout_s` when `retry`.
        Raises the typed DlfsError of the failure.
        """
        stub_method = getattr(self._stub, method)
        return call_with_retry(
            lambda: stub_method(request, timeout=timeout_s or self.timeout_s,
                                metadata=logs.outgoing_metadata()),
            address=self.address, timeout_s=self.reconnect_timeout_s if retry else 0.0)

    def call_any(self, call: Callable[["DaemonTransport"], T]) -> T:
        """`call(member)` on a member that answers: here the one daemon."""
        return call(self)

    def each(self, call: Callable[["DaemonTransport"], T]) -> dict[str, T | DlfsError]:
        """`call(member)` on every member: address -> result, or the DlfsError it raised."""
        try:
            return {self.address: call(self)}
        except DlfsError as exc:
            return {self.address: exc}

    def index(self, dataset: str) -> list[pb.IndexChunk]:
        """The GetIndex stream of `dataset` (sample locations, placement), in order."""
        def attempt():
            return list(self._stub.GetIndex(pb.GetIndexRequest(dataset=dataset),
                                            timeout=self.timeout_s,
                                            metadata=logs.outgoing_metadata()))

        return call_with_retry(attempt, address=self.address, timeout_s=self.reconnect_timeout_s)

    def ingest(self, messages) -> pb.DatasetInfo:
        """One Ingest call fed by the iterator `messages` (IngestMessages, or their
        serialized bytes: `dlfs.client.ingest_upload.raw_messages`); never retried.

        Raises the daemon's DlfsError, or grpc.RpcError when the failure
        came from `messages` itself (the caller knows the cause then).
        """
        call = self._channel.stream_unary("/dlfs.v1.Dlfs/Ingest",
                                          request_serializer=_serialized,
                                          response_deserializer=pb.DatasetInfo.FromString)
        return call(messages, timeout=limits.ingest_timeout_s_default,
                    metadata=logs.outgoing_metadata())

    def scrub(self, dataset: str) -> Iterator[pb.ScrubProgress]:
        """The Scrub stream of `dataset`; failures raise typed errors."""
        try:
            yield from self._stub.Scrub(pb.ScrubRequest(dataset=dataset),
                                        timeout=limits.ingest_timeout_s_default,
                                        metadata=logs.outgoing_metadata())
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.address) from None

    def upload(self, source, name: str, *, replace: bool, progress, replicas: int, **options):
        """Ingest `source` as dataset `name` (one stream; see
        `dlfs.client.ingest_upload.upload`)."""
        from dlfs.client.ingest_upload import upload

        if replicas != 1:
            raise InvalidArgument(f"--replicas {replicas} needs as many daemons; one was given")
        return upload(self, name, source, replace=replace, progress=progress, **options)

    def rebalance(self, name: str, *, replicas: int | None, progress: bool | None):
        raise InvalidArgument("rebalance places a dataset on several daemons: give the new "
                              "list of addresses (A,B,C)")

    def forget(self, dataset: str) -> None:
        """Drop what is cached about `dataset` (nothing, for one daemon over gRPC)."""

    def data_path_hints(self) -> dict:
        """{address: where its data path listens} (none here: reads go through gRPC)."""
        return {}

    # --- reads -------------------------------------------------------------------------

    def prepare(self, dataset: str) -> None:
        """Set up reading `dataset` now rather than at the first batch (nothing to do here)."""

    def ids_of(self, request) -> np.ndarray:
        """The sample ids a GetBatch or Prefetch request names; paths cost one Lookup."""
        if request.paths:
            lookup = pb.LookupRequest(dataset=request.dataset, paths=request.paths)
            return np.array([e.id for e in self.call("Lookup", lookup).entries], dtype=np.int64)
        return np.asarray(request.ids, dtype=np.int64)

    def get_batch(self, request: pb.GetBatchRequest, out=None) -> list[memoryview]:
        """The samples a GetBatchRequest names, in request order; one round trip.

        With `out` (a writable buffer), the samples are written back to back
        into it and the views are of `out` (see `buffers.copy_into`).
        Batches of up to `limits.small_batch_samples_max` samples first try
        the unary GetSmallBatch (fewer thread hand-offs: ~0.5 ms less per
        call on loopback) and stream only if the daemon says the reply does
        not fit one message, or has no unary read.
        """
        if out is not None:
            return copy_into(out, self.get_batch(request))
        if not batch_size(request):
            return []
        if self.small_batches and batch_size(request) <= limits.small_batch_samples_max:
            try:
                return self._read("GetSmallBatch", request)
            except ReplyTooLarge:
                pass  # large samples: the stream carries them
            except _NoUnaryReads:
                self.small_batches = False
        return self._read("GetBatch", request)

    def read_range(self, request: pb.ReadRangeRequest) -> memoryview:
        """The bytes a ReadRangeRequest names, as one view; one round trip."""
        return self._read("ReadRange", request)[0]

    def read_chunks(self, request: pb.ReadRangeRequest) -> Iterator[tuple[int, memoryview]]:
        """(position from the range's start, bytes) pieces of a ReadRange as they arrive.

        UNAVAILABLE before the first piece is retried as every read is; a
        stream that breaks later raises Unavailable.
        """
        def first_piece():
            stream = self._raw_reads["ReadRange"](request, timeout=self.batch_timeout_s,
                                                  metadata=logs.outgoing_metadata())
            return stream, next(stream, None)

        stream, raw = call_with_retry(first_piece, address=self.address,
                                      timeout_s=self.reconnect_timeout_s)
        received = 0
        expected = None
        try:
            while raw is not None:
                header, data = grpc_chunks.decode_chunk(raw)
                if expected is None:
                    expected = header.payload_bytes
                if header.data_offset != received:
                    raise Unavailable(f"DLFS daemon at {self.address} sent a read reply out of "
                                      f"order ({header.data_offset} != {received})")
                if len(data):
                    yield received, data.toreadonly()
                    received += len(data)
                raw = next(stream, None)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.address) from None
        if expected is not None and received != expected:
            raise Unavailable(f"DLFS daemon at {self.address} ended a read reply after "
                              f"{received} of {expected} bytes")

    def dataset_info(self, dataset: str, known: DatasetInfo | None = None) -> DatasetInfo:
        """The summary of the current version of `dataset` (GetDataset; `known`, the
        version the caller had, is unused here).  Raises NotFound."""
        return metadata.dataset_info(self, dataset)

    def prefetch(self, request: pb.PrefetchRequest, wait: bool = True) -> bool:
        """Send a read-ahead hint; False when the daemon's queue dropped it.  A gRPC call
        always waits for its answer (`wait` matters on the data path)."""
        try:
            self.call("Prefetch", request, retry=False)
        except Overloaded:
            return False
        return True

    def _read(self, method: str, request) -> list[memoryview]:
        """One read call (a BatchChunk stream, or one chunk for GetSmallBatch), retried on
        UNAVAILABLE; the samples as views into the assembled payload."""
        unary = method == "GetSmallBatch"
        stub_method = self._raw_reads[method]

        def attempt() -> list[memoryview]:
            try:
                reply = stub_method(request, timeout=self.batch_timeout_s,
                                    metadata=logs.outgoing_metadata())
                return assemble(iter((reply,)) if unary else reply)
            except grpc.RpcError as exc:
                if unary and exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    raise _NoUnaryReads() from None
                raise

        return call_with_retry(attempt, address=self.address,
                               timeout_s=self.reconnect_timeout_s)


class _Channel:
    """A gRPC channel to one daemon, its stub, and the raw read calls.

    Read replies are handed to dlfs.formats.grpc_chunks raw, which slices out the payload.
    """

    def __init__(self, address: str, settings: ChannelSettings):
        self.channel = open_channel(address, settings)
        self.stub = dlfs_pb2_grpc.DlfsStub(self.channel)
        self.raw_reads = {
            name: self.channel.unary_stream(f"/dlfs.v1.Dlfs/{name}",
                                            request_serializer=request_type.SerializeToString,
                                            response_deserializer=None)
            for name, request_type in _READ_REQUEST_TYPES.items()}
        self.raw_reads["GetSmallBatch"] = self.channel.unary_unary(
            "/dlfs.v1.Dlfs/GetSmallBatch", request_serializer=pb.GetBatchRequest.SerializeToString,
            response_deserializer=None)


def assemble(chunks) -> list[memoryview]:
    """Join a raw BatchChunk stream into one payload and slice it per sample.

    A reply of one chunk is sliced in place; several are copied once into
    a payload-sized buffer.  Raises Unavailable when chunks come out of
    order or the stream ends short.
    """
    first, data = grpc_chunks.decode_chunk(next(chunks))
    if len(data) == first.payload_bytes:
        payload = data.toreadonly()
    else:
        buffer = bytearray(first.payload_bytes)
        buffer[: len(data)] = data
        filled = len(data)
        for raw in chunks:
            header, piece = grpc_chunks.decode_chunk(raw)
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
