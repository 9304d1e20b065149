"""Daemon settings: one dataclass, defaults from `dlfs.limits`.

`dlfs-server --help` lists every field with its default (`server_cli.py` builds
the command line from `SETTINGS_HELP`); `config_file.py` reads them from a
TOML file (`--config`) and prints them (`--print-config`).
"""

from __future__ import annotations

import dataclasses
import os

from dlfs import limits


def long_call_slots(rpc_threads: int) -> int:
    """RPC threads long calls may hold: all but those kept for quick calls (at least 1)."""
    return max(1, rpc_threads - min(limits.rpc_threads_reserved, rpc_threads // 2))


def default_datapath_workers() -> int:
    """One data path worker per CPU this process may run on (its affinity mask, which
    a cgroup cpuset or `taskset` narrows), at most `limits.datapath_workers_max`."""
    return min(limits.datapath_workers_max, len(os.sched_getaffinity(0)))


def peer_share(total: int, setting: int = 0) -> int:
    """How many of `total` (data or gRPC connections, window buffers) one peer may hold:
    `setting` when given, else `limits.datapath_peer_share` of them (at least 1)."""
    return setting or max(1, int(total * limits.datapath_peer_share))


def default_reader_threads(cpus: int | None = None) -> int:
    """One reader thread per CPU (`os.cpu_count()` unless `cpus` is given), within
    `limits.reader_threads_default_min`..`_max`."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    return max(limits.reader_threads_default_min, min(limits.reader_threads_default_max, cpus))


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    data_dir: str
    listen: str = "127.0.0.1:7010"
    batch_ids_max: int = limits.batch_ids_max_default
    batch_bytes_max: int = limits.batch_bytes_max_default
    chunk_bytes: int = limits.chunk_bytes_default
    message_bytes_max: int = limits.message_bytes_max
    reader_threads: int = dataclasses.field(default_factory=lambda: default_reader_threads())
    rpc_threads: int = limits.rpc_threads_default
    rpcs_concurrent_max: int = limits.rpcs_concurrent_max_default
    streams_per_connection_max: int = limits.streams_per_connection_max_default
    grpc_connections_max: int = limits.grpc_connections_max_default
    # gRPC connections one client host may hold; 0: limits.datapath_peer_share of the above.
    grpc_connections_per_peer_max: int = 0
    streams_per_client_max: int = limits.streams_per_client_max_default
    stream_stall_timeout_s: float = limits.stream_stall_timeout_s_default
    inflight_bytes_max: int = limits.inflight_bytes_max_default
    ingests_concurrent_max: int = limits.ingests_concurrent_max_default
    space_files_max: int = limits.space_files_max_default
    space_drafts_max: int = limits.space_drafts_max_default
    resumable_ingest_timeout_s: float = limits.resumable_ingest_timeout_s_default
    ingest_checkpoint_bytes: int = limits.ingest_checkpoint_bytes
    ingest_checkpoint_interval_s: float = limits.ingest_checkpoint_interval_s
    extent_bytes_max: int = limits.extent_bytes_max_default
    open_extents_max: int = limits.open_extents_max_default
    coalesce_gap_bytes: int = limits.coalesce_gap_bytes_default
    # "request": verify CRC32C unless the call opts out; "always"; "never".
    verify: str = "request"
    salvage_catalog: bool = False
    catalog_compact_dead_bytes_min: int = limits.catalog_compact_dead_bytes_min
    # [HOST:]PORT for the Prometheus /metrics endpoint (a PORT alone: on
    # 127.0.0.1); empty: not served.
    metrics_listen: str = ""
    # Serve on an address other hosts can reach without TLS and tokens.
    insecure: bool = False
    # TLS: server certificate chain and key (PEM); with tls_client_ca, clients
    # must present a certificate signed by that CA (mutual TLS).
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    # Tokens file (see dlfs.server.auth); empty: no authentication.
    tokens_file: str = ""
    # The data path (dlfs/proto/datapath.md): TCP port on the --listen host
    # (0 picks one, -1 turns the data path off), and the Unix socket for
    # clients on this host: a path, "@name" (abstract namespace), "none", or
    # "" for "@dlfs-PORT" with the gRPC port.  Off when TLS is configured.
    data_port: int = 0
    data_socket: str = ""
    datapath_connections_max: int = limits.datapath_connections_max_default
    # Served data connections one peer (a client host over TCP, a client process
    # on the Unix socket) may hold; 0: limits.datapath_peer_share of the above.
    datapath_connections_per_peer_max: int = 0
    datapath_idle_timeout_s: float = limits.datapath_idle_timeout_s_default
    datapath_stall_timeout_s: float = limits.datapath_stall_timeout_s_default
    datapath_buffer_bytes_max: int = limits.datapath_buffer_bytes_max_default
    # Processes serving the data path (datapath/workers.py); 0: the main
    # process's threads serve it (the pure-Python reference).
    datapath_workers: int = dataclasses.field(default_factory=default_datapath_workers)
    # Dataset warm-ups (warmup.py): the share of the daemon's memory they may
    # fill (0: none), and whether the first read of a dataset starts one.
    warm_memory_share: float = limits.warm_memory_share_default
    warm_on_first_read: bool = True
    # Read a window's cached pieces with one io_uring submission (dlfs/server/read/uring.py)
    # rather than one preadv each; off, or where the kernel refuses io_uring,
    # the preadv path.
    io_uring: bool = True
    # Send data path windows of large cached pieces with sendfile straight
    # from the page cache (server/read/sendfiles.py) instead of reading them into
    # a window buffer first.
    sendfile: bool = True
    # Send data path windows of small samples whose pages the page cache holds
    # (of any size, to a client on this host over TCP) from read-only mappings of
    # their extents, one copy per byte
    # (server/read/mapped_sends.py), instead of reading them into a buffer first.
    mapped_sends: bool = True
    # The cluster (docs/cluster.md): etcd's client URLs ("" : a daemon on its
    # own, no etcd), the cluster's name there, the gRPC HOST:PORT other
    # daemons and clients reach this one at ("" : the bound address), and its
    # lease's TTL (a daemon killed leaves the member list this long after).
    etcd: str = ""
    cluster: str = "default"
    advertise: str = ""
    member_lease_ttl_s: int = limits.member_lease_ttl_s_default

    def __post_init__(self):
        checks = [
            (1 <= self.batch_ids_max, "batch_ids_max must be at least 1"),
            (1 <= self.batch_bytes_max, "batch_bytes_max must be at least 1"),
            (4096 <= self.chunk_bytes <= self.message_bytes_max - limits.MiB,
             "chunk_bytes must be in 4096 .. message_bytes_max - 1 MiB"),
            (1 <= self.reader_threads <= limits.reader_threads_max,
             f"reader_threads must be in 1..{limits.reader_threads_max}"),
            (1 <= self.rpc_threads, "rpc_threads must be at least 1"),
            (self.rpc_threads <= self.rpcs_concurrent_max,
             "rpcs_concurrent_max must be at least rpc_threads"),
            (1 <= self.ingests_concurrent_max, "ingests_concurrent_max must be at least 1"),
            (1 <= self.space_files_max <= 2 * limits.space_files_max_default,
             f"space_files_max must be in 1..{2 * limits.space_files_max_default} (each file "
             "version is mapped by every data path worker)"),
            (1 <= self.space_drafts_max, "space_drafts_max must be at least 1"),
            (0 < self.resumable_ingest_timeout_s, "resumable_ingest_timeout_s must be positive"),
            (0 < self.ingest_checkpoint_bytes and 0 < self.ingest_checkpoint_interval_s,
             "the ingest checkpoint bytes and interval must be positive"),
            (1 <= self.streams_per_connection_max, "streams_per_connection_max must be at least 1"),
            (1 <= self.grpc_connections_max, "grpc_connections_max must be at least 1"),
            (0 <= self.grpc_connections_per_peer_max <= self.grpc_connections_max,
             "grpc_connections_per_peer_max must be in 0..grpc_connections_max "
             "(0: a share of it)"),
            (1 <= self.streams_per_client_max, "streams_per_client_max must be at least 1"),
            (0 < self.stream_stall_timeout_s, "stream_stall_timeout_s must be positive"),
            (not self.etcd or (0 < len(self.cluster) <= 64 and "/" not in self.cluster),
             "cluster must be a name of 1..64 characters without '/'"),
            (limits.member_lease_ttl_s_min <= self.member_lease_ttl_s,
             f"member_lease_ttl_s must be at least {limits.member_lease_ttl_s_min} (etcd's "
             "shortest lease)"),
            (self.chunk_bytes <= self.inflight_bytes_max,
             "inflight_bytes_max must be at least chunk_bytes"),
            (8192 <= self.extent_bytes_max <= limits.sample_bytes_max,
             "extent_bytes_max must be in 8 KiB .. sample_bytes_max"),
            (1 <= self.open_extents_max, "open_extents_max must be at least 1"),
            (0 <= self.catalog_compact_dead_bytes_min,
             "catalog_compact_dead_bytes_min must be at least 0"),
            (0 <= self.coalesce_gap_bytes <= limits.range_bytes_max,
             "coalesce_gap_bytes must be in 0..range_bytes_max"),
            (self.verify in ("request", "always", "never"),
             "verify must be request, always or never"),
            (bool(self.tls_cert) == bool(self.tls_key), "give --tls-cert and --tls-key together"),
            (not self.tls_client_ca or self.tls_cert, "--tls-client-ca needs --tls-cert"),
            (-1 <= self.data_port <= 65535, "data_port must be -1 (off), 0 (any) or a port"),
            (1 <= self.datapath_connections_max, "datapath_connections_max must be at least 1"),
            (0 <= self.datapath_connections_per_peer_max <= self.datapath_connections_max,
             "datapath_connections_per_peer_max must be in 0..datapath_connections_max "
             "(0: a share of them)"),
            (0 < self.datapath_idle_timeout_s and 0 < self.datapath_stall_timeout_s,
             "the data path timeouts must be positive"),
            (self.chunk_bytes <= self.datapath_buffer_bytes_max,
             "datapath_buffer_bytes_max must be at least chunk_bytes"),
            (0 <= self.datapath_workers <= limits.datapath_workers_max,
             f"datapath_workers must be in 0..{limits.datapath_workers_max}"),
            (0 <= self.warm_memory_share <= limits.warm_memory_share_max,
             f"warm_memory_share must be in 0..{limits.warm_memory_share_max} (0: no warm-ups)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


# Help text for each tunable field, shown by `dlfs-server --help`.
SETTINGS_HELP = {
    "batch_ids_max": "most samples one get_batch may ask for",
    "batch_bytes_max": "most bytes one get_batch may return",
    "chunk_bytes": "payload bytes per streamed reply message",
    "message_bytes_max": "gRPC send/receive message size limit",
    "reader_threads": "reader threads copying what the device read; unless given, one per "
                      f"CPU, {limits.reader_threads_default_min} to "
                      f"{limits.reader_threads_default_max}",
    "rpc_threads": "threads serving RPCs",
    "rpcs_concurrent_max": "RPCs admitted at once; more get RESOURCE_EXHAUSTED",
    "ingests_concurrent_max": "ingest streams admitted at once",
    "space_files_max": "files kept in all checkpoint spaces; a new file over it is refused "
                       "(remove old checkpoints)",
    "space_drafts_max": "files being written into checkpoint spaces at once",
    "member_lease_ttl_s": "with --etcd: seconds the member's lease lives without a keepalive "
                          "(a killed daemon leaves the member list this long after)",
    "resumable_ingest_timeout_s": "a resumable ingest that broke off is kept this long for a "
                                  "resume, then discarded",
    "ingest_checkpoint_bytes": "a resumable ingest makes what it received durable (a "
                               "checkpoint) after this many bytes",
    "ingest_checkpoint_interval_s": "... and at least this often (seconds) while it receives",
    "streams_per_connection_max": "concurrent calls one client connection may open",
    "grpc_connections_max": "gRPC connections held past their HTTP/2 handshake at once; at "
                            "it, a new one takes the place of the oldest that made no call, "
                            "else it is refused",
    "grpc_connections_per_peer_max": "gRPC connections one client host may hold; 0: "
                                     f"{limits.datapath_peer_share:g} of "
                                     "--grpc-connections-max",
    "streams_per_client_max": "streamed reads and ingests one client host may run at once",
    "stream_stall_timeout_s": "a streamed read or ingest idle this long is cancelled",
    "inflight_bytes_max": "bytes of reads the daemon holds at once; more reads wait",
    "extent_bytes_max": "size at which a new extent file is started",
    "open_extents_max": "extent file descriptors kept open (LRU)",
    "catalog_compact_dead_bytes_min": "compact the catalog at start once records of deleted "
                                      "datasets exceed the live ones and this many bytes",
    "coalesce_gap_bytes": "merge reads of samples at most this many bytes apart",
    "data_port": "TCP port of the data path on the --listen host (0: any free one, -1: off)",
    "datapath_connections_max": "data path connections served at once; more are refused",
    "datapath_connections_per_peer_max": "data path connections one client host (TCP) or "
                                         "process (Unix socket) may hold; 0: "
                                         f"{limits.datapath_peer_share:g} of "
                                         "--datapath-connections-max",
    "datapath_idle_timeout_s": "a data connection idle this long is closed",
    "datapath_stall_timeout_s": "a reply the client does not read for this long is abandoned",
    "datapath_buffer_bytes_max": "bytes of data path window buffers kept for reuse (split "
                                 "among the workers, one window kept for ingests)",
    "datapath_workers": "processes serving the data path; unless given, one per CPU the "
                        "daemon may use; 0: the main process serves it on threads. "
                        "--datapath-connections-max and --datapath-buffer-bytes-max are "
                        "split among them",
    "warm_memory_share": "share of the daemon's memory dataset warm-ups may fill with page "
                         "cache (0: no warm-ups)",
}
