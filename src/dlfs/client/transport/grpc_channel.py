"""The gRPC channel to a daemon: message limits, reconnect backoff, TLS, token; and
whether this process may open one at all (`check_grpc_usable`: not after a
fork from a process that had opened one, unless gRPC's fork support is on).

`DaemonChannel` is one daemon's channel, opened at the first call that needs
it (a process that only reads over the data path, a forked DataLoader
worker, never opens one), with its stub and the raw read calls whose replies
`dlfs.formats.grpc_chunks` slices without copying.
"""

from __future__ import annotations

import os
import threading

import grpc

from dlfs import limits
from dlfs.client import process_state
from dlfs.errors import FailedPrecondition, InvalidArgument
from dlfs.proto import dlfs_pb2 as pb
from dlfs.proto import dlfs_pb2_grpc

FORK_SUPPORT_ENV = "GRPC_ENABLE_FORK_SUPPORT"

# Which process opened gRPC's core, and the channels that hold it up
# (`process_state.grpc`): channels opened to hold gRPC's core up, one per process
# that opened a channel (never used, never closed).  gRPC shuts its core down, on a
# thread of its own, when the last of its objects goes; a fork() meanwhile can
# deadlock inside gRPC's fork handlers, which take the lock that shutdown holds.
# That is the common order in training code: DLFSDataset closes the client it
# listed the dataset with, then a DataLoader forks its workers at once.  Seen once
# in CI: the test process stuck in os.fork(), with a "grpc_shutdown" thread
# waiting.  A process that used gRPC keeps the core up until it exits.
# Where a core-holding channel would connect: nowhere (it makes no call, so it
# never resolves or connects).
_CORE_HOLDER_ADDRESS = "unix-abstract:dlfs-grpc-core-holder"


class ChannelSettings:
    """How to reach a daemon: TLS credentials (or None) and the token, checked and read now.

    `token` and `tls_ca` default to $DLFS_TOKEN and $DLFS_TLS_CA.  Raises
    InvalidArgument for a client certificate without a CA, or a file that
    cannot be read.
    """

    def __init__(self, *, token: str | None = None, tls_ca: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None):
        self.token = token if token is not None else os.environ.get("DLFS_TOKEN", "")
        tls_ca = tls_ca if tls_ca is not None else os.environ.get("DLFS_TLS_CA", "")
        self.credentials = None
        if tls_ca:
            self.credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(tls_ca, "TLS CA"),
                private_key=_read(tls_key, "TLS client key") if tls_key else None,
                certificate_chain=_read(tls_cert, "TLS client certificate") if tls_cert else None)
        elif tls_cert or tls_key:
            raise InvalidArgument("a client certificate needs tls_ca (the daemon's CA) as well")

    @property
    def tls(self) -> bool:
        return self.credentials is not None


def fork_support_enabled() -> bool:
    """Whether this process's gRPC was imported with fork support on (read at grpc import)."""
    from grpc._cython import cygrpc  # the flag is only exposed there

    return bool(cygrpc.is_fork_support_enabled())


def grpc_usable() -> bool:
    """False in a forked child where opening a gRPC channel would hang (`check_grpc_usable`)."""
    opened_by = process_state.grpc.opened_by_pid
    return not (opened_by and opened_by != os.getpid()) or fork_support_enabled()


def check_grpc_usable() -> None:
    """Raise FailedPrecondition if a gRPC channel opened now could hang.

    After `fork` from a process whose gRPC core was running (it had opened
    a channel), the child's first call hangs unless gRPC's fork support is
    on.  Fork support is no cure either: with it on, a fork while another
    thread is in a call hangs parent or child (docs/DESIGN.md, "Forked
    processes", has the measurement).
    So DLFS leaves it off, and reads in forked children use only the data
    path; anything else that needs gRPC there fails with this error instead
    of hanging.
    """
    if not grpc_usable():
        raise FailedPrecondition(
            "this process was forked from one that had used gRPC, and gRPC cannot be used "
            "after such a fork (its first call would hang).  Reads by sample id work here "
            "(they use the data path); for anything else (paths, listings, other metadata) "
            "ask in the parent before starting the workers (e.g. map paths to ids with "
            "ds.index), or start the workers with multiprocessing_context='forkserver' or "
            f"'spawn', or set {FORK_SUPPORT_ENV}=true before Python starts (then a fork while "
            "another thread is in a gRPC call can hang)")


def open_channel(address: str, settings: ChannelSettings) -> grpc.Channel:
    """A channel to `address`: TLS when the settings have credentials, the token on every call.

    Raises FailedPrecondition where gRPC cannot be used (`check_grpc_usable`).
    """
    check_grpc_usable()
    core = process_state.grpc
    core.opened_by_pid = os.getpid()
    if core.holder_pid != core.opened_by_pid:
        core.holders.append(grpc.insecure_channel(_CORE_HOLDER_ADDRESS))
        core.holder_pid = core.opened_by_pid
    backoff_ms = int(limits.reconnect_backoff_max_s * 1000)
    options = [
        ("grpc.max_send_message_length", limits.message_bytes_max),
        ("grpc.max_receive_message_length", limits.message_bytes_max),
        # gRPC's default backoff grows to two minutes and is shared by every
        # channel to the address: a restarted daemon would stay unreachable.
        ("grpc.initial_reconnect_backoff_ms", backoff_ms),
        ("grpc.min_reconnect_backoff_ms", backoff_ms),
        ("grpc.max_reconnect_backoff_ms", backoff_ms),
    ]
    if settings.credentials is not None:
        channel = grpc.secure_channel(address, settings.credentials, options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    if settings.token:
        channel = grpc.intercept_channel(channel, _TokenInterceptor(settings.token))
    return channel


class DaemonChannel:
    """One daemon's gRPC channel, stub and raw read calls, opened at the first use.
    Thread-safe; after `os.fork` make a new one."""

    def __init__(self, address: str, settings: ChannelSettings):
        self.address = address
        self.settings = settings
        self._open: _OpenChannel | None = None
        self._lock = threading.Lock()

    def _now(self) -> "_OpenChannel":
        with self._lock:
            if self._open is None:
                self._open = _OpenChannel(open_channel(self.address, self.settings))
            return self._open

    @property
    def channel(self) -> grpc.Channel:
        return self._now().channel

    @property
    def stub(self) -> dlfs_pb2_grpc.DlfsStub:
        return self._now().stub

    @property
    def raw_reads(self) -> dict:
        """The read calls by method name, answering raw BatchChunk bytes."""
        return self._now().raw_reads

    def close(self) -> None:
        with self._lock:
            opened, self._open = self._open, None
        if opened is not None:
            opened.channel.close()


# The read calls whose replies are handed over raw, and their request types.
_RAW_STREAMS = {"GetBatch": pb.GetBatchRequest, "ReadRange": pb.ReadRangeRequest}


class _OpenChannel:
    """An open channel, its stub and the raw read calls."""

    def __init__(self, channel: grpc.Channel):
        self.channel = channel
        self.stub = dlfs_pb2_grpc.DlfsStub(channel)
        self.raw_reads = {
            name: channel.unary_stream(f"/dlfs.v1.Dlfs/{name}",
                                       request_serializer=request_type.SerializeToString,
                                       response_deserializer=None)
            for name, request_type in _RAW_STREAMS.items()}
        self.raw_reads["GetSmallBatch"] = channel.unary_unary(
            "/dlfs.v1.Dlfs/GetSmallBatch", request_serializer=pb.GetBatchRequest.SerializeToString,
            response_deserializer=None)


def grpc_core_held() -> bool:
    """Whether this process holds gRPC's core up (it opened a channel; see above)."""
    return process_state.grpc.holder_pid == os.getpid()


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise InvalidArgument(f"cannot read the {what} {path}: {exc.strerror}") from None


class _TokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                        grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds ``authorization: Bearer TOKEN`` to every call."""

    def __init__(self, token: str):
        self._metadata = (("authorization", f"Bearer {token}"),)

    def _details(self, details):
        return _Details(details, self._metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


class _Details(grpc.ClientCallDetails):
    def __init__(self, details, extra):
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = tuple(details.metadata or ()) + extra
        self.credentials = details.credentials
        self.wait_for_ready = details.wait_for_ready
        self.compression = details.compression
