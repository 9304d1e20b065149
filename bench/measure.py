"""Timing: one warm-up, several timed runs, min/median/max, batch latency percentiles.

A *run* reads the workload's seeded batch sequence from the start, one
batch after another (or several in flight, for contenders that pipeline),
until the sequence ends or the run's time budget is spent; slow contenders
therefore read a prefix of the same sequence.  Throughput of a run is
samples (and bytes) delivered divided by its wall time; latency is the
wall time of each batch call, pooled over the timed runs.  CPU of a run
(`CpuMeter`): the daemon's utime + stime from /proc/PID/stat and this
process's getrusage, read before and after it.

Cold runs start from an empty page cache: as root, `sync` then
`echo 3 > /proc/sys/vm/drop_caches` before every timed run (this drops the
daemon's extent pages and cached inodes and dentries too).  Without root,
the data files of the contender get `posix_fadvise(DONTNEED)` and the ext4
contenders read with O_DIRECT (inodes stay cached then; the table says so).
Neither drops pages a process maps: `CacheControl.make_cold` evicts again until
the files left the cache (the daemon and a co-located mount let go of theirs
about a second after their last read) and fails the run if they do not.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import statistics
import subprocess
import time
from typing import Callable, Iterable

import numpy as np

from dlfs import limits
from dlfs.server.read import residency

# make_cold checks that at most this many files left the page cache (a tree of
# one file per sample is hundreds of thousands: opening each would take longer
# than the run; nothing maps those).
_CHECKED_FILES_MAX = 256
# Pages of a file allowed to stay cached after an eviction (a trace, see _still_cached).
_TRACE_PAGES_MAX = 64
_TRACE_SHARE_MAX = 0.001
# How long make_cold waits for mapped pages to leave after evicting (and after the
# release hooks): two of the daemon's (or a mount's) idle times, and a margin.
_UNMAPPED_WITHIN_S = 2 * max(limits.extent_map_idle_s,
                             limits.mount_extent_pages_release_s_default) + 5


@dataclasses.dataclass
class RunResult:
    """What one timed run delivered."""

    samples: int
    bytes: int
    elapsed_s: float
    batch_latencies_s: list[float]
    # CPU seconds spent during the run (see `CpuMeter`); None where not measured.
    server_cpu_s: float | None = None  # the daemon (or a ceiling's sender process)
    client_cpu_s: float | None = None  # the benchmark process, all its threads

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclasses.dataclass
class Measurement:
    """One contender on one workload in one cache state."""

    contender: str
    workload: str
    cache: str  # "cold" | "warm"
    available: bool = True
    note: str = ""
    runs: list[RunResult] = dataclasses.field(default_factory=list)
    # Set by contenders that measure themselves (fio): overrides the runs' figures.
    latency_kind: str = "batch"  # "batch" | "io" (fio: per-I/O completion latency)
    extra: dict = dataclasses.field(default_factory=dict)

    def _per_run(self, attr: str) -> list[float]:
        return [getattr(r, attr) for r in self.runs]

    def summary(self) -> dict:
        """Figures for the report (None where not available)."""
        if not self.available or not self.runs:
            return {"samples_per_s": None, "mb_per_s": None, "p50_ms": None, "p99_ms": None,
                    **cpu_per_gb([])}
        sps, mbs = self._per_run("samples_per_s"), self._per_run("mb_per_s")
        latencies = [x for r in self.runs for x in r.batch_latencies_s]
        out = {
            "samples_per_s": statistics.median(sps),
            "samples_per_s_min": min(sps),
            "samples_per_s_max": max(sps),
            "mb_per_s": statistics.median(mbs),
            "mb_per_s_min": min(mbs),
            "mb_per_s_max": max(mbs),
            "p50_ms": None,
            "p99_ms": None,
            "batches": len(latencies),
            "samples": sum(r.samples for r in self.runs),
            "runs": len(self.runs),
        }
        if latencies:
            out["p50_ms"] = float(np.percentile(latencies, 50)) * 1e3
            out["p99_ms"] = float(np.percentile(latencies, 99)) * 1e3
        out.update(cpu_per_gb(self.runs))
        out.update(self.extra)
        return out


def run_sequential(read_batch: Callable[[np.ndarray], list], batches: list[np.ndarray],
                   expected_bytes: list[int], budget_s: float) -> RunResult:
    """Read `batches` in order, one call each, until done or `budget_s` is spent.

    Every returned batch is checked for its total byte count (cheap; the
    CRC32C check runs in the warm-up, see `check_samples`).
    """
    latencies: list[float] = []
    samples = nbytes = 0
    clock = time.perf_counter
    started = clock()
    stop_at = started + budget_s
    for batch, want in zip(batches, expected_bytes):
        t0 = clock()
        out = read_batch(batch)
        t1 = clock()
        got = _total(out)
        if got != want or len(out) != len(batch):
            raise AssertionError(f"batch returned {len(out)} samples, {got} bytes; "
                                 f"expected {len(batch)} samples, {want} bytes")
        latencies.append(t1 - t0)
        samples += len(out)
        nbytes += got
        if t1 >= stop_at:
            break
    return RunResult(samples, nbytes, clock() - started, latencies)


def run_in_flight(read_batch: Callable[[np.ndarray], list], batches: list[np.ndarray],
                  expected_bytes: list[int], budget_s: float, in_flight: int) -> RunResult:
    """Like `run_sequential` with `in_flight` threads each issuing the next batch."""
    import threading

    lock = threading.Lock()
    position = [0]
    latencies: list[float] = []
    totals = [0, 0]
    errors: list[BaseException] = []
    clock = time.perf_counter
    started = clock()
    stop_at = started + budget_s

    def worker() -> None:
        try:
            while True:
                with lock:
                    i = position[0]
                    if i >= len(batches) or clock() >= stop_at or errors:
                        return
                    position[0] += 1
                t0 = clock()
                out = read_batch(batches[i])
                t1 = clock()
                got = _total(out)
                if got != expected_bytes[i] or len(out) != len(batches[i]):
                    raise AssertionError(f"batch {i} returned {got} bytes, expected "
                                         f"{expected_bytes[i]}")
                with lock:
                    latencies.append(t1 - t0)
                    totals[0] += len(out)
                    totals[1] += got
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)

    threads = [threading.Thread(target=worker, name=f"bench-inflight-{k}")
               for k in range(in_flight)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return RunResult(totals[0], totals[1], clock() - started, latencies)


def _total(samples: Iterable) -> int:
    return sum(len(s) for s in samples)


def check_samples(out: list, ids: np.ndarray, crcs: np.ndarray) -> None:
    """Assert every returned sample has its generated CRC32C (run once, in the warm-up)."""
    from dlfs.crc import crc32c

    for sample, sample_id in zip(out, ids.tolist()):
        value = crc32c(sample)
        if value != int(crcs[sample_id]):
            raise AssertionError(f"sample {sample_id}: CRC32C {value:08x}, generated "
                                 f"{int(crcs[sample_id]):08x}")


# --- CPU time ----------------------------------------------------------------------

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """utime + stime of process `pid` (all its threads, live and exited), in seconds.

    From /proc/PID/stat, in clock ticks (10 ms on most kernels): one read,
    no syscall into the process.  Raises OSError when the process is gone.
    """
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    # The command name (field 2) may hold spaces: the fields after it start at ") ".
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S  # fields 14, 15


def process_tree_cpu_s(pid: int) -> float:
    """CPU seconds of process `pid` and every process below it: the daemon and its data
    path workers (`process_tree_cpu_times`, user and system together).  Raises
    OSError when `pid` is gone."""
    return sum(process_tree_cpu_times(pid))


def process_tree_cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process `pid` and every process below it.  Its own
    utime and stime plus cutime and cstime (children that ended and were reaped, e.g. a
    worker that died) plus each live descendant's utime and stime.  User time is what
    the processes' own code costs (the interpreter, numpy, the C extensions), system
    time what the kernel does for them (copies, TCP).  Raises OSError when `pid` is
    gone; a descendant that ends meanwhile is skipped."""
    user = system = 0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/stat") as f:
                stat = f.read()
            children = []
            for tid in os.listdir(f"/proc/{current}/task"):
                try:
                    with open(f"/proc/{current}/task/{tid}/children") as f:
                        children += [int(c) for c in f.read().split()]
                except FileNotFoundError:  # the thread ended after the listing
                    continue
        except OSError:
            if current == pid:
                raise
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        user += int(fields[11])  # field 14: utime
        system += int(fields[12])  # field 15: stime
        if current == pid:
            user += int(fields[13])  # cutime: reaped children
            system += int(fields[14])  # cstime
        pending += children
    return user / CLOCK_TICKS_PER_S, system / CLOCK_TICKS_PER_S


def softirq_threads_cpu_s() -> float:
    """CPU seconds of the kernel's softirq threads (`ksoftirqd/N`) so far, all CPUs.

    Loopback TCP's receive processing runs in the sender's system call while
    the machine has room, and is charged to the sender; on a saturated machine
    the kernel defers it to these threads, charged to no process of either
    side (bench/scaling.py reports it beside each side's figures)."""
    total = 0.0
    for pid in _softirq_thread_pids():
        try:
            total += process_cpu_s(pid)
        except OSError:
            pass
    return total


_SOFTIRQ_PIDS: list[int] = []


def _softirq_thread_pids() -> list[int]:
    """The pids of the `ksoftirqd/N` threads (found once: they live as long as the kernel)."""
    if not _SOFTIRQ_PIDS:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/comm") as f:
                        if f.read().startswith("ksoftirqd/"):
                            _SOFTIRQ_PIDS.append(int(entry))
                except OSError:
                    pass
    return _SOFTIRQ_PIDS


def self_cpu_s() -> float:
    """User + system CPU seconds of this process, all its threads (getrusage RUSAGE_SELF)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CpuMeter:
    """CPU seconds spent inside a `with` block by the server side and by this process.

    `server_pids`: the daemon, or a ceiling's sender (empty: the block does
    not use one, and `server_s` stays None), each with the processes below
    it (the daemon's data path workers).  `helper_pids`: processes that work
    for this process on the client side (a FUSE mount); their CPU is added
    to `client_s`.  Cost: a few /proc reads per process and one getrusage
    at each end, outside anything timed.
    """

    def __init__(self, server_pids: Iterable[int] = (), helper_pids: Iterable[int] = ()):
        self.server_pids = list(server_pids)
        self.helper_pids = list(helper_pids)
        self.server_s: float | None = None
        self.client_s: float | None = None

    def _snapshot(self) -> tuple[float, float]:
        server = sum(process_tree_cpu_s(pid) for pid in self.server_pids)
        client = self_cpu_s() + sum(process_tree_cpu_s(pid) for pid in self.helper_pids)
        return server, client

    def __enter__(self) -> "CpuMeter":
        self._start = self._snapshot()
        return self

    def __exit__(self, *exc) -> None:
        server, client = self._snapshot()
        self.server_s = server - self._start[0] if self.server_pids else None
        self.client_s = client - self._start[1]

    def record(self, run: RunResult) -> RunResult:
        """`run` with this block's CPU seconds filled in."""
        run.server_cpu_s, run.client_cpu_s = self.server_s, self.client_s
        return run


def cpu_per_gb(runs: list[RunResult]) -> dict:
    """CPU seconds per 1e9 payload bytes delivered, totals over `runs` (None: not measured).

    `daemon_*` is the server side (the daemon, or a ceiling's sender);
    `client_*` is the benchmark process.
    """
    nbytes = sum(r.bytes for r in runs)
    out = {}
    for side, attr in (("daemon", "server_cpu_s"), ("client", "client_cpu_s")):
        values = [getattr(r, attr) for r in runs]
        total = sum(values) if values and None not in values else None
        out[f"{side}_cpu_s"] = total
        out[f"{side}_cpu_s_per_gb"] = total / (nbytes / 1e9) if total is not None and nbytes \
            else None
    return out


# --- page cache --------------------------------------------------------------------

def is_root() -> bool:
    return os.geteuid() == 0


class CacheControl:
    """Empties or fills the page cache for a workload's files."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.root = is_root()
        self._clock = clock  # make_cold's waits (a test's own clock)
        # Called with the files that stayed cached after an eviction: each lets go of
        # the mappings it holds of them (the benchmark's FUSE mount maps extents;
        # mapped pages survive drop_caches and DONTNEED).
        self.release_hooks: list[Callable[[list[str]], None]] = []
        self.method = ("drop_caches (sync; echo 3 > /proc/sys/vm/drop_caches)" if self.root
                       else "posix_fadvise(DONTNEED) on the data files; ext4 rows use O_DIRECT")

    def make_cold(self, files: Iterable[str], mappable: Iterable[str] | None = None) -> None:
        """Evict `files` (all of the page cache as root).  Pages a process has mapped
        stay cached through both ways of evicting: a daemon unmaps the extents it
        sends small samples from within `limits.extent_map_idle_s` and a sweep of
        its last read, a co-located mount lets go of the extent pages it mapped
        `--extent-pages-release` (1 s) after its last read, and the release hooks
        let go of other mappings, so this evicts again until none of `files` is
        cached (at most `_UNMAPPED_WITHIN_S` after the hooks ran): a long-running
        mount's cold rows read cold, proven here.  `mappable`: the files checked
        (default: `files`, when at most a few hundred).  Raises RuntimeError if
        some page of them stays cached: a cold run would not be cold."""
        files = list(files)
        if mappable is None:
            mappable = files if len(files) <= _CHECKED_FILES_MAX else []
        checked = list(mappable)
        give_up = self._clock() + _UNMAPPED_WITHIN_S
        released = False
        while True:
            self._evict(files)
            left = [f for f in checked if _still_cached(f)]
            if not left:
                return
            if not released:
                for hook in self.release_hooks:
                    hook(left)
                released = True
                # The wait starts once the hooks are done: a remount takes seconds on
                # a loaded machine (7 s seen with the load average at 10), and had
                # used up the wait, so pages still on their way out (a mapping the
                # daemon unmaps within its idle time, a few hundred pages unmapped
                # and gone within a second) failed the row at once.
                give_up = self._clock() + _UNMAPPED_WITHIN_S
                continue
            if self._clock() > give_up:
                raise RuntimeError(f"{len(left)} files stayed in the page cache after "
                                   f"eviction (first: {left[0]}, mapped by "
                                   f"{_mappers(left[0]) or 'no process'})")
            time.sleep(0.1)

    def _evict(self, files: list[str]) -> None:
        if self.root:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            return
        for path in files:
            _with_fd(path, lambda fd: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED))

    @staticmethod
    def make_warm(files: Iterable[str]) -> float:
        """Read `files` through the page cache; returns seconds taken."""
        started = time.perf_counter()
        buffer = bytearray(8 << 20)
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                while os.readv(fd, [buffer]) == len(buffer):
                    pass
            finally:
                os.close(fd)
        return time.perf_counter() - started


# --- process memory ------------------------------------------------------------------

def proc_status_kib(pid: int, field: str = "VmRSS") -> int:
    """A `/proc/PID/status` field in KiB (VmRSS, VmHWM, ...); 0 if unavailable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def git_info(repo: str) -> dict:
    """HEAD commit and whether the work tree differs (never takes the index lock)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "--no-optional-locks", "-C", repo, *args],
                                  capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def _with_fd(path: str, call):
    """`call(fd)` on `path` opened read-only; None if it cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return call(fd)
    finally:
        os.close(fd)


def _still_cached(path: str) -> bool:
    """Whether more than a trace of `path` stayed in the page cache: a few pages of a
    large file stay after drop_caches now and then (19 of 260,000, mapped by no
    process), which no cold run would notice.  False for a file that is gone."""
    def more_than_a_trace(fd: int) -> bool:
        size = os.fstat(fd).st_size
        cached = residency.cached_pages(fd, 0, size) or 0
        return cached > max(_TRACE_PAGES_MAX, residency.pages_of(0, size) * _TRACE_SHARE_MAX)

    return bool(_with_fd(path, more_than_a_trace))


def _mappers(path: str) -> str:
    """The processes that map `path` ("PID COMMAND, ..."), read from /proc."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                if path not in f.read():
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        found.append(f"{pid} {command[:80]}")
    return ", ".join(found)
