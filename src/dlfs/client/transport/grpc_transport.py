"""`GrpcTransport`: one daemon, everything over its gRPC service.

The transport of `Client(address, data_path=False)`, and what the data-path
transport falls back to for reads when the daemon offers no data path.
Control calls are its `control` (`grpc_control.GrpcControl`); reads are
here: replies arrive as raw BatchChunk messages and are sliced by
`dlfs.formats.grpc_chunks` without copying the payload, so all samples of
one batch are read-only memoryviews into one reply buffer.
"""

from __future__ import annotations

from typing import Iterator

import grpc

from dlfs import limits, logs
from dlfs.client.reply_buffers import copy_into
from dlfs.client.transport import grpc_messages as convert
from dlfs.client.transport.grpc_channel import ChannelSettings, DaemonChannel
from dlfs.client.transport.grpc_control import GrpcControl
from dlfs.client.transport.grpc_errors import from_rpc_error, typed
from dlfs.client.transport.one_daemon import OneDaemon
from dlfs.client.transport.read_requests import BatchRequest, PrefetchRequest, RangeRequest
from dlfs.client.transport.call_policy import time_left
from dlfs.errors import Overloaded, ReplyTooLarge, Unavailable
from dlfs.formats import grpc_chunks
from dlfs.types import DatasetInfo


class GrpcTransport(OneDaemon):
    """One daemon's gRPC channel, calls and reads (`contract.Daemon`).  Thread-safe; after
    `os.fork` make a new one.

    Timeouts: `timeout_s` is the deadline of control calls,
    `batch_timeout_s` of reads, each as a whole; `reconnect_timeout_s` bounds how
    long a call waits out an unreachable daemon (see `call_policy`).
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
        self.channel = DaemonChannel(address, self.settings)
        self.control = GrpcControl(self.channel, timeout_s=timeout_s,
                                   reconnect_timeout_s=reconnect_timeout_s)

    def close(self) -> None:
        self.channel.close()

    @property
    def _raw_reads(self) -> dict:
        return self.channel.raw_reads

    @property
    def _channel(self) -> grpc.Channel:
        return self.channel.channel

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.address!r})"

    # --- one daemon -------------------------------------------------------------------

    def data_path(self) -> None:
        """No data path: every read goes over gRPC."""
        return None

    def data_path_hints(self) -> dict:
        return {}

    def forget(self, dataset: str) -> None:
        """Nothing is cached about a dataset here."""

    def prepare(self, dataset: str) -> None:
        """Nothing to set up."""

    # --- metadata ----------------------------------------------------------------------

    def dataset_info(self, dataset: str, known: DatasetInfo | None = None) -> DatasetInfo:
        return self.control.get_dataset(dataset)

    # --- reads -------------------------------------------------------------------------

    def get_batch(self, request: BatchRequest, out=None) -> list[memoryview]:
        """The samples, in request order; one round trip.

        With `out` the samples are copied into it (`reply_buffers.copy_into`).
        Batches of up to `limits.small_batch_samples_max` samples first try
        the unary GetSmallBatch (fewer thread hand-offs) and stream only if
        the daemon says the reply does not fit one message.
        """
        if out is not None:
            return copy_into(out, self.get_batch(request))
        if not request.size:
            return []
        message = convert.batch_message(request)
        if request.size <= limits.small_batch_samples_max:
            try:
                return self._read("GetSmallBatch", message)
            except ReplyTooLarge:
                pass  # large samples: the stream carries them
        return self._read("GetBatch", message)

    def read_range(self, request: RangeRequest) -> memoryview:
        return self._read("ReadRange", convert.range_message(request))[0]

    def read_chunks(self, request: RangeRequest) -> Iterator[tuple[int, memoryview]]:
        message = convert.range_message(request)

        def first_piece():
            def call():
                stream = self._raw_reads["ReadRange"](
                    message, timeout=time_left(self.batch_timeout_s),
                    metadata=logs.outgoing_metadata())
                return stream, next(stream, None)

            return typed(call, self.address)

        stream, raw = self.control.call(self.batch_timeout_s).run(first_piece)
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

    def prefetch(self, request: PrefetchRequest, wait: bool = True) -> bool:
        """A gRPC Prefetch always waits for its answer (`wait` matters on the data path)."""
        message = convert.prefetch_message(request)
        try:
            typed(lambda: self.channel.stub.Prefetch(message, timeout=self.timeout_s,
                                                     metadata=logs.outgoing_metadata()),
                  self.address)
        except Overloaded:
            return False
        return True

    def _read(self, method: str, message) -> list[memoryview]:
        """One read call (a BatchChunk stream, or one chunk for GetSmallBatch) under the
        call policy; the samples as views into the assembled payload."""
        unary = method == "GetSmallBatch"
        stub_method = self._raw_reads[method]

        def attempt() -> list[memoryview]:
            try:
                reply = stub_method(message, timeout=time_left(self.batch_timeout_s),
                                    metadata=logs.outgoing_metadata())
                return assemble(iter((reply,)) if unary else reply)
            except grpc.RpcError as exc:
                raise from_rpc_error(exc, self.address) from None

        return self.control.call(self.batch_timeout_s).run(attempt)


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
