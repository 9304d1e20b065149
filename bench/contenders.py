"""One class per contender: a way of reading a batch of samples by id.

Every contender gets the same `Prepared` workload and the same batch
sequence.  Lifecycle per workload: `open(prepared, cache)`, then
`run(...)` once for the warm-up and once per timed run, then `close()`.
`read_batch(ids)` returns the samples (bytes-like) in request order.

| key            | what it is                                                          |
| ---            | ---                                                                 |
| ext4-1         | one file per sample, `open(path, "rb", buffering=0).read()`, 1 thread |
| ext4-8         | same, a batch split into 8 contiguous shares on a pool of 8 threads |
| lmdb           | one key per sample, `txn.get` in one read txn per batch, 1 thread   |
| lmdb-random    | same with readahead off (MADV_RANDOM)                               |
| dlfs-grpc-1    | `Dataset.get_batch(ids)` through the daemon over loopback gRPC      |
| dlfs-grpc-4    | same, 4 threads each with one batch in flight                       |
| dlfs-grpc-prefetch | 1 in flight plus `Dataset.prefetch` of the next batch           |
| dlfs-fuse      | files under the `dlfs-mount` mount point, read like ext4-1          |
| dlfs-direct    | `Client(addr, direct=True)`: co-located, reads extents in-process   |
| fio            | the device's limit: fio random reads, io_uring, queue depth 64      |
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
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

    def evict(self, cache_control: CacheControl) -> None:
        """Empty the page cache of this contender's data before a cold run."""
        cache_control.make_cold(self.data_files())

    def read_batch(self, ids: np.ndarray) -> list:
        raise NotImplementedError

    def run(self, batches: list[np.ndarray], expected_bytes: list[int], budget_s: float
            ) -> RunResult:
        return run_sequential(self.read_batch, batches, expected_bytes, budget_s)

    def measure_self(self, measurement: Measurement) -> bool:
        """Contenders that time themselves (fio) fill `measurement` and return True."""
        return False


class BenchEnv:
    """What contenders share in one benchmark run."""

    def __init__(self, *, daemon_address: str, o_direct_cold: bool, fio_runtime_s: float,
                 fuse_mountpoint: str | None, fuse_reason: str):
        self.daemon_address = daemon_address
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


# --- DLFS over gRPC ------------------------------------------------------------------------

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

    def read_batch(self, ids: np.ndarray) -> list:
        return self._dataset.get_batch(ids)


class DlfsGrpc(_DlfsClient):
    """`Dataset.get_batch` through the daemon; `in_flight` threads pipeline batches."""

    def __init__(self, env: BenchEnv, in_flight: int):
        super().__init__(env)
        self.in_flight = in_flight
        self.key = f"dlfs-grpc-{in_flight}"
        self.label = (f"DLFS get_batch over loopback gRPC, {in_flight} batch"
                      + ("es" if in_flight > 1 else "") + " in flight")

    def run(self, batches, expected_bytes, budget_s) -> RunResult:
        if self.in_flight == 1:
            return run_sequential(self.read_batch, batches, expected_bytes, budget_s)
        return run_in_flight(self.read_batch, batches, expected_bytes, budget_s, self.in_flight)


class DlfsGrpcPrefetch(DlfsGrpc):
    """One batch in flight plus a `Dataset.prefetch` hint for the next one.

    What a training loop that knows its sampler order does: before waiting
    for batch i it tells the daemon about batch i+1, so the daemon's reads
    of the next batch overlap this one's transfer.  Latency is that of the
    get_batch call (the hint is a separate, quick unary call, also timed).
    """

    def __init__(self, env: BenchEnv):
        super().__init__(env, 1)
        self.key = "dlfs-grpc-prefetch"
        self.label = "DLFS get_batch over loopback gRPC, 1 in flight + prefetch hint of the next"

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


# --- fio: the device's limit ------------------------------------------------------------------

class Fio(Contender):
    """fio random reads over the workload's DLFS extent files (O_DIRECT, so always cold).

    Block size: the mean sample size rounded up to 4 KiB (4 KiB for the 4 KB
    workload; 1 MiB for the large files).  samples/s = read bandwidth / mean
    sample size, which equals IOPS for the 4 KB workload.  Latency columns
    are fio's per-I/O completion latency, not a batch's.
    """

    key = "fio"
    label = "device limit: fio random read, io_uring, QD 64"
    caches = ("cold",)

    def availability(self) -> str:
        return "" if shutil.which("fio") else "not available: fio not installed"

    def note(self) -> str:
        return getattr(self, "_note", "")

    def block_bytes(self) -> int:
        mean = self.prepared.workload.mean_sample_bytes
        if mean > 4 << 20:
            return 1 << 20
        return int(-(-mean // 4096) * 4096)

    def measure_self(self, measurement: Measurement) -> bool:
        block = self.block_bytes()
        files = self.prepared.extent_files()
        runtime_s = max(1, int(round(self.env.fio_runtime_s)))
        result = None
        errors = []
        for engine in ("io_uring", "libaio"):
            command = ["fio", "--name=bench", "--readonly", "--rw=randread", f"--bs={block}",
                       f"--ioengine={engine}", "--iodepth=64", "--direct=1", "--numjobs=1",
                       "--norandommap", "--time_based", f"--runtime={runtime_s}",
                       "--output-format=json", "--filename=" + ":".join(files)]
            proc = subprocess.run(command, capture_output=True, text=True)
            if proc.returncode == 0:
                try:
                    result = json.loads(proc.stdout[proc.stdout.index("{"):])
                except ValueError as exc:
                    errors.append(f"{engine}: unreadable output ({exc})")
                    continue
                self._note = f"bs={block // 1024} KiB, {engine}" + (
                    " (io_uring failed)" if engine != "io_uring" else "")
                break
            errors.append(f"{engine}: {proc.stderr.strip()[-200:]}")
        if result is None:
            measurement.available = False
            measurement.note = "fio failed: " + "; ".join(errors)
            return True
        read = result["jobs"][0]["read"]
        seconds = read["runtime"] / 1e3
        mean = self.prepared.workload.mean_sample_bytes
        measurement.runs.append(RunResult(int(read["bw_bytes"] * seconds / mean),
                                          int(read["bw_bytes"] * seconds), seconds, []))
        percentiles = read.get("clat_ns", {}).get("percentile", {})
        measurement.latency_kind = "io"
        measurement.extra = {
            "p50_ms": percentiles.get("50.000000", 0) / 1e6 or None,
            "p99_ms": percentiles.get("99.000000", 0) / 1e6 or None,
            "iops": read["iops"],
            "block_bytes": block,
        }
        measurement.note = self.note()
        return True


def all_contenders(env: BenchEnv) -> list[Contender]:
    return [Ext4Files(env, 1), Ext4Files(env, 8), Lmdb(env), Lmdb(env, readahead=False),
            DlfsGrpc(env, 1), DlfsGrpc(env, 4), DlfsGrpcPrefetch(env),
            DlfsFuse(env), DlfsDirect(env), Fio(env)]
