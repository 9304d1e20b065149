"""etcd's v3 API over gRPC: reads, puts, transactions, leases and watches as plain values.

The stubs are generated from dlfs/proto/etcd_api.proto (the subset of
etcd's API DLFS uses, scripts/gen_proto.py); protobuf stops here: callers
get `KeyValue`s and give `Compare`, `Put` and `Delete` values.

Chosen over a library by measurement and maintenance (docs/cluster.md, "The
etcd client: generated stubs", has the figures): faster per call than
etcd3gw (the JSON gateway client), with no dependency beyond the grpcio
DLFS already uses; python-etcd3 does not import with protobuf 7.

Endpoints: "http://HOST:PORT" or "HOST:PORT", several separated by ','.  A
call goes to the endpoint that answered last; UNAVAILABLE or a timeout of
one attempt (`limits.etcd_attempt_timeout_s`) tries the next one, round
after round, and when none answered within `timeout_s`,
`dlfs.errors.Unavailable` names them all.  A write whose answer was lost
may have been applied: puts and deletes are idempotent, and the
transactions' callers read back (the commits of dlfs.client.cluster do).  TLS to etcd is not supported yet (plain
http:// on a trusted network, as the daemons' own --insecure).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Callable, Sequence

import grpc

from dlfs import limits
from dlfs.errors import DlfsError, FailedPrecondition, InvalidArgument, Unavailable
from dlfs.proto import etcd_api_pb2 as pb
from dlfs.proto import etcd_api_pb2_grpc as rpc

log = logging.getLogger(__name__)

# Codes after which another endpoint may answer.
_TRY_NEXT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
             grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED)
# A watch opened with this metadata is cancelled by an etcd member that loses
# its leader (a member cut off from the quorum), rather than staying silent.
_REQUIRE_LEADER = (("hasleader", "true"),)
# etcd members come back within a second of a restart: reconnect as soon (gRPC's own
# backoff grows to two minutes, and fails every call on the channel meanwhile).
_BACKOFF_MS = int(limits.reconnect_backoff_max_s * 1000)
_CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", _BACKOFF_MS),
                    ("grpc.min_reconnect_backoff_ms", _BACKOFF_MS),
                    ("grpc.max_reconnect_backoff_ms", _BACKOFF_MS)]
_TARGETS = {"version": pb.Compare.VERSION, "create": pb.Compare.CREATE, "mod": pb.Compare.MOD}
_OPS = {"==": pb.Compare.EQUAL, "!=": pb.Compare.NOT_EQUAL, ">": pb.Compare.GREATER,
        "<": pb.Compare.LESS}


@dataclasses.dataclass(frozen=True)
class KeyValue:
    """One key as etcd holds it: revisions are etcd's (0 for "never")."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclasses.dataclass(frozen=True)
class Compare:
    """A condition of a transaction: `target` of `key` `op` `number`.

    `target`: "version" (how often it was written since it was created; 0:
    the key does not exist), "create" (its create revision) or "mod" (its
    last modification's revision; 0: absent).  `op`: "==", "!=", ">", "<".
    """

    key: str
    target: str
    op: str
    number: int


@dataclasses.dataclass(frozen=True)
class Put:
    """Write `value` at `key`, attached to `lease` (0: none; the key then lives until deleted)."""

    key: str
    value: bytes
    lease: int = 0


@dataclasses.dataclass(frozen=True)
class Delete:
    """Delete `key` (nothing happens if it is absent)."""

    key: str


def parse_endpoints(text: str | Sequence[str]) -> tuple[str, ...]:
    """("HOST:PORT", ...) of "http://A:2379,B:2379" or a list of such.  Raises
    InvalidArgument for an empty list or https:// (not supported)."""
    parts = [text] if isinstance(text, str) else list(text)
    endpoints = []
    for part in parts:
        for item in part.split(","):
            item = item.strip().rstrip("/")
            if not item:
                continue
            if item.startswith("https://"):
                raise InvalidArgument(f"etcd endpoint {item}: TLS to etcd is not supported yet; "
                                      "give http:// endpoints on a trusted network")
            endpoints.append(item.removeprefix("http://"))
    if not endpoints:
        raise InvalidArgument("no etcd endpoint given: --etcd http://HOST:2379[,HOST:2379...] "
                              "(or $DLFS_ETCD)")
    return tuple(dict.fromkeys(endpoints))


def prefix_end(prefix: str) -> bytes:
    """The range end of every key that starts with `prefix` (its last byte plus one)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return bytes(raw)


def _kv(message) -> KeyValue:
    return KeyValue(message.key.decode(), bytes(message.value), message.create_revision,
                    message.mod_revision, message.version, message.lease)


def _compare(compare: Compare):
    message = pb.Compare(result=_OPS[compare.op], target=_TARGETS[compare.target],
                         key=compare.key.encode())
    setattr(message, {"version": "version", "create": "create_revision",
                      "mod": "mod_revision"}[compare.target], compare.number)
    return message


def _op(op: Put | Delete):
    if isinstance(op, Put):
        return pb.RequestOp(request_put=pb.PutRequest(key=op.key.encode(), value=op.value,
                                                      lease=op.lease))
    return pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=op.key.encode()))


class EtcdClient:
    """A client of one etcd cluster (its `endpoints`).  Thread-safe; one channel per
    endpoint, opened at the first call to it."""

    def __init__(self, endpoints: str | Sequence[str], *,
                 timeout_s: float = limits.etcd_call_timeout_s):
        self.endpoints = parse_endpoints(endpoints)
        self.timeout_s = timeout_s
        self._channels: dict[str, grpc.Channel] = {}
        self._current = 0
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"EtcdClient({','.join(self.endpoints)!r})"

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()

    def channel(self, endpoint: str) -> grpc.Channel:
        with self._lock:
            if self._closed:
                raise Unavailable("the etcd client was closed")
            channel = self._channels.get(endpoint)
            if channel is None:
                channel = self._channels[endpoint] = grpc.insecure_channel(
                    endpoint, options=_CHANNEL_OPTIONS)
            return channel

    def order(self) -> list[str]:
        """Endpoints, the one that answered last first."""
        start = self._current
        return [self.endpoints[(start + i) % len(self.endpoints)]
                for i in range(len(self.endpoints))]

    def answered(self, endpoint: str) -> None:
        self._current = self.endpoints.index(endpoint)

    def attempts(self, timeout_s: float | None = None):
        """(endpoint, deadline of one attempt) to try in turn, the one that answered last
        first, round after round (`limits.etcd_reconnect_pause_s` apart), until
        `timeout_s` (default the client's) has passed.  An attempt gets at most
        `limits.etcd_attempt_timeout_s`: a member whose leader was just killed holds
        a write until its own timeout, while another member, or the same one once a
        new leader is elected (a second), takes it."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            for endpoint in self.order():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                yield endpoint, min(remaining, limits.etcd_attempt_timeout_s)
            pause = min(limits.etcd_reconnect_pause_s, deadline - time.monotonic())
            if pause <= 0:
                return
            time.sleep(pause)

    def _call(self, stub_class, method: str, request, timeout_s: float | None = None):
        """One unary call, tried on each endpoint in turn (`attempts`) until one answers.
        A write whose attempt timed out may have been applied and is sent again:
        every write DLFS makes is idempotent or read back (module doc)."""
        failures: dict[str, str] = {}
        for endpoint, attempt_s in self.attempts(timeout_s):
            call = getattr(stub_class(self.channel(endpoint)), method)
            try:
                reply = call(request, timeout=attempt_s)
            except grpc.RpcError as exc:
                if exc.code() in _TRY_NEXT:
                    failures[endpoint] = f"{endpoint}: {exc.code().name} {exc.details()}"
                    continue
                raise _error(exc, endpoint) from None
            self.answered(endpoint)
            return reply
        raise Unavailable(f"etcd does not answer ({'; '.join(failures.values())}); check that "
                          "etcd runs and that --etcd names its client URLs")

    # --- keys -----------------------------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        """The key, or None.  One round trip (linearizable)."""
        reply = self._call(rpc.KVStub, "Range", pb.RangeRequest(key=key.encode()))
        return _kv(reply.kvs[0]) if reply.kvs else None

    def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under `prefix` in key order, and the revision they were read at
        (one consistent snapshot).  One round trip; for control state (small)."""
        reply = self._call(rpc.KVStub, "Range", pb.RangeRequest(key=prefix.encode(),
                                                                 range_end=prefix_end(prefix)))
        return [_kv(kv) for kv in reply.kvs], reply.header.revision

    def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Write `key`; the revision of the write.  Raises InvalidArgument above
        `limits.etcd_value_bytes_max`."""
        _check_size(key, value)
        reply = self._call(rpc.KVStub, "Put", pb.PutRequest(key=key.encode(), value=value,
                                                            lease=lease))
        return reply.header.revision

    def delete(self, key: str) -> int:
        """Delete `key`; how many keys went (0 or 1)."""
        reply = self._call(rpc.KVStub, "DeleteRange", pb.DeleteRangeRequest(key=key.encode()))
        return reply.deleted

    def txn(self, compares: Sequence[Compare], success: Sequence[Put | Delete],
            failure: Sequence[Put | Delete] = ()) -> tuple[bool, int]:
        """If every compare holds, apply `success`, else `failure`, all at one revision.
        (whether the compares held, that revision).  An Unavailable may come after
        etcd applied it: read back to know."""
        for op in success:
            if isinstance(op, Put):
                _check_size(op.key, op.value)
        reply = self._call(rpc.KVStub, "Txn", pb.TxnRequest(
            compare=[_compare(c) for c in compares], success=[_op(o) for o in success],
            failure=[_op(o) for o in failure]))
        return reply.succeeded, reply.header.revision

    # --- leases ---------------------------------------------------------------------

    def grant_lease(self, ttl_s: int) -> int:
        """A new lease of `ttl_s` seconds; its id.  Keep it alive with `LeaseKeeper`."""
        reply = self._call(rpc.LeaseStub, "LeaseGrant", pb.LeaseGrantRequest(TTL=int(ttl_s)))
        if reply.error:
            raise Unavailable(f"etcd granted no lease: {reply.error}")
        return reply.ID

    def revoke_lease(self, lease_id: int) -> None:
        """End the lease now: every key attached to it is deleted.  Never raises (an
        unreachable etcd lets the lease expire by itself)."""
        try:
            self._call(rpc.LeaseStub, "LeaseRevoke", pb.LeaseRevokeRequest(ID=lease_id),
                       timeout_s=min(self.timeout_s, 2.0))
        except DlfsError as exc:
            log.info("lease %x not revoked (%s); it expires by itself", lease_id, exc)

    def keep_alive_once(self, lease_id: int, timeout_s: float | None = None) -> int:
        """Renew the lease once; the TTL it has now (0: it had expired).  One round trip
        (tried as `attempts`, for at most `timeout_s`)."""
        failures: dict[str, str] = {}
        for endpoint, attempt_s in self.attempts(timeout_s):
            stub = rpc.LeaseStub(self.channel(endpoint))
            try:
                for reply in stub.LeaseKeepAlive(iter([pb.LeaseKeepAliveRequest(ID=lease_id)]),
                                                 timeout=attempt_s):
                    self.answered(endpoint)
                    return reply.TTL
                failures[endpoint] = f"{endpoint}: no answer"
            except grpc.RpcError as exc:
                if exc.code() not in _TRY_NEXT:
                    raise _error(exc, endpoint) from None
                failures[endpoint] = f"{endpoint}: {exc.code().name}"
        raise Unavailable(f"etcd does not answer a keepalive ({'; '.join(failures.values())})")

    # --- the cluster itself (tests, `dlfs status`) ---------------------------------

    def status(self, endpoint: str) -> tuple[int, int]:
        """(the id of the etcd member at `endpoint`, the id of the leader it knows)."""
        stub = rpc.MaintenanceStub(self.channel(endpoint))
        try:
            reply = stub.Status(pb.StatusRequest(), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise _error(exc, endpoint) from None
        return reply.header.member_id, reply.leader

    def watch(self, prefix: str, on_change: Callable[[int], None],
              on_broken: Callable[[Exception], None] | None = None) -> "PrefixWatch":
        """Start watching every key under `prefix` (see `PrefixWatch`)."""
        return PrefixWatch(self, prefix, on_change, on_broken)


def _check_size(key: str, value: bytes) -> None:
    if len(value) > limits.etcd_value_bytes_max:
        raise InvalidArgument(
            f"{key} would hold {len(value)} bytes in etcd, over {limits.etcd_value_bytes_max} "
            "(limits.etcd_value_bytes_max): etcd holds control state only")


def _error(exc: grpc.RpcError, endpoint: str) -> DlfsError:
    """A typed error for an etcd refusal that another endpoint would refuse too."""
    message = f"etcd at {endpoint} refused: {exc.code().name} {exc.details()}"
    if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgument(message)
    if exc.code() == grpc.StatusCode.NOT_FOUND:  # an expired lease
        return FailedPrecondition(message)
    return Unavailable(message)


class PrefixWatch:
    """A thread that follows every change under `prefix`.

    `on_change(revision)` is called after each batch of events (the events of
    one transaction come in one batch) and each time the watch is
    established again (after a start, a broken stream, an etcd restart or
    a compaction): the consumer re-reads what it needs at that revision or
    later, so nothing is missed and no event needs interpreting.
    `on_broken(error)` is called when the stream breaks (etcd unreachable,
    or the etcd member lost its leader); the watch reopens it after
    `limits.etcd_reconnect_pause_s`, on the next endpoint.  Callbacks run
    on the watch's thread, one at a time.  `stop()` ends it.
    """

    def __init__(self, client: EtcdClient, prefix: str, on_change: Callable[[int], None],
                 on_broken: Callable[[Exception], None] | None = None):
        self._client = client
        self._prefix = prefix
        self._on_change = on_change
        self._on_broken = on_broken
        self._stopped = threading.Event()
        self._call = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="dlfs-etcd-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(limits.etcd_call_timeout_s)

    def _requests(self):
        yield pb.WatchRequest(create_request=pb.WatchCreateRequest(
            key=self._prefix.encode(), range_end=prefix_end(self._prefix)))
        self._stopped.wait()  # keep the request side open until stopped

    def _run(self) -> None:
        attempt = 0
        while not self._stopped.is_set():
            endpoints = self._client.order()
            endpoint = endpoints[attempt % len(endpoints)]
            attempt += 1
            try:
                stub = rpc.WatchStub(self._client.channel(endpoint))
                with self._lock:
                    if self._stopped.is_set():
                        return
                    self._call = stub.Watch(self._requests(), metadata=_REQUIRE_LEADER)
                for reply in self._call:
                    if reply.canceled:
                        raise Unavailable(f"etcd at {endpoint} cancelled the watch "
                                          f"({reply.cancel_reason or 'compacted'})")
                    if reply.created or reply.events:
                        attempt = 0
                        self._client.answered(endpoint)
                        self._on_change(reply.header.revision)
                raise Unavailable(f"etcd at {endpoint} ended the watch")
            except (grpc.RpcError, DlfsError) as exc:
                if self._stopped.is_set():
                    return
                if self._on_broken is not None:
                    self._on_broken(exc)
                self._stopped.wait(limits.etcd_reconnect_pause_s)
            except Exception:  # noqa: BLE001 - a consumer's bug must not end the watch silently
                log.exception("the etcd watch of %s failed; reopening it", self._prefix)
                self._stopped.wait(limits.etcd_reconnect_pause_s)


class LeaseKeeper:
    """Keeps a lease alive from a thread: one keepalive every third of its TTL.

    `lost` is set once etcd says the lease expired, or no keepalive got
    through for a whole TTL (etcd may have let it expire): the owner then
    makes a new lease (`on_lost()` is called once, on the keeper's thread).
    `stop()` ends the keepalives (it does not revoke the lease).
    """

    def __init__(self, client: EtcdClient, lease_id: int, ttl_s: float,
                 on_lost: Callable[[], None] | None = None, *,
                 clock: Callable[[], float] = time.monotonic):
        self.lease_id = lease_id
        self.ttl_s = ttl_s
        self.lost = threading.Event()
        self._client = client
        self._on_lost = on_lost
        self._clock = clock
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dlfs-etcd-lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(limits.etcd_call_timeout_s)

    def _run(self) -> None:
        renewed = self._clock()
        while not self._stopped.wait(self.ttl_s / 3):
            try:  # an attempt that outlived half the TTL is retried from the loop
                ttl = self._client.keep_alive_once(self.lease_id, timeout_s=self.ttl_s / 2)
            except DlfsError as exc:
                if self._clock() - renewed < self.ttl_s:
                    continue
                log.warning("lease %x: no keepalive got through for %.0f s (%s); it is lost",
                            self.lease_id, self.ttl_s, exc)
                ttl = 0
            if ttl > 0:
                renewed = self._clock()
                continue
            self.lost.set()
            if self._on_lost is not None:
                self._on_lost()
            return
