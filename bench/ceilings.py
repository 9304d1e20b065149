"""The limits DLFS is measured against, each timing itself: the device and the transports.

| key               | what it is                                                      |
| ---               | ---                                                             |
| fio               | the device: fio random reads, io_uring, queue depth 64 (cold)   |
| raw-tcp           | loopback TCP: a child `sendall`s one reused buffer of the mean  |
|                   | batch size, this process `recv_into`s a preallocated one (warm) |
| raw-unix-sendfile | a Unix socket: a child `os.sendfile`s each sample's range of    |
|                   | the extent files, batch by batch, into `recv_into` (warm)       |
| raw-tcp-mapped    | loopback TCP from the page cache: a child `sendmsg`s each       |
|                   | batch's ranges from mappings of the extent files (warm)         |

Each reports MB/s, samples/s (bandwidth / mean sample size for fio and
raw-tcp; the samples sent for raw-unix-sendfile and raw-tcp-mapped) and CPU: for the raw
ceilings the sender child's CPU is the "daemon" figure and this process's
the "client" one, measured as for every row (`bench.measure.CpuMeter`).
The raw senders stream without waiting for requests; the latency columns
are the time to receive one batch's bytes of that stream.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench.contenders import Contender
from bench.datagen import Prepared, batch_sequence
from bench.measure import CpuMeter, Measurement, RunResult, check_samples
from dlfs.formats.disk_layout import HEADER_BYTES
from dlfs.sockio import recv_exactly

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# How long a sender child may take to start and connect, and to exit after the receiver closed.
SENDER_START_TIMEOUT_S = 30.0
SENDER_EXIT_TIMEOUT_S = 10.0


# --- fio: the device's limit ------------------------------------------------------------------

class Fio(Contender):
    """fio random reads over the workload's DLFS extent files (O_DIRECT, so always cold).

    Block size: the mean sample size rounded up to 4 KiB (4 KiB for the 4 KB
    workload; 1 MiB for the large files).  samples/s = read bandwidth / mean
    sample size, which equals IOPS for the 4 KB workload.  Latency columns
    are fio's per-I/O completion latency, not a batch's.  Client CPU is
    fio's own (its usr_cpu + sys_cpu over the run); io_uring's kernel
    workers are not in it.
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

    def measure_self(self, measurement: Measurement, runs: int, budget_s: float) -> bool:
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
        job = result["jobs"][0]
        read = job["read"]
        seconds = read["runtime"] / 1e3
        mean = self.prepared.workload.mean_sample_bytes
        cpu_s = (job.get("usr_cpu", 0.0) + job.get("sys_cpu", 0.0)) / 100 * seconds
        measurement.runs.append(RunResult(int(read["bw_bytes"] * seconds / mean),
                                          int(read["bw_bytes"] * seconds), seconds, [],
                                          client_cpu_s=cpu_s))
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


# --- the transports' limits ---------------------------------------------------------------------

class _RawStream(Contender):
    """A sender child streams batches into this process's socket; timed like a row.

    Subclasses start the child and return the connected socket
    (`_start_sender`) and say how many bytes each batch of the stream
    has (`_batch_bytes`, cycled).  One warm-up run, then `runs` timed runs of
    `budget_s`, each reading whole batches into one preallocated buffer
    until the budget is spent.
    """

    caches = ("warm",)

    def open(self, prepared: Prepared, cache: str) -> None:
        super().open(prepared, cache)
        self._sender: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._position = 0  # batches of the stream received so far

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the sender's next send fails: it exits
            self._sock = None
        if self._sender is not None:
            try:
                self._sender.wait(SENDER_EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._sender.kill()
                self._sender.wait()
            self._sender = None

    def server_pids(self) -> list[int]:
        return [self._sender.pid]

    def _start_sender(self) -> tuple[subprocess.Popen, socket.socket]:
        raise NotImplementedError

    def _batch_bytes(self) -> list[int]:
        raise NotImplementedError

    def _check_first(self, view: memoryview) -> None:
        """Check the stream's first batch (in `view`) before anything is timed."""

    def measure_self(self, measurement: Measurement, runs: int, budget_s: float) -> bool:
        self._sender, self._sock = self._start_sender()
        sizes = self._batch_bytes()
        self._view = memoryview(np.empty(max(sizes), dtype=np.uint8))
        self._sizes = sizes
        self._receive_run(0.0)  # one batch
        self._check_first(self._view[:sizes[0]])
        self._receive_run(budget_s)  # warm-up
        for _ in range(runs):
            with CpuMeter(self.server_pids()) as cpu:
                run = self._receive_run(budget_s)
            measurement.runs.append(cpu.record(run))
        measurement.note = self.note()
        return True

    def _receive_run(self, budget_s: float) -> RunResult:
        """Whole batches of the stream until `budget_s` is spent (at least one)."""
        sock, view, sizes = self._sock, self._view, self._sizes
        batch_samples = self.prepared.workload.batch_size
        latencies: list[float] = []
        nbytes = 0
        clock = time.perf_counter
        started = clock()
        stop_at = started + budget_s
        while True:
            want = sizes[self._position % len(sizes)]
            t0 = clock()
            recv_exactly(sock, view[:want])
            t1 = clock()
            self._position += 1
            latencies.append(t1 - t0)
            nbytes += want
            if t1 >= stop_at:
                break
        return RunResult(len(latencies) * batch_samples, nbytes, clock() - started, latencies)


def _sender_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "bench.rawsend", *args]


class RawTcp(_RawStream):
    """Loopback TCP: `sendall` of one reused buffer of the mean batch size, `recv_into`."""

    key = "raw-tcp"
    label = "loopback TCP limit: sendall of a reused buffer into recv_into"

    def note(self) -> str:
        batch = self._batch_bytes()[0]
        return (f"{batch / 1e6:.1f} MB per sendall (mean batch); samples/s = bandwidth / mean "
                "sample size; daemon CPU = the sender's")

    def _batch_bytes(self) -> list[int]:
        workload = self.prepared.workload
        return [int(round(workload.mean_sample_bytes * workload.batch_size))]

    def _start_sender(self) -> tuple[subprocess.Popen, socket.socket]:
        return tcp_sender(lambda port: ("tcp", "127.0.0.1", str(port),
                                         str(self._batch_bytes()[0])))


def tcp_sender(args, start_timeout_s: float = SENDER_START_TIMEOUT_S
               ) -> tuple[subprocess.Popen, socket.socket]:
    """A sender child (`python -m bench.rawsend`) started with `args(port)` that connects
    to a loopback listener here within `start_timeout_s`, and the connection it made
    (blocking).  The child is killed if it does not connect."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(start_timeout_s)
        port = listener.getsockname()[1]
        sender = subprocess.Popen(_sender_command(*args(port)), cwd=REPO)
        try:
            sock, _ = listener.accept()
        except BaseException:
            sender.kill()
            sender.wait()
            raise
    sock.settimeout(None)  # blocking, as fast as receiving gets (EOF ends a dead sender's)
    return sender, sock


class _PlannedStream(_RawStream):
    """A sender child streams the samples' real places in the extent files
    (`sample_locations`), in the order of the workload's batch sequence, so the page
    cache pages it reads are the ones the DLFS rows read; the first batch is checked
    sample by sample against the generated CRC32C."""

    def open(self, prepared: Prepared, cache: str) -> None:
        super().open(prepared, cache)
        self._batches = batch_sequence(prepared.workload)
        self._tmp = tempfile.TemporaryDirectory(prefix="bench-plan-")

    def close(self) -> None:
        super().close()
        self._tmp.cleanup()

    def data_files(self) -> list[str]:
        return self.prepared.extent_files()

    def _batch_bytes(self) -> list[int]:
        sizes = self.prepared.sizes
        return [int(sizes[b].sum()) for b in self._batches]

    def _plan(self) -> tuple[str, list[str]]:
        """(the plan file of the batch sequence, the extent files: `write_plan`)."""
        plan_path = os.path.join(self._tmp.name, "plan.i64")
        return plan_path, write_plan(self.prepared, self._batches, plan_path)

    def _check_first(self, view: memoryview) -> None:
        ids = self._batches[0]
        ends = np.cumsum(self.prepared.sizes[ids]).tolist()
        samples = [view[start:end] for start, end in zip([0] + ends[:-1], ends)]
        check_samples(samples, ids, self.prepared.crcs)


class RawUnixSendfile(_PlannedStream):
    """A Unix socket: `os.sendfile` of each sample's range of the extent files, `recv_into`."""

    key = "raw-unix-sendfile"
    label = "Unix socket limit: os.sendfile of each sample's extent range into recv_into"

    def note(self) -> str:
        return "one sendfile per sample, the batch sequence's ranges; daemon CPU = the sender's"

    def _start_sender(self) -> tuple[subprocess.Popen, socket.socket]:
        plan_path, files = self._plan()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with theirs:
            sender = subprocess.Popen(
                _sender_command("unix-sendfile", str(theirs.fileno()), plan_path, *files),
                cwd=REPO, pass_fds=[theirs.fileno()])
        return sender, ours  # blocking: the sender's exit is an EOF here


class RawTcpMapped(_PlannedStream):
    """Loopback TCP from the page cache: one `sendmsg` per batch whose iovecs point into
    read-only mappings of the extent files (what the daemon does for cached small
    samples and for a client on this host), `recv_into`.  The bound of a data path
    that copies each byte once in the sender and once in the receiver, with no
    requests, planning or checks around the copies."""

    key = "raw-tcp-mapped"
    label = "loopback TCP limit from the page cache: sendmsg of each batch's ranges in the extent mappings into recv_into"

    def note(self) -> str:
        return ("one sendmsg per batch from the mappings, the batch sequence's ranges; "
                "daemon CPU = the sender's")

    def _start_sender(self) -> tuple[subprocess.Popen, socket.socket]:
        plan_path, files = self._plan()
        batch = str(self.prepared.workload.batch_size)
        return tcp_sender(lambda port: ("tcp-mapped", "127.0.0.1", str(port), batch,
                                         plan_path, *files))


def write_plan(prepared: Prepared, batches: list[np.ndarray], path: str) -> list[str]:
    """Write to `path` what a planned sender (`bench.rawsend` unix-sendfile, tcp-mapped)
    streams: int64 triples (file index, offset, length), one per sample of `batches`
    in order.  Returns the extent files the indexes name."""
    files, file_index, offsets = sample_locations(prepared)
    ids = np.concatenate(batches)
    plan = np.stack([file_index[ids], offsets[ids], prepared.sizes[ids]], axis=1)
    plan.astype("<i8").tofile(path)
    return files


def sample_locations(prepared: Prepared) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The extent files, and each sample's file index and offset in them (int64, per id).

    `datagen` writes the samples in id order through the daemon's `Store`,
    which packs them back to back after each extent's header
    (`dlfs.formats.disk_layout.HEADER_BYTES`) and starts a new extent when one is full;
    so walking the sizes in id order over the files' sizes gives every
    place.  Raises RuntimeError when the files do not add up that way.
    Cost: one stat per extent file and a Python loop over the samples.
    """
    files = prepared.extent_files()
    sizes = prepared.sizes.tolist()
    file_index = np.empty(len(sizes), dtype=np.int64)
    offsets = np.empty(len(sizes), dtype=np.int64)
    i = 0
    for k, path in enumerate(files):
        end = os.path.getsize(path)
        at = HEADER_BYTES
        while i < len(sizes) and at + sizes[i] <= end:
            file_index[i], offsets[i] = k, at
            at += sizes[i]
            i += 1
        if at != end:
            raise RuntimeError(f"{path}: {end} bytes, but its samples end at {at}: the extent "
                               "layout is not what bench.ceilings.sample_locations expects")
    if i != len(sizes):
        raise RuntimeError(f"the extent files of {prepared.dataset} hold {i} of "
                           f"{len(sizes)} samples")
    return files, file_index, offsets
