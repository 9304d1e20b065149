"""`DataPathTransport`: one daemon, with its reads on the data path.

The default transport of `Client(address)`.  It holds a `GrpcTransport`
for the daemon's control calls (its `control`: metadata, ingest) and for
reads when there is no data path, and the daemon's data path
(`dlfs.client.transport.datapath_pool`) for reads: batches and ranges are
received straight into the caller's `out` or a recycled buffer, each
sample checked against its CRC32C here.  In a forked worker, where gRPC
cannot be used, hints and the dataset's current version go over the data
path too.  The data path is asked for once (GetDataPath); a daemon that
offers none (it serves TLS, or was started without one) or whose data port
cannot be reached on the first try is read through gRPC instead, with one
log line saying why.  What follows a failed read (again at once on a new
connection, after a pause, through gRPC, or raised) is the client's one call
policy (`call_policy`); this module only carries out its steps.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import NamedTuple

import numpy as np

from dlfs import limits, logs
from dlfs.client import process_state
from dlfs.client.reply_buffers import BufferPool
from dlfs.client.transport.checksum_errors import with_sample_path
from dlfs.client.transport.datapath_pool import DataPath, endpoints
from dlfs.client.transport.grpc_channel import grpc_usable
from dlfs.client.transport.grpc_transport import GrpcTransport
from dlfs.client.transport.one_daemon import OneDaemon
from dlfs.client.transport.read_requests import (
    BatchRequest,
    PrefetchRequest,
    RangeRequest,
    range_id,
    request_ids,
)
from dlfs.client.transport.call_policy import Call, Step
from dlfs.errors import DataCorruption, InvalidArgument
from dlfs.types import DatasetInfo

log = logging.getLogger(__name__)

# The data path of a transport, before it was asked for.
_UNKNOWN = object()


class DataPathHint(NamedTuple):
    """Where a daemon's data path listens, as GetDataPath said: lets another process
    (a DataLoader worker, a read-ahead helper) skip asking (see `Dataset.ticket`)."""

    port: int
    unix_socket: str
    instance: bytes


class _NoDataPath(Exception):
    """The daemon offers no data path (any more), or the policy said gRPC for a
    while: read through gRPC."""


# Which of the data path's sockets a client uses.
SOCKET_CHOICES = ("auto", "tcp", "unix")


class DataPathTransport(OneDaemon):
    """A daemon's transport whose reads take its data path when it offers one
    (`contract.Daemon`).

    `pool` recycles reply buffers (one per client by default).  `socket`
    picks the data path's endpoint: "auto" (the Unix socket when this host
    reaches it, else TCP), "tcp" or "unix".  `hint`: where the data path
    listens, from another process (no GetDataPath then).  The other options
    are `GrpcTransport`'s.  Thread-safe; after `os.fork` the child opens its
    own data connections.
    """

    def __init__(self, address: str, *, pool: BufferPool | None = None, socket: str = "auto",
                 hint: DataPathHint | None = None, **options):
        if socket not in SOCKET_CHOICES:
            raise InvalidArgument(f"data_path must be one of {', '.join(SOCKET_CHOICES)}, "
                                  f"True or False, not {socket!r}")
        self.grpc = GrpcTransport(address, **options)
        self.control = self.grpc.control
        self.address = address
        self.addresses = (address,)
        self.timeout_s = self.grpc.timeout_s
        self.batch_timeout_s = self.grpc.batch_timeout_s
        self.reconnect_timeout_s = self.grpc.reconnect_timeout_s
        self.settings = self.grpc.settings
        self._socket = socket
        self.pool = pool or BufferPool()
        self._lock = threading.Lock()
        self._data = _UNKNOWN
        if hint is None and not grpc_usable():
            hint = process_state.learnt_data_paths.get(address)
        self._hint = hint
        self.no_data_path_reason = ""  # why data_path() is None
        self._worked = False  # some data connection of this transport got a WELCOME
        # The data path refused a connection (Overloaded) since then, and until then
        # reads go through gRPC (time.monotonic()): the policy's "refused" step.
        self._busy_since: float | None = None
        self._busy_until = 0.0

    def close(self) -> None:
        data = self._data
        if isinstance(data, DataPath):
            data.close()
        self.grpc.close()

    def __repr__(self) -> str:
        return f"DataPathTransport({self.address!r})"

    def forget(self, dataset: str) -> None:
        """Nothing is cached about a dataset here."""

    def prepare(self, dataset: str) -> None:
        """Nothing to set up: the data path is asked for at the first read."""

    def data_path(self) -> DataPath | None:
        """The daemon's data path (asked for at the first read), or None: reads use gRPC."""
        with self._lock:
            if self._data is _UNKNOWN:
                hint, self._hint = self._hint, None
                self._data = self._discover() if hint is None else self._from_hint(hint)
            return self._data

    def data_path_hints(self) -> dict[str, DataPathHint]:
        """{address: where its data path listens} for another process to reuse; asks now."""
        data = self.data_path()
        return {} if data is None else {self.address: data.hint}

    # --- metadata ----------------------------------------------------------------------

    def dataset_info(self, dataset: str, known: DatasetInfo | None = None) -> DatasetInfo:
        """The current version of `dataset` (`known`: the version this client had).

        Over gRPC (GetDataset) where it can be used; in a forked worker over
        the data path (STAT_DATASET): generation, samples and bytes are new,
        the rest is `known`'s (unchanged for a one-daemon dataset but for
        `created_ns` and `extents`), or without `known` zero.
        """
        if grpc_usable() or self.data_path() is None:
            return self.control.get_dataset(dataset)
        generation, samples, size = self._on_data_path(
            dataset, lambda data: data.stat_dataset(dataset),
            fallback=lambda: self.control.get_dataset(dataset))
        if known is None:
            return DatasetInfo(dataset, samples, size, True, 0, 0, generation=generation)
        return dataclasses.replace(known, generation=generation, samples=samples, bytes=size)

    # --- reads -------------------------------------------------------------------------

    def get_batch(self, request: BatchRequest, out=None) -> list[memoryview]:
        """Over the data path: one GET_BATCH (paths: one Lookup first), received into
        `out` or a pooled buffer; else as `GrpcTransport.get_batch`."""
        if self.data_path() is None or not request.size:
            return self.grpc.get_batch(request, out)
        ids = request_ids(request, self.lookup)
        return self._on_data_path(request.dataset, lambda data: data.get_batch(
            request.dataset, ids, generation=request.generation, hints=request.prefetch_ids,
            verify=request.verify, out=out, request_id=logs.current_request_id()).samples,
            fallback=lambda: self.grpc.get_batch(request, out))

    def prefetch(self, request: PrefetchRequest, wait: bool = True) -> bool:
        """As gRPC's Prefetch (False: the daemon's queue dropped the hint), but a hint by
        ids rides the data path, as a GET_BATCH of no samples: a reader hinting
        every batch then pays no gRPC call per batch (and a forked worker can
        hint at all).  Unless `wait`, it is sent without waiting for the
        daemon's answer (True: sent; see `DataPath.send_hints`).  Hints by
        path go over gRPC (they need the names resolved)."""
        if request.paths is not None or self.data_path() is None:
            return self.grpc.prefetch(request)
        hints = request.ids
        if wait:
            def send(data) -> bool:
                return not data.get_batch(request.dataset, np.empty(0, np.int64), hints=hints,
                                          request_id=logs.current_request_id()).hints_dropped
        else:
            def send(data) -> bool:
                data.send_hints(request.dataset, hints, request_id=logs.current_request_id())
                return True
        return self._on_data_path(request.dataset, send,
                                  fallback=lambda: self.grpc.prefetch(request))

    def read_range(self, request: RangeRequest) -> memoryview:
        if self.data_path() is None:
            return self.grpc.read_range(request)
        sample_id = range_id(request, self.lookup)
        return self._on_data_path(request.dataset, lambda data: data.read_range(
            request.dataset, sample_id, request.offset, request.length,
            generation=request.generation, verify=request.verify,
            request_id=logs.current_request_id()).samples[0],
            fallback=lambda: self.grpc.read_range(request))

    def read_chunks(self, request: RangeRequest):
        """As the gRPC stream (`GrpcTransport.read_chunks`), but a range of at
        most `limits.data_path_chunks_bytes_max` comes over the data path as
        one piece: one reply into a pooled buffer, block CRCs checked, at the
        data path's speed rather than gRPC's.  Longer ranges (or to the end
        of the sample, length 0) stream over gRPC, piece by piece."""
        if self.data_path() is None or not 0 < request.length <= limits.data_path_chunks_bytes_max:
            yield from self.grpc.read_chunks(request)
            return
        yield 0, self.read_range(request)

    def _on_data_path(self, dataset: str, read, fallback):
        """`read(data_path)` as one call of the policy (`call_policy.Call`), deadline
        `batch_timeout_s`, with `fallback()` (the read through gRPC) as its other way.

        The steps carried out here: an attempt finds the data path (asked for
        again when the last connect failed on every endpoint: a daemon
        restarted since listens on another port) or, while the policy's
        "refused" step holds (`limits.data_overloaded_retry_s`) or where there
        is none, reads through gRPC; the other way is taken for a while on a
        refusal (logged once per episode), for good when the data path never
        worked (a blocked port, logged).  A checksum mismatch is raised naming
        the sample's path too (one Lookup, on that error only).
        """
        def attempt():
            if time.monotonic() < self._busy_until and grpc_usable():
                raise _NoDataPath()  # refused a moment ago: gRPC meanwhile
            data = self.data_path()
            if data is None:
                raise _NoDataPath()
            try:
                result = read(data)
            finally:
                if data.ever_connected:
                    self._worked = True
                if data.unreachable:
                    self._forget(data)
            if self._busy_since is not None:
                log.info("the data path of the DLFS daemon at %s serves this client again",
                         self.address)
                self._busy_since = None
            return result

        def other_way(step: Step):
            if step.rule == "refused":
                self._refused(call.tried[-1])
            else:
                log.warning("the data path of the DLFS daemon at %s cannot be reached (%s); "
                            "reading through gRPC instead", self.address, call.tried[-1])
                self._forget(None)
            return fallback()

        call = self.control.call(self.batch_timeout_s)
        known = self._data
        # A data path that served this transport's file writers worked too: not reaching
        # it now means the daemon is away (or restarted), not that its port is blocked.
        worked = self._worked or (isinstance(known, DataPath) and known.ever_connected)
        try:
            return call.run(attempt, other_way if grpc_usable() else None,
                            fall_back_unreached=not worked)
        except _NoDataPath:
            return fallback()
        except DataCorruption as exc:
            raise with_sample_path(exc, dataset, self.control.lookup) from None

    def _refused(self, why: str) -> None:
        """The policy's "refused" step (`why`: the refusal): gRPC for
        `limits.data_overloaded_retry_s`, said once per episode."""
        now = time.monotonic()
        self._busy_until = now + limits.data_overloaded_retry_s
        if self._busy_since is None:
            self._busy_since = now
            log.warning("the data path of the DLFS daemon at %s refused a connection "
                        "(Overloaded: %s); reading through gRPC until it has room",
                        self.address, why)

    def forget_data_path(self, data: DataPath) -> None:
        """Ask for the data path again at its next use, as a read does after `data`
        proved unreachable (the daemon restarted: another port or instance); for a
        caller that connects on its own (a file writer)."""
        self._forget(data)

    def _forget(self, data: DataPath | None) -> None:
        """Drop the data path `data` (ask again at the next read), or with None give the
        data path up for this transport."""
        with self._lock:
            current = self._data
            if data is not None and current is not data:
                return  # another thread replaced it already
            self._data = _UNKNOWN if data is not None else None
        if isinstance(current, DataPath):
            current.close()

    def _from_hint(self, hint: DataPathHint) -> DataPath | None:
        found = endpoints(self.address, hint.port if self._socket != "unix" else 0,
                          hint.unix_socket if self._socket != "tcp" else "")
        if not found or self.settings.tls:
            return self._discover()
        return self._data_path(found, hint)

    def _data_path(self, found, hint: DataPathHint) -> DataPath:
        process_state.learnt_data_paths[self.address] = hint
        return DataPath(found, hint=hint, token=self.settings.token,
                        connect_timeout_s=min(self.timeout_s, limits.data_connect_timeout_s),
                        reply_timeout_s=self.batch_timeout_s, pool=self.pool)

    def _discover(self) -> DataPath | None:
        if self.settings.tls:
            # The data path carries no TLS: reads stay on the encrypted channel.
            self.no_data_path_reason = "this client uses TLS, which the data path does not carry"
            return None
        offer = self.control.data_path_offer()
        if not offer.enabled:
            self.no_data_path_reason = f"it offers none ({offer.reason})"
        else:
            found = endpoints(self.address, offer.port if self._socket != "unix" else 0,
                              offer.unix_socket if self._socket != "tcp" else "")
            if found:
                return self._data_path(found, DataPathHint(offer.port, offer.unix_socket,
                                                           offer.instance))
            self.no_data_path_reason = f"it offers no {self._socket} socket for its data path"
        log.info("reading from the DLFS daemon at %s through gRPC: %s", self.address,
                 self.no_data_path_reason)
        return None
