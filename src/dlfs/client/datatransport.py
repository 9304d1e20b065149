"""`DataPathTransport`: one daemon, with its reads on the data path.

The default transport of `Client(address)`.  Control calls (metadata,
ingest, hints) go over gRPC as in `DaemonTransport`; batches and ranges go
over the daemon's data path (`dlfs.client.datapath`), received straight
into the caller's `out` or a recycled buffer, each sample checked against
its CRC32C here.  The data path is asked for once (GetDataPath); a daemon
that offers none (it serves TLS, or predates the data path) or whose data
port cannot be reached on the first try is read through gRPC instead, with
one log line saying why.
"""

from __future__ import annotations

import logging
import os
import threading

import grpc
import numpy as np

from dlfs import datawire, limits, logs
from dlfs.client.buffers import BufferPool
from dlfs.client.datapath import DataPath, endpoints
from dlfs.client.requests import batch_size
from dlfs.client.retry import call_with_retry
from dlfs.client.transport import DaemonTransport
from dlfs.errors import Unavailable
from dlfs.proto import dlfs_pb2 as pb

log = logging.getLogger(__name__)

# The data path of a transport, before it was asked for.
_UNKNOWN = object()


class DataPathTransport(DaemonTransport):
    """A daemon's transport whose reads take its data path when it offers one.

    `pool` recycles reply buffers (one per client by default).  Thread-safe;
    after `os.fork` the child opens its own data connections.
    """

    def __init__(self, address: str, *, token: str | None = None, tls_ca: str | None = None,
                 pool: BufferPool | None = None, **options):
        super().__init__(address, token=token, tls_ca=tls_ca, **options)
        self._token = token if token is not None else os.environ.get("DLFS_TOKEN", "")
        self._tls = bool(tls_ca if tls_ca is not None else os.environ.get("DLFS_TLS_CA", ""))
        self.pool = pool or BufferPool()
        self._lock = threading.Lock()
        self._data = _UNKNOWN
        self._connected_once = False

    def close(self) -> None:
        data = self._data
        if isinstance(data, DataPath):
            data.close()
        super().close()

    def data_path(self) -> DataPath | None:
        """The daemon's data path (asked for at the first read), or None: reads use gRPC."""
        with self._lock:
            if self._data is _UNKNOWN:
                self._data = self._discover()
            return self._data

    def get_batch(self, request: pb.GetBatchRequest, out=None) -> list[memoryview]:
        data = self.data_path()
        if data is None or not batch_size(request):
            return super().get_batch(request, out)
        ids = self.ids_of(request)
        hints = np.asarray(request.prefetch_ids, dtype=np.int64)
        return self._on_data_path(lambda: data.get_batch(
            request.dataset, ids, hints=hints, verify=not request.skip_verify, out=out,
            request_id=logs.current_request_id()).samples,
            fallback=lambda: super(DataPathTransport, self).get_batch(request, out))

    def read_range(self, request: pb.ReadRangeRequest) -> memoryview:
        data = self.data_path()
        if data is None:
            return super().read_range(request)
        sample_id = request.id if not request.path else int(self.ids_of(
            pb.GetBatchRequest(dataset=request.dataset, paths=[request.path]))[0])
        return self._on_data_path(lambda: data.read_range(
            request.dataset, sample_id, request.offset, request.length,
            verify=not request.skip_verify, request_id=logs.current_request_id()).samples[0],
            fallback=lambda: super(DataPathTransport, self).read_range(request))

    def _on_data_path(self, read, fallback):
        """`read()` with retry on UNAVAILABLE; if the data path never answered at all,
        give it up for gRPC (`fallback()`)."""
        try:
            result = call_with_retry(read, address=self.address,
                                     timeout_s=self.reconnect_timeout_s if self._connected_once
                                     else 0.0)
        except Unavailable as exc:
            if self._connected_once:
                raise
            log.warning("the data path of the DLFS daemon at %s cannot be reached (%s); reading "
                        "through gRPC instead", self.address, exc)
            with self._lock:
                data, self._data = self._data, None
            if isinstance(data, DataPath):
                data.close()
            return fallback()
        self._connected_once = True
        return result

    def _discover(self) -> DataPath | None:
        if self._tls:
            return None  # the data path carries no TLS: reads stay on the encrypted channel

        def ask():
            try:
                return self._stub.GetDataPath(pb.GetDataPathRequest(), timeout=self.timeout_s,
                                              metadata=logs.outgoing_metadata())
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    return None
                raise

        info = call_with_retry(ask, address=self.address, timeout_s=self.reconnect_timeout_s)
        if info is None or not info.enabled:
            log.info("the DLFS daemon at %s offers no data path (%s); reading through gRPC",
                     self.address, info.reason if info is not None else "it predates it")
            return None
        if info.version != datawire.VERSION:
            log.info("the DLFS daemon at %s speaks data path version %d, this client %d; "
                     "reading through gRPC", self.address, info.version, datawire.VERSION)
            return None
        found = endpoints(self.address, info.port, info.unix_socket)
        if not found:
            return None
        return DataPath(found, instance=info.instance, token=self._token,
                        connect_timeout_s=min(self.timeout_s, limits.data_connect_timeout_s),
                        reply_timeout_s=self.batch_timeout_s, pool=self.pool)
