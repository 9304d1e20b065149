"""One class per contender: a way of reading a batch of samples by id.

Every contender gets the same `Prepared` workload and the same batch
sequence.  Lifecycle per workload: `open(prepared, cache)`, then
`run(...)` once for the warm-up and once per timed run, then `close()`.
`read_batch(ids)` returns the samples (bytes-like) in request order.
The self-timed limits (fio, raw TCP, raw Unix sendfile) are in `ceilings`; `lineup` lists
every row in table order.

| key                | what it is                                                      |
| ---                | ---                                                             |
| ext4-1             | one file per sample, `open(path, "rb", buffering=0).read()`, 1 thread |
| ext4-8             | same, a batch split into 8 contiguous shares on a pool of 8 threads |
| lmdb               | one key per sample, `txn.get` in one read txn per batch, 1 thread |
| lmdb-random        | same with readahead off (MADV_RANDOM)                           |
| dlfs-grpc-1        | `Dataset.get_batch(ids)` over loopback gRPC (`data_path=False`) |
| dlfs-grpc-4        | same, 4 threads each with one batch in flight                   |
| dlfs-grpc-prefetch | 1 in flight plus `Dataset.prefetch` of the next batch           |
| dlfs-tcp-1         | `get_batch` over the data path, loopback TCP (`data_path="tcp"`) |
| dlfs-tcp-4         | same, 4 threads each with one batch in flight                   |
| dlfs-tcp-prefetch  | same as dlfs-grpc-prefetch over the data path, loopback TCP     |
| dlfs-tcp-out-1     | `get_batch(ids, out=buffer)` into one buffer allocated at open, TCP |
| dlfs-unix-1        | `get_batch` over the data path, Unix socket (`data_path="unix"`) |
| dlfs-fuse          | files under the `dlfs-mount` mount point, read like ext4-1      |
| dlfs-direct        | `Client(addr, direct=True)`: co-located, reads extents in-process |
"""

from __future__ import annotations

import mmap
import os
import socket
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bench.datagen import Prepared
from bench.measure import CacheControl, Measurement, RunResult, run_in_flight, run_sequential


class Contender:
    key = ""
    label = ""
    caches = ("cold", "warm")

    def __init__(self, env: "BenchEnv"):
        self.env = env
        self.prepared: Prepared | None = None
        self.cache = "warm"

    def availability(self) -> str:
        """"" when this contender can run here, else "not available: why"."""
        return ""

    def note(self) -> str:
        """A remark for the table row (how it reads, deviations)."""
        return ""

    def open(self, prepared: Prepared, cache: str) -> None:
        self.prepared = prepared
        self.cache = cache

    def close(self) -> None:
        pass

    def data_files(self) -> list[str]:
        """Files whose pages this contender reads (evicted for cold runs without root)."""
        return []

    def server_pids(self) -> list[int]:
        """Processes whose CPU is this row's "daemon" figure (none: it uses no daemon)."""
        return []

    def helper_pids(self) -> list[int]:
        """Processes working for this one on the client side (their CPU counts as client)."""
        return []

    def evict(self, cache_control: CacheControl) -> None:
        """Empty the page cache of this contender's data before a cold run."""
        cache_control.make_cold(self.data_files())

    def read_batch(self, ids: np.ndarray) -> list:
        raise NotImplementedError

    def run(self, batches: list[np.ndarray], expected_bytes: list[int], budget_s: float
            ) -> RunResult:
        return run_sequential(self.read_batch, batches, expected_bytes, budget_s)

    def check_transport(self) -> dict:
        """After the warm-up: raise if the reads did not take the path this row names.

        Returns figures for the row (JSON only).
        """
        return {}

    def measure_self(self, measurement: Measurement, runs: int, budget_s: float) -> bool:
        """Contenders that time themselves (the ceilings) fill `measurement` and return True.

        `runs` timed runs of `budget_s` each, after their own warm-up.
        """
        return False


class BenchEnv:
    """What contenders share in one benchmark run."""

    def __init__(self, *, daemon_address: str, daemon_pid: int, o_direct_cold: bool,
                 fio_runtime_s: float, fuse_mountpoint: str | None, fuse_reason: str,
                 fuse_pid: int = 0):
        self.daemon_address = daemon_address
        self.daemon_pid = daemon_pid
        self.fuse_pid = fuse_pid
        self.o_direct_cold = o_direct_cold
        self.fio_runtime_s = fio_runtime_s
        self.fuse_mountpoint = fuse_mountpoint
        self.fuse_reason = fuse_reason


# --- ext4, one file per sample -----------------------------------------------------------

def _read_file(path: str) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return f.read()


def _read_file_direct(path: str) -> memoryview:
    """O_DIRECT read into a page-aligned buffer (cold runs without root)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        size = os.fstat(fd).st_size
        buffer = mmap.mmap(-1, max(4096, -(-size // 4096) * 4096))
        got = 0
        while got < size:
            n = os.preadv(fd, [memoryview(buffer)[got:]], got)
            if n == 0:
                break
            got += n
        return memoryview(buffer)[:size]
    finally:
        os.close(fd)


class Ext4Files(Contender):
    """One file per sample, plain Python open/read; `threads` > 1 splits the batch."""

    def __init__(self, env: BenchEnv, threads: int):
        super().__init__(env)
        self.threads = threads
        self.key = f"ext4-{threads}"
        self.label = (f"ext4 one-file-per-sample, {threads} thread" + ("s" if threads > 1 else ""))
        self._pool: ThreadPoolExecutor | None = None
        self._reader = _read_file

    def note(self) -> str:
        if self.cache == "cold" and self.env.o_direct_cold:
            return "O_DIRECT (not root: page cache could not be dropped)"
        return ""

    def open(self, prepared: Prepared, cache: str) -> None:
        super().open(prepared, cache)
        self._paths = [prepared.file_path(i) for i in range(len(prepared.paths))]
        self._reader = _read_file_direct if cache == "cold" and self.env.o_direct_cold \
            else _read_file
        if self.threads > 1:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self.key)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def data_files(self) -> list[str]:
        return self._paths

    def _read_share(self, ids: list[int]) -> list:
        paths, reader = self._paths, self._reader
        return [reader(paths[i]) for i in ids]

    def read_batch(self, ids: np.ndarray) -> list:
        id_list = ids.tolist()
        if self._pool is None:
            return self._read_share(id_list)
        shares = min(self.threads, len(id_list))
        bounds = [len(id_list) * k // shares for k in range(shares + 1)]
        futures = [self._pool.submit(self._read_share, id_list[lo:hi])
                   for lo, hi in zip(bounds, bounds[1:])]
        out: list = []
        for future in futures:
            out.extend(future.result())
        return out


# --- LMDB ---------------------------------------------------------------------------------

class Lmdb(Contender):
    """One key per sample; `txn.get` (a copy out of the map) in one read txn per batch.

    `readahead=True` is lmdb's default: each page fault reads about 128 KB
    around it, so a database that fits in RAM warms up during a cold run.
    `readahead=False` (MADV_RANDOM) is lmdb's advice for random reads of a
    database larger than RAM: one 4 KiB fault at a time, queue depth 1.
    """

    def __init__(self, env: BenchEnv, readahead: bool = True):
        super().__init__(env)
        self.readahead = readahead
        self.key = "lmdb" if readahead else "lmdb-random"
        self.label = "LMDB, one key per sample, 1 thread" + (
            "" if readahead else ", readahead off")

    def note(self) -> str:
        return ("lmdb defaults (readahead on)" if self.readahead
                else "MADV_RANDOM: lmdb's setting for random reads larger than RAM")

    def open(self, prepared: Prepared, cache: str) -> None:
        super().open(prepared, cache)
        self._open_env()
        self._keys = [b"%08d" % i for i in range(len(prepared.paths))]

    def _open_env(self) -> None:
        import lmdb

        self._env = lmdb.open(self.prepared.lmdb_dir, readonly=True, lock=False,
                              readahead=self.readahead, subdir=True)

    def close(self) -> None:
        self._env.close()

    def evict(self, cache_control: CacheControl) -> None:
        # drop_caches leaves pages that are mapped alone: unmap the database first.
        self._env.close()
        super().evict(cache_control)
        self._open_env()

    def data_files(self) -> list[str]:
        return self.prepared.lmdb_files()

    def read_batch(self, ids: np.ndarray) -> list:
        keys = self._keys
        with self._env.begin(buffers=False) as txn:
            get = txn.get
            return [get(keys[i]) for i in ids.tolist()]


# --- DLFS get_batch through the daemon ------------------------------------------------------

# How a row reaches the daemon: (words for its label, Client's data_path option).
TRANSPORTS = {
    "grpc": ("over loopback gRPC", False),
    "tcp": ("over the data path, loopback TCP", "tcp"),
    "unix": ("over the data path, Unix socket", "unix"),
}


class _DlfsClient(Contender):
    """Reads a dataset with `dlfs.Client(address, **client_options)`."""

    client_options: dict = {}

    def open(self, prepared: Prepared, cache: str) -> None:
        from dlfs import Client

        super().open(prepared, cache)
        self._client = Client(self.env.daemon_address, **self.client_options)
        self._dataset = self._client.dataset(prepared.dataset)

    def close(self) -> None:
        self._client.close()

    def data_files(self) -> list[str]:
        return self.prepared.extent_files()

    def server_pids(self) -> list[int]:
        return [self.env.daemon_pid]

    def read_batch(self, ids: np.ndarray) -> list:
        return self._dataset.get_batch(ids)


class DlfsGetBatch(_DlfsClient):
    """`Dataset.get_batch` through the daemon over `transport` (a `TRANSPORTS` key).

    `in_flight` threads pipeline batches, each with one batch in flight.
    `check_transport` makes sure the reads took the path the key names: a
    client whose data path cannot be reached falls back to gRPC silently.
    """

    def __init__(self, env: BenchEnv, transport: str, in_flight: int):
        super().__init__(env)
        self.transport = transport
        self.in_flight = in_flight
        words, option = TRANSPORTS[transport]
        self.client_options = {"data_path": option}
        self.key = f"dlfs-{transport}-{in_flight}"
        self.label = (f"DLFS get_batch {words}, {in_flight} batch"
                      + ("es" if in_flight > 1 else "") + " in flight")

    def check_transport(self) -> dict:
        """The client's data path endpoint and the daemon's data connections; raises if wrong.

        Called after the warm-up.  A data path row must have connected over
        the socket family its key names, and the daemon must count at least
        one data connection; a gRPC row's client has no data path at all.
        """
        connections = self._client.status().data_connections
        data_path = getattr(self._client.transport, "data_path", None)
        data = data_path() if data_path else None
        if self.transport == "grpc":
            if data is not None:
                raise RuntimeError(f"{self.key}: the client has a data path; "
                                   "expected gRPC reads (data_path=False)")
            return {"data_connections": connections}
        family = socket.AF_UNIX if self.transport == "unix" else socket.AF_INET
        if data is None or not data.ever_connected or data.endpoint.family != family:
            where = "no data path" if data is None else f"data path endpoint {data.endpoint.label}"
            raise RuntimeError(f"{self.key}: reads did not take the data path over "
                               f"{self.transport} ({where}): they fell back to gRPC?")
        if connections < 1:
            raise RuntimeError(f"{self.key}: the daemon counts no data connection")
        return {"data_connections": connections, "data_endpoint": data.endpoint.label}

    def run(self, batches, expected_bytes, budget_s) -> RunResult:
        if self.in_flight == 1:
            return run_sequential(self.read_batch, batches, expected_bytes, budget_s)
        return run_in_flight(self.read_batch, batches, expected_bytes, budget_s, self.in_flight)


class DlfsPrefetch(DlfsGetBatch):
    """One batch in flight plus a `Dataset.prefetch` hint for the next one.

    What a training loop that knows its sampler order does (and what
    `dlfs.training.pipeline` does): before waiting for batch i it tells the daemon
    about batch i+1, so the daemon's reads of the next batch overlap this
    one's transfer.  The hint is a quick unary gRPC call on every transport
    (also timed, in the batch's latency).
    """

    def __init__(self, env: BenchEnv, transport: str):
        super().__init__(env, transport, 1)
        self.key = f"dlfs-{transport}-prefetch"
        self.label = (f"DLFS get_batch {TRANSPORTS[transport][0]}, 1 in flight + "
                      "prefetch hint of the next")

    def availability(self) -> str:
        from dlfs.client.dataset import Dataset

        return "" if hasattr(Dataset, "prefetch") else "not available: no Dataset.prefetch"

    def run(self, batches, expected_bytes, budget_s) -> RunResult:
        position = {"next": 0}
        dataset = self._dataset

        def read_with_hint(ids: np.ndarray) -> list:
            i = position["next"]
            position["next"] = i + 1
            if i + 1 < len(batches):
                dataset.prefetch(batches[i + 1])
            return dataset.get_batch(ids)

        return run_sequential(read_with_hint, batches, expected_bytes, budget_s)


class DlfsOut(DlfsGetBatch):
    """One batch in flight, received with `get_batch(ids, out=buffer)` into one buffer.

    The buffer (numpy uint8) is allocated once at open, as large as the
    largest possible batch (batch size x largest sample); every batch lands
    in it back to back, so the client allocates nothing per batch.
    """

    def __init__(self, env: BenchEnv, transport: str):
        super().__init__(env, transport, 1)
        self.key = f"dlfs-{transport}-out-1"
        self.label = (f"DLFS get_batch(out=) into one reused buffer "
                      f"{TRANSPORTS[transport][0]}, 1 batch in flight")

    def open(self, prepared: Prepared, cache: str) -> None:
        super().open(prepared, cache)
        workload = prepared.workload
        self._out = np.empty(workload.batch_size * workload.size_max_bytes, dtype=np.uint8)

    def close(self) -> None:
        super().close()
        self._out = None

    def read_batch(self, ids: np.ndarray) -> list:
        return self._dataset.get_batch(ids, out=self._out)


# --- DLFS through FUSE ---------------------------------------------------------------------

class DlfsFuse(Contender):
    key = "dlfs-fuse"
    label = "DLFS through the FUSE mount, 1 thread"

    def availability(self) -> str:
        return self.env.fuse_reason

    def open(self, prepared: Prepared, cache: str) -> None:
        super().open(prepared, cache)
        mountpoint = self.env.fuse_mountpoint
        base = os.path.join(mountpoint, prepared.dataset)
        if not os.path.exists(os.path.join(base, prepared.paths[0])):
            raise RuntimeError(f"{prepared.paths[0]!r} is not under {base} on the FUSE mount")
        self._paths = [os.path.join(base, p) for p in prepared.paths]

    def data_files(self) -> list[str]:
        return self.prepared.extent_files()

    def server_pids(self) -> list[int]:
        return [self.env.daemon_pid]

    def helper_pids(self) -> list[int]:
        return [self.env.fuse_pid] if self.env.fuse_pid else []

    def note(self) -> str:
        return "client CPU includes the dlfs-mount process"

    def read_batch(self, ids: np.ndarray) -> list:
        paths = self._paths
        return [_read_file(paths[i]) for i in ids.tolist()]


# --- DLFS co-located direct reads -----------------------------------------------------------

class DlfsDirect(_DlfsClient):
    """`Client(address, direct=True)`: a client on the daemon's host reads the extents itself.

    It fetches the dataset's index once over gRPC and maps the extent files;
    samples are views of the page cache, no sample bytes cross gRPC.
    """

    key = "dlfs-direct"
    label = "DLFS co-located direct reads (Client(direct=True)), 1 batch in flight"

    def availability(self) -> str:
        import inspect

        from dlfs import Client

        if "direct" not in inspect.signature(Client).parameters:
            return "not available: this dlfs has no Client(direct=True)"
        return ""

    client_options = {"direct": True}

    def evict(self, cache_control: CacheControl) -> None:
        # drop_caches leaves mapped pages alone, and this client maps the
        # extents: unmap them (a new client) around the drop.
        self.close()
        super().evict(cache_control)
        self.open(self.prepared, self.cache)
