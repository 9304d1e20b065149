"""Wire a Store into a running gRPC server and its data path (the `dlfs-server` process core).

gRPC serves a Unix socket in a private directory; the --listen port is the
door's (grpc/door.py), which admits each connection and relays it there.  The
data path is served by worker processes (datapath/workers.py) unless
--datapath-workers is 0, when the main process's threads serve it.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import shutil
import socket
import tempfile
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dlfs import limits, logs, native
from dlfs.errors import DlfsError
from dlfs.formats import datapath_frames as frames
from dlfs.proto import dlfs_pb2_grpc
from dlfs.server.auth import Authorizer, load_tokens
from dlfs.server.cluster_member import ClusterMember
from dlfs.server.grpc.call_guard import CallGuard
from dlfs.server.config import long_call_slots, peer_share
from dlfs.server.datapath.listen_sockets import bind_listeners, close_listeners
from dlfs.server.datapath.listener import DataPathInfo, DataPathServer
from dlfs.server.datapath.worker_store import WorkerSettings
from dlfs.server.datapath.workers import WorkerSupervisor, worker_shares
from dlfs.server.grpc.door import GrpcDoor
from dlfs.server.grpc.door_admission import DoorAdmission
from dlfs.server.grpc.interceptor import ErrorInterceptor, tolerant
from dlfs.server.grpc.service import DlfsServicer
from dlfs.server.read import mapped_sends
from dlfs.server.store import Store

log = logging.getLogger(__name__)

SERVICE_NAME = "dlfs.v1.Dlfs"


class Daemon:
    """A gRPC server serving one Store.  `start()` binds and returns the address.

    `log_format`: the daemon's (logs.FORMATS), which its data path workers use too.
    """

    def __init__(self, store: Store, log_format: str = "text"):
        self.store = store
        self.log_format = log_format
        config = store.config
        authorizer = Authorizer(load_tokens(config.tokens_file)) if config.tokens_file else None
        self._executor = ThreadPoolExecutor(max_workers=config.rpc_threads,
                                            thread_name_prefix="dlfs-rpc")
        slots = long_call_slots(config.rpc_threads)
        self.guard = CallGuard(slots=slots,
                               per_client=min(config.streams_per_client_max, slots),
                               stall_timeout_s=config.stream_stall_timeout_s)
        self.server = grpc.server(
            self._executor,
            interceptors=[ErrorInterceptor(store.metrics, authorizer, self.guard)],
            maximum_concurrent_rpcs=config.rpcs_concurrent_max,
            options=[
                ("grpc.max_send_message_length", config.message_bytes_max),
                ("grpc.max_receive_message_length", config.message_bytes_max),
                ("grpc.so_reuseport", 0),
                ("grpc.max_concurrent_streams", config.streams_per_connection_max),
                # The door (grpc/door.py) holds a connection until its HTTP/2 preface and
                # SETTINGS came; over TLS, gRPC's own deadline covers the TLS handshake.
                ("grpc.server_handshake_timeout_ms", int(limits.grpc_handshake_timeout_s * 1e3)),
                # The door bounds what it relays; this backstop only covers the moments an
                # evicted relay takes to close on gRPC's side.
                ("grpc.max_allowed_incoming_connections", 2 * config.grpc_connections_max),
                ("grpc.max_connection_idle_ms", int(limits.grpc_connection_idle_s * 1e3)),
            ],
        )
        self.authorizer = authorizer
        self.instance = os.urandom(16)  # this start's id: GetDataPath and WELCOME carry it
        self.data_path: DataPathServer | None = None
        self.workers: WorkerSupervisor | None = None
        self._data_listeners: tuple[list, str] = ([], "")
        self.servicer = DlfsServicer(store, self.data_path_info, authorizer)
        _add_servicer(self.servicer, self.server)
        self.cluster_member: ClusterMember | None = None  # with --etcd, once started
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.address = ""
        self.door: GrpcDoor | None = None
        self._upstream_dir = ""  # where gRPC's Unix socket is, behind the door

    def start(self) -> str:
        """Bind `config.listen` (port 0 picks one), start serving, return HOST:PORT."""
        listen = self.store.config.listen
        host, _, port = listen.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--listen {listen!r} must be HOST:PORT (PORT 0 picks a free port)")
        config = self.store.config
        bound = self._bind_door(host, int(port))
        exposed = not _is_loopback(host) and not (config.tls_cert and config.tokens_file)
        if exposed:
            missing = " and ".join(x for x, on in (("TLS (--tls-cert, --tls-key)", config.tls_cert),
                                                  ("--tokens-file", config.tokens_file)) if not on)
            if not config.insecure:
                self._stop_front_door()
                raise ValueError(
                    f"--listen {listen} can be reached from other hosts, but the daemon has no "
                    f"{missing}: anyone who reaches it could read"
                    f"{'' if config.tokens_file else ', ingest and delete datasets'}. Configure "
                    "them, listen on 127.0.0.1, or pass --insecure to accept that (a trusted, "
                    "job-private network)")
            log.warning("listening on %s without %s (--insecure): anyone who can reach this "
                        "address can read%s", listen, missing,
                        "" if config.tokens_file else ", ingest and delete datasets")
        if config.metrics_listen:
            metrics_host, _, metrics_port = config.metrics_listen.rpartition(":")
            # A port alone: loopback, unless told otherwise.
            self.servicer.metrics_address = self.store.metrics.serve(
                f"{metrics_host or '127.0.0.1'}:{metrics_port}")
        if config.data_port >= 0 and not config.tls_cert:
            unix_socket = _unix_socket(config.data_socket, bound)
            if config.datapath_workers:
                try:
                    self._start_workers(host, unix_socket)
                except BaseException:
                    self._stop_front_door()
                    self._stop_data_path()
                    raise
            else:
                self.data_path = DataPathServer(
                    self.store, tcp_host=host, tcp_port=config.data_port,
                    unix_socket=unix_socket, authorizer=self.authorizer,
                    instance=self.instance, connections_max=config.datapath_connections_max,
                    connections_per_peer_max=config.datapath_connections_per_peer_max,
                    idle_timeout_s=config.datapath_idle_timeout_s,
                    stall_timeout_s=config.datapath_stall_timeout_s,
                    buffer_bytes_max=config.datapath_buffer_bytes_max)
                self.data_path.start()
        self.server.start()
        self.door.start()
        self.address = f"{host}:{bound}"
        if config.etcd:
            self._join_cluster()
        for service in ("", SERVICE_NAME):
            self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        return self.address

    def _bind_door(self, host: str, port: int) -> int:
        """Serve gRPC on a Unix socket in a private directory and bind its door on
        `host`:`port` (grpc/door.py); the port bound.  Raises RuntimeError saying why
        the address cannot be bound."""
        config = self.store.config
        self._upstream_dir = tempfile.mkdtemp(prefix="dlfs-grpc-")  # 0700: ours alone
        upstream = os.path.join(self._upstream_dir, "grpc.sock")
        # gRPC's C core reports a failed bind on stderr in its own format before
        # Python hears of it; that line is held back and the failure said once, here.
        with logs.held_stderr() as held:
            try:
                if config.tls_cert:
                    added = self.server.add_secure_port(f"unix:{upstream}",
                                                        _server_credentials(config))
                else:
                    added = self.server.add_insecure_port(f"unix:{upstream}")
            except RuntimeError:
                added = 0
            if added == 0:
                held.drop_grpc_lines = True
        if added == 0:
            self._stop_front_door()
            raise RuntimeError(f"cannot serve gRPC on its Unix socket {upstream}: "
                               f"{held.text.strip() or 'gRPC did not say why'}")
        metrics = self.store.metrics
        admission = DoorAdmission(
            connections_max=config.grpc_connections_max,
            per_peer_max=min(config.grpc_connections_max, peer_share(
                config.grpc_connections_max, config.grpc_connections_per_peer_max)),
            handshakes_max=limits.grpc_handshakes_max,
            handshakes_per_peer_max=limits.grpc_handshakes_per_peer_max)
        self.door = GrpcDoor(host, port, upstream, admission=admission,
                             tls=bool(config.tls_cert),
                             send_timeout_s=config.stream_stall_timeout_s,
                             refused=lambda reason: metrics.grpc_refused.labels(reason).inc())
        for state in admission.counts():
            metrics.grpc_connections.labels(state).set_function(
                lambda state=state: admission.counts()[state])
        try:
            return self.door.bind()
        except OSError as exc:
            self._stop_front_door()
            raise RuntimeError(f"cannot listen on {host}:{port}: {_bind_failure(exc)}") \
                from None

    def _stop_front_door(self) -> None:
        """Stop gRPC at once, then its door (what is relayed breaks), and free its socket."""
        self.server.stop(None)
        if self.door is not None:
            self.door.stop()
        if self._upstream_dir:
            shutil.rmtree(self._upstream_dir, ignore_errors=True)
            self._upstream_dir = ""

    def _start_workers(self, host: str, unix_socket: str) -> None:
        """Bind the data path's sockets here and start its worker processes on them.

        Each worker gets an even share of the connection limit (there are no
        more workers than connections) and of the window buffers and read
        budget; the main process keeps one window, for the connections its
        workers hand over (ingests), which it serves in `self.data_path`.
        """
        config = self.store.config
        count = min(config.datapath_workers, config.datapath_connections_max)
        listeners, port = bind_listeners(host, config.data_port, unix_socket)
        self._data_listeners = (listeners, unix_socket)
        self.data_path = DataPathServer(
            self.store, tcp_host=None, tcp_port=0, unix_socket="", authorizer=self.authorizer,
            instance=self.instance, connections_max=config.datapath_connections_max,
            idle_timeout_s=config.datapath_idle_timeout_s,
            stall_timeout_s=config.datapath_stall_timeout_s, buffer_bytes_max=config.chunk_bytes)
        connections = worker_shares(config.datapath_connections_max, count)
        # Given, a peer's share is split too (each worker at least one); else each
        # worker takes `config.peer_share` of its own connections.
        per_peer = [max(1, n) if config.datapath_connections_per_peer_max else 0
                    for n in worker_shares(config.datapath_connections_per_peer_max, count)]
        chunk = config.chunk_bytes
        common = dict(
            data_dir=os.path.abspath(config.data_dir), chunk_bytes=chunk,
            batch_ids_max=config.batch_ids_max, batch_bytes_max=config.batch_bytes_max,
            reader_threads=max(limits.reader_threads_default_min, config.reader_threads // count),
            inflight_bytes_max=max(chunk, config.inflight_bytes_max // count),
            open_extents_max=config.open_extents_max,
            coalesce_gap_bytes=config.coalesce_gap_bytes, verify=config.verify,
            io_uring=config.io_uring, sendfile=config.sendfile,
            mapped_sends=config.mapped_sends,
            warm_on_first_read=config.warm_on_first_read,
            buffer_bytes_max=max(chunk, (config.datapath_buffer_bytes_max - chunk) // count),
            handshakes_max=max(1, limits.datapath_handshakes_max // count),
            handshakes_per_peer_max=max(1, limits.datapath_handshakes_per_peer_max // count),
            processes=count, daemon_connections_max=config.datapath_connections_max,
            daemon_per_peer_max=min(config.datapath_connections_max, peer_share(
                config.datapath_connections_max, config.datapath_connections_per_peer_max)),
            idle_timeout_s=config.datapath_idle_timeout_s,
            stall_timeout_s=config.datapath_stall_timeout_s, instance=self.instance.hex(),
            tokens=self.authorizer.tokens() if self.authorizer is not None else None,
            log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()),
            log_format=self.log_format)
        self.workers = WorkerSupervisor(
            self.store, listeners, port=port, unix_socket=unix_socket, count=count,
            settings=lambda slot: WorkerSettings(connections_max=connections[slot],
                                                 connections_per_peer_max=per_peer[slot],
                                                 **common),
            adopt=self.data_path.adopt)
        self.store.attach_mirror(self.workers)
        self.store.metrics.registry.register(self.workers)
        self.workers.start()
        log.info("data path: %d worker processes on port %d and %s; cached samples sent from "
                 "mapped extents: %s", count, port, unix_socket or "no Unix socket",
                 self.store.reads.mapped_sends_state)
        if self.store.reads.maps is not None and native.unbuilt(mapped_sends.native):
            log.warning("the daemon's C send is not built for this Python: whole replies from "
                        "mapped extents go out from Python, which costs the workers about 3x "
                        "the user time per reply; %s", native.BUILD_HINT)

    def _stop_data_path(self) -> None:
        """Stop the workers (their connections break), then close the listeners (a
        connection that arrived meanwhile is reset), then the connections the main
        process serves."""
        if self.workers is not None:
            self.workers.stop()
        listeners, unix_socket = self._data_listeners
        close_listeners(listeners, unix_socket)
        self._data_listeners = ([], "")
        if self.data_path is not None:
            self.data_path.stop()

    def _join_cluster(self) -> None:
        """Register with etcd and follow it (`ClusterMember`); a daemon that cannot
        join stops: RuntimeError says why."""
        member = ClusterMember(self.store, self.store.config.advertise or
                               _reachable(self.address), self.data_path_info().port,
                               self.store.config)
        try:
            member.join()
        except DlfsError as exc:
            member.leave()
            self._stop_front_door()
            self._stop_data_path()
            raise RuntimeError(f"cannot join the cluster in etcd: {exc.message}") from None
        self.cluster_member = member
        self.servicer.cluster_member = member

    def data_path_info(self) -> DataPathInfo:
        """What GetDataPath answers: where the data path listens, or why there is none."""
        config = self.store.config
        if self.data_path is None:
            reason = ("the daemon serves TLS; reads go through gRPC" if config.tls_cert
                      else "the daemon was started with --data-port -1")
            return DataPathInfo(False, reason, frames.VERSION, 0, "", self.instance)
        if self.workers is not None:
            return DataPathInfo(True, "", frames.VERSION, self.workers.port,
                                self.workers.unix_socket, self.instance)
        return DataPathInfo(True, "", frames.VERSION, self.data_path.port,
                            self.data_path.unix_socket, self.instance)

    def stop(self, grace_s: float = 5.0) -> None:
        """Refuse new calls, let running ones finish for `grace_s`, then close the store."""
        self.health.enter_graceful_shutdown()
        if self.cluster_member is not None:  # leave the member list first: readers move on
            self.cluster_member.leave()
        self._stop_data_path()
        self.server.stop(grace_s).wait()
        self._stop_front_door()
        self.guard.close()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.store.close()


class _HandlerCapture:
    """Stands in for a server to capture the generated method-handler table."""

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        self.handlers = handlers


# Replies of these methods are encoded by dlfs.formats.grpc_chunks and pass through as bytes.
_PRE_ENCODED_REPLIES = ("GetBatch", "GetSmallBatch", "ReadRange")


def _add_servicer(servicer: DlfsServicer, server: grpc.Server) -> None:
    """Register the generated handlers: malformed requests reach the interceptor (as
    INVALID_ARGUMENT), and the read RPCs send pre-encoded replies."""
    capture = _HandlerCapture()
    dlfs_pb2_grpc.add_DlfsServicer_to_server(servicer, capture)
    handlers = {name: handler._replace(request_deserializer=tolerant(handler.request_deserializer))
                for name, handler in capture.handlers.items()}
    for name in _PRE_ENCODED_REPLIES:
        handlers[name] = handlers[name]._replace(response_serializer=None)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def _server_credentials(config) -> grpc.ServerCredentials:
    with open(config.tls_cert, "rb") as f:
        cert = f.read()
    with open(config.tls_key, "rb") as f:
        key = f.read()
    client_ca = None
    if config.tls_client_ca:
        with open(config.tls_client_ca, "rb") as f:
            client_ca = f.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca,
                                       require_client_auth=client_ca is not None)


def _unix_socket(setting: str, grpc_port: int) -> str:
    """The data path's Unix socket: the --data-socket setting, "" for none."""
    if setting == "none":
        return ""
    return setting or f"@dlfs-{grpc_port}"


def _bind_failure(exc: OSError) -> str:
    """Why binding the --listen address failed, in words."""
    if exc.errno == errno.EADDRINUSE:
        return ("the address is in use (another dlfs-server?); stop that process or choose "
                "another --listen port")
    if exc.errno == errno.EADDRNOTAVAIL:
        return "no interface of this host has that address"
    if exc.errno == errno.EACCES:
        return "permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE)"
    return f"{exc.strerror or exc}"


def _reachable(address: str) -> str:
    """`address` as others reach it: a wildcard host (0.0.0.0, [::]) becomes this
    machine's name (--advertise names another)."""
    host, _, port = address.rpartition(":")
    if host in ("0.0.0.0", "::", "[::]", ""):
        return f"{socket.getfqdn()}:{port}"
    return address


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"
