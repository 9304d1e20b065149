"""Value types shared by daemon, client and FUSE layer (plain data, no grpc)."""

from __future__ import annotations

import dataclasses
import stat as stat_module


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """A dataset's summary.  `sealed` is False while its ingest is running."""

    name: str
    samples: int
    bytes: int
    sealed: bool
    created_ns: int
    extents: int
    # Striped datasets (docs/cluster.md): member daemons in placement order,
    # copies of each sample, and which member answered.  () for one daemon.
    members: tuple = ()
    replicas: int = 0
    member_index: int = 0
    # The sealed version described: never reused, new with every replace
    # (0 while an ingest runs).  Reads may name it to refuse a newer one.
    generation: int = 0
    # Striped datasets listed by a cluster client: how the members that
    # answered disagree about it, and what to do ("" when they agree).
    disagreement: str = ""
    # Unsealed: "receiving", "prepared" or "parked" (a resumable ingest that
    # broke off); "" when sealed.
    ingest_state: str = ""
    # "dataset" (sealed, read-only), or "space": a checkpoint space, whose files
    # programs write; `samples` counts its files then, `generation` is its id.
    kind: str = "dataset"

    @property
    def striped(self) -> bool:
        return bool(self.members)


@dataclasses.dataclass(frozen=True)
class DataWorkerStatus:
    """One process serving a daemon's data path (`dlfs status` shows each)."""

    index: int  # its slot, 0..workers-1
    pid: int  # 0 while none runs in the slot
    state: str  # "serving", or "starting" (started, or waiting to be started again)
    connections: int  # data connections it serves now
    requests: int  # requests it answered since it started
    bytes_served: int  # payload bytes it sent since it started
    cpu_s: float  # its CPU seconds (user + system) since it started
    restarts: int  # times a worker in this slot died and another was started


@dataclasses.dataclass(frozen=True)
class DaemonStatus:
    """A daemon's health and counters (the Status RPC, `dlfs status`, /metrics)."""

    uptime_s: float
    data_dir: str
    datasets: int
    samples: int
    bytes: int
    catalog_bytes: int
    ingests_running: int
    rpcs_in_flight: int
    samples_served: int
    bytes_served: int
    batches_served: int
    cache_hit_ranges: int
    cache_miss_ranges: int
    errors: dict  # calls that failed, by status code name
    data_connections: int = 0  # connections open on the data path
    sendfile: str = ""  # "on", or "off" and why (server/read/sendfiles.py)
    sendfile_bytes: int = 0  # payload bytes sent from the page cache by sendfile
    # The processes serving the data path; () when the main process serves it.
    data_workers: tuple = ()
    mapped_sends: str = ""  # "on", or "off" and why (server/read/mapped_sends.py)
    mapped_send_bytes: int = 0  # payload bytes sent from mappings of cached extents
    disk_bytes: int = 0  # the data dir's file system: its size,
    disk_free_bytes: int = 0  # and what a writer may still use there
    space_files: int = 0  # files of the checkpoint spaces
    space_bytes: int = 0  # and their bytes
    space_files_max: int = 0  # what the spaces may hold (--space-files-max)
    # Filled in by whoever knows them: the daemon's gRPC layer, the client.
    version: str = ""
    metrics_address: str = ""  # HOST:PORT of /metrics, "" when not served
    address: str = ""  # the daemon as the client reached it


@dataclasses.dataclass(frozen=True)
class Entry:
    """A file (sample) or directory of a dataset."""

    name: str  # last path component ("" for the dataset root)
    path: str  # full path inside the dataset
    is_dir: bool
    size: int  # directories: 0
    mode: int  # st_mode, kept from the ingest source for files
    mtime_ns: int
    id: int  # sample id; -1 for directories
    crc32c: int
    children: int  # directories: number of direct children; files: 0
    # Files of a checkpoint space: the file version to read (the one-sample
    # version "SPACE@VERSION", dlfs.paths.file_version_name); 0 otherwise, and
    # for a file being written that has no closed version yet.
    version: int = 0

    @property
    def permissions(self) -> str:
        return stat_module.filemode(self.mode)


@dataclasses.dataclass(frozen=True)
class WarmInfo:
    """A dataset warm-up on one daemon (see the Warm RPC in dlfs.proto)."""

    address: str  # the daemon
    dataset: str
    generation: int
    state: str  # none, queued, warming, warm, partial, stopped, failed
    bytes_total: int  # bytes of the dataset stored on that daemon
    bytes_warmed: int
    budget_bytes: int
    fits: bool
    message: str = ""
    # Of bytes_total, in the daemon's page cache when asked (what was warmed may have
    # been evicted since).
    bytes_resident: int = 0

    @property
    def done(self) -> bool:
        """No longer queued or running."""
        return self.state not in ("queued", "warming")
