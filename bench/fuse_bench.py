"""`python -m bench.fuse_bench [--quick]`: the FUSE mount next to ext4, in one run.

    cd /work/main && python -m bench.fuse_bench            # ~5 minutes on 2 cores
    python -m bench.fuse_bench --quick                     # small sizes, under a minute

Builds one-file-per-sample trees on ext4 (a temporary directory under
/var/tmp, removed afterwards), ingests them into a fresh daemon, mounts it
with `dlfs-mount` and with the naive file system of `bench/naive_fuse.py`,
and measures, 1 and 4 reader threads:

- random small-file reads (Python open/read/close, as ImageFolder does) of
  4 KiB and 110 KB files, cold (``echo 3 > /proc/sys/vm/drop_caches``: the
  page cache of ext4, of the mount and of the daemon's extents all dropped)
  and warm (a second pass over the same files: a second epoch);
- sequential 1 MiB reads of large files: ext4 cold and warm; the mount with
  its page cache empty (fresh mount) but the daemon warm, and warm; the
  daemon's own get_batch bandwidth for the same file from this process;
- requests per `open()`: what the mount's process was asked (its request
  counts, logged on SIGUSR1) during one more pass of each small-file row,
  divided by the files opened;
- what each system call of a warm small-file read costs (open, the isatty
  ioctl of Python's `open()`, read, close) on ext4 and through the mount,
  and the mount's one round trip per `open()` (that ioctl, answered by
  libfuse in C) with the reader and the mount's threads on one CPU and on
  two: its floor, and what waking the other CPU adds.

Prints a markdown table: median of the timed runs with min..max, and ratios
against ext4 in the same cache state and against the naive mount.  Cold
rows need root (drop_caches); without it they are skipped.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench import processes
from dlfs import Client
from dlfs.tools.launch import MountProcess

MiB = 1024 * 1024
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PASS_ATTEMPTS = 5

FULL = dict(files_4k=20000, files_110k=5000, large_files=2, large_bytes=140 * MiB,
            pass_4k=4000, pass_110k=1500, runs=3)
QUICK = dict(files_4k=2000, files_110k=400, large_files=2, large_bytes=24 * MiB,
             pass_4k=800, pass_110k=200, runs=1)
SIZES = {"4k": 4096, "110k": 110 * 1024}


# --- processes ------------------------------------------------------------------------------

def dlfs_mount(address: str, root: str, name: str) -> MountProcess:
    return MountProcess(address, os.path.join(root, name), os.path.join(root, name + ".log"))


def naive_mount(address: str, root: str) -> MountProcess:
    return MountProcess(address, os.path.join(root, "naive"), os.path.join(root, "naive.log"),
                        module="bench.naive_fuse")


# --- data -----------------------------------------------------------------------------------

def make_tree(root: str, count: int, size: int, rng: np.random.Generator) -> list[str]:
    """`count` files of `size` bytes in 100 class directories; their relative paths."""
    paths = []
    block = rng.bytes(size + count)  # distinct contents without generating count*size bytes
    for i in range(count):
        rel = f"c{i % 100:03d}/{i:07d}.bin"
        os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(block[i % count:i % count + size])
        paths.append(rel)
    return paths


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def can_drop_caches() -> bool:
    return os.geteuid() == 0 and os.access("/proc/sys/vm/drop_caches", os.W_OK)


# --- measurements ---------------------------------------------------------------------------

def read_whole(path: str) -> int:
    with open(path, "rb") as f:
        return len(f.read())


def timed_pass(paths: list[str], threads: int) -> float:
    """Seconds to open/read/close every path, with `threads` readers."""
    started = time.perf_counter()
    if threads == 1:
        for path in paths:
            read_whole(path)
    else:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            for _ in pool.map(read_whole, paths, chunksize=16):
                pass
    return time.perf_counter() - started


def page_cache_drops() -> int:
    """How often anyone dropped the page cache since boot (/proc/vmstat)."""
    with open("/proc/vmstat") as f:
        for line in f:
            if line.startswith("drop_pagecache "):
                return int(line.split()[1])
    return 0


DISTURBED = [0]  # timed passes repeated because another process dropped the page cache


def undisturbed(measure, prepare) -> float:
    """`measure()` after `prepare()`, repeated (up to PASS_ATTEMPTS) while some
    other process drops the page cache during it: on a shared machine a
    concurrent `drop_caches` would make a warm pass cold."""
    for _ in range(PASS_ATTEMPTS):
        prepare()
        before = page_cache_drops()
        value = measure()
        if page_cache_drops() == before:
            return value
        DISTURBED[0] += 1
    raise RuntimeError(f"the page cache was dropped during {PASS_ATTEMPTS} attempts in a row; "
                       "run the benchmark when nothing else drops caches")


def small_files(base: str, rels: list[str], cold: bool, threads: int, runs: int,
                rng: random.Random) -> list[float]:
    """Files per second of `runs` passes in fresh random orders: cold passes
    after drop_caches, warm passes right after a warm-up pass (the first epoch)."""
    paths = [os.path.join(base, rel) for rel in rels]

    def prepare() -> None:
        rng.shuffle(paths)
        if cold:
            drop_caches()
        else:
            timed_pass(paths, threads)
            rng.shuffle(paths)

    return [undisturbed(lambda: len(paths) / timed_pass(paths, threads), prepare)
            for _ in range(runs)]


def syscall_costs(bases: dict[str, str], rels: list[str], mount_pid: int,
                  passes: int = 3) -> dict[str, dict[str, float]]:
    """Mean microseconds of each system call of a warm whole-file read (os.open,
    the TCGETS ioctl Python's buffered open() makes to ask isatty, os.read
    until EOF, os.close), per reader after a warm-up pass; and for the mount
    the ioctl alone with this thread and the mount's threads pinned to one
    CPU ("same CPU") and to two ("other CPU").  Affinities are restored."""
    import fcntl
    import termios

    def costs(paths: list[str]) -> dict[str, float]:
        for path in paths:
            read_whole(path)
        spent = dict.fromkeys(("open", "isatty ioctl", "read", "close"), 0.0)
        for _ in range(passes):
            for path in paths:
                t0 = time.perf_counter()
                fd = os.open(path, os.O_RDONLY)
                t1 = time.perf_counter()
                try:
                    fcntl.ioctl(fd, termios.TCGETS, bytes(64))
                except OSError:
                    pass  # ENOTTY: not a terminal, as for every file
                t2 = time.perf_counter()
                while os.read(fd, MiB):
                    pass
                t3 = time.perf_counter()
                os.close(fd)
                t4 = time.perf_counter()
                for key, value in zip(spent, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                    spent[key] += value
        return {key: value / (passes * len(paths)) * 1e6 for key, value in spent.items()}

    results = {reader: costs([os.path.join(base, rel) for rel in rels])
               for reader, base in bases.items()}
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2 and shutil.which("taskset"):
        paths = [os.path.join(bases["DLFS mount"], rel) for rel in rels]
        try:
            for label, reader_cpu in (("same CPU", cpus[0]), ("other CPU", cpus[1])):
                subprocess.run(["taskset", "-a", "-p", "-c", str(cpus[0]), str(mount_pid)],
                               check=True, stdout=subprocess.DEVNULL)
                os.sched_setaffinity(0, {reader_cpu})
                results[f"DLFS mount, {label}"] = {
                    "isatty ioctl": costs(paths)["isatty ioctl"]}
        finally:
            os.sched_setaffinity(0, cpus)
            subprocess.run(["taskset", "-a", "-p", "-c", ",".join(map(str, cpus)),
                            str(mount_pid)], check=False, stdout=subprocess.DEVNULL)
    return results


def halt_polling_note() -> str:
    """A sentence when this (virtual) machine's idle CPUs halt without polling first."""
    try:
        with open("/sys/module/haltpoll/parameters/guest_halt_poll_ns") as f:
            poll_ns = int(f.read())
    except (OSError, ValueError):
        return ""
    if poll_ns:
        return ""
    return ("Guest halt polling is off here (haltpoll guest_halt_poll_ns=0): an idle vCPU "
            "halts at once, and waking it for a thread the kernel hands a FUSE request to "
            "costs an exit to the host.")


def requests_per_open(mount: MountProcess, base: str, rels: list[str], cold: bool
                      ) -> dict[str, float]:
    """Requests the mount answered per file during one pass (after drop_caches
    if `cold`, else after a warm-up pass), by kind, the calls it made to the
    daemon ("daemon stat", "daemon read", ...) and the files it read from the
    daemon's extents itself ("extent files")."""
    paths = [os.path.join(base, rel) for rel in rels]
    if cold:
        drop_caches()
    else:
        timed_pass(paths, 1)
    before = counts_of(mount)
    timed_pass(paths, 1)
    after = counts_of(mount)
    return {kind: (after[kind] - before.get(kind, 0)) / len(paths) for kind in after
            if after[kind] != before.get(kind, 0)}


def counts_of(mount: MountProcess) -> dict[str, int]:
    counts = {**mount.request_counts(),
              **prefixed("daemon", mount.request_counts(label="daemon calls"))}
    if "extent reads:" in mount.log():  # a mount with extent reads (its host's daemon)
        counts.update(prefixed("extent", {"files": mount.request_counts(
            label="extent reads")["files"]}))
    return counts


def prefixed(prefix: str, calls: dict[str, int]) -> dict[str, int]:
    return {f"{prefix} {kind}": count for kind, count in calls.items()}


def sequential_read(path: str) -> float:
    """MB/s of reading `path` in 1 MiB reads."""
    started = time.perf_counter()
    total = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(MiB):
            total += len(chunk)
    return total / (time.perf_counter() - started) / 1e6


# --- run ------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuse_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, one run each")
    parser.add_argument("--tmp", default="/var/tmp", help="where the temporary trees live")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    cold_ok = can_drop_caches()
    root = tempfile.mkdtemp(prefix="dlfs-fuse-bench-", dir=args.tmp)
    started = time.monotonic()
    try:
        with processes.splice_pipes() as large_reads:
            small, large, per_open, syscalls = run(cfg, root, cold_ok)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(report(cfg, small, large, per_open, syscalls, cold_ok, time.monotonic() - started,
                 args.quick))
    print(f"READs of large files through the DLFS mount: {large_reads}.")
    return 0


def run(cfg: dict, root: str, cold_ok: bool) -> tuple[dict, dict, dict, dict]:
    """Measure everything; (small-file rates, large-file MB/s, requests per
    open of the DLFS mount, microseconds per system call), keyed by row."""
    rng = np.random.default_rng(1)
    pick = random.Random(2)
    src = os.path.join(root, "src")
    trees = {w: make_tree(os.path.join(src, "s" + w), cfg["files_" + w], SIZES[w], rng)
             for w in SIZES}
    os.makedirs(os.path.join(src, "large"))
    large = [f"large{i}.raw" for i in range(cfg["large_files"])]
    for name in large:
        with open(os.path.join(src, "large", name), "wb") as f:
            for _ in range(cfg["large_bytes"] // (4 * MiB)):
                f.write(rng.bytes(4 * MiB))
    caches = ["cold", "warm"] if cold_ok else ["warm"]
    small: dict[tuple, list[float]] = {}
    per_open: dict[tuple, dict[str, float]] = {}
    with processes.daemon(os.path.join(root, "daemon"), os.path.join(root, "daemon.log")) as daemon:
        with Client(daemon.address) as client:
            for name in ("s4k", "s110k", "large"):
                client.ingest(os.path.join(src, name), name, progress=False)
        with dlfs_mount(daemon.address, root, "dlfs") as dlfs, \
                naive_mount(daemon.address, root) as naive:
            readers = {"ext4": src, "DLFS mount": dlfs.mountpoint,
                       "naive FUSE": naive.mountpoint}
            for workload in SIZES:
                rels = pick.sample(trees[workload], cfg["pass_" + workload])
                for threads in (1, 4):
                    for cache in caches:
                        for reader, mountpoint in readers.items():
                            if reader == "naive FUSE" and threads > 1:
                                continue
                            runs = 1 if reader == "naive FUSE" else cfg["runs"]
                            small[(workload, reader, threads, cache)] = small_files(
                                os.path.join(mountpoint, "s" + workload), rels, cache == "cold",
                                threads, runs, pick)
                for cache in caches:
                    per_open[(workload, cache)] = requests_per_open(
                        dlfs, os.path.join(dlfs.mountpoint, "s" + workload), rels,
                        cache == "cold")
            rels = pick.sample(trees["4k"], min(cfg["pass_4k"], 2000))
            syscalls = syscall_costs(
                {"ext4": os.path.join(src, "s4k"),
                 "DLFS mount": os.path.join(dlfs.mountpoint, "s4k")}, rels,
                dlfs.process.pid)
            large_results = measure_large(cfg, root, daemon.address, src, large[0], caches,
                                          naive.mountpoint)
    return small, large_results, per_open, syscalls


def measure_large(cfg: dict, root: str, address: str, src: str, name: str, caches: list[str],
                  naive_mountpoint: str) -> dict[str, list[float]]:
    """MB/s of sequential reads of one large file, per reader and cache state."""
    ext4_path = os.path.join(src, "large", name)
    results: dict[str, list[float]] = {}
    for cache in caches:
        prepare = drop_caches if cache == "cold" else lambda: sequential_read(ext4_path)
        results["ext4 " + cache] = [undisturbed(lambda: sequential_read(ext4_path), prepare)
                                    for _ in range(cfg["runs"])]
    with Client(address) as client:
        ds = client.dataset("large")

        def get_batch() -> float:
            started = time.perf_counter()
            size = len(ds.get_batch([name])[0])
            return size / (time.perf_counter() - started) / 1e6

        # Warm-up get_batch: the daemon's page cache holds the file for each pass.
        results["get_batch"] = [undisturbed(get_batch, get_batch) for _ in range(cfg["runs"])]
        results["mount"], results["mount warm"] = [], []
        for i in range(cfg["runs"]):
            for attempt in range(PASS_ATTEMPTS):
                # A fresh mount has an empty page cache; the daemon's is warm.
                with dlfs_mount(address, root, f"dlfs-large{i}-{attempt}") as m:
                    path = os.path.join(m.mountpoint, "large", name)
                    get_batch()
                    before = page_cache_drops()
                    first, second = sequential_read(path), sequential_read(path)
                if page_cache_drops() == before:
                    break
                DISTURBED[0] += 1
            results["mount"].append(first)
            results["mount warm"].append(second)
    results["naive"] = [sequential_read(os.path.join(naive_mountpoint, "large", name))]
    return results


# --- report -------------------------------------------------------------------------------

def git_revision() -> str:
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def report(cfg: dict, small: dict, large: dict, per_open: dict, syscalls: dict,
           cold_ok: bool, elapsed_s: float, quick: bool) -> str:
    median = statistics.median

    def spread(values: list[float]) -> str:
        return f"{min(values):,.0f}..{max(values):,.0f}" if len(values) > 1 else "(1 run)"

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a and b else ""

    lines = [
        f"# FUSE mount benchmark{' (--quick: sizes too small to judge speed)' if quick else ''}",
        "",
        f"git {git_revision()} (+ working tree), {os.cpu_count()} CPUs, Linux "
        f"{platform.release()}, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}, {elapsed_s:.0f} s in all.  Trees on ext4: "
        f"{cfg['files_4k']:,} x 4 KiB, {cfg['files_110k']:,} x 110 KB, {cfg['large_files']} x "
        f"{cfg['large_bytes'] // MiB} MiB.  A pass reads {cfg['pass_4k']:,} (4 KiB) or "
        f"{cfg['pass_110k']:,} (110 KB) random files with open/read/close; median of "
        f"{cfg['runs']} timed passes (naive: 1).",
        "",
        "| workload | reader | threads | cache | median | min..max | MB/s | vs ext4 | vs naive |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for (workload, reader, threads, cache), values in small.items():
        rate = median(values)
        ext4 = median(small[(workload, "ext4", threads, cache)])
        naive = small.get((workload, "naive FUSE", 1, cache))
        versus_naive = ratio(rate, median(naive)) if naive and reader == "DLFS mount" else ""
        lines.append(
            f"| {workload} files | {reader} | {threads} | {cache} | {rate:,.0f} files/s | "
            f"{spread(values)} | {rate * SIZES[workload] / 1e6:,.0f} | {ratio(rate, ext4)} | "
            f"{versus_naive} |")
    lines += ["", "| large file, sequential 1 MiB reads | cache | median MB/s | min..max | "
              "vs ext4 | vs get_batch |", "|---|---|---:|---:|---:|---:|"]
    get_batch = median(large["get_batch"])
    rows = [("ext4", "cold", "ext4 cold", None), ("ext4", "warm", "ext4 warm", None),
            ("daemon get_batch, in-process client", "daemon warm", "get_batch", None),
            ("DLFS mount", "mount cold, daemon warm", "mount", None),
            ("DLFS mount", "warm (second read)", "mount warm", "ext4 warm"),
            ("naive FUSE", "mount cold, daemon warm", "naive", None)]
    for label, cache, key, versus in rows:
        if key not in large:
            continue
        value = median(large[key])
        lines.append(f"| {label} | {cache} | {value:,.0f} | {spread(large[key])} | "
                     f"{ratio(value, median(large[versus])) if versus else ''} | "
                     f"{ratio(value, get_batch) if key in ('mount', 'naive') else ''} |")
    lines += ["", "| DLFS mount, 1 thread | cache | requests, daemon calls and extent reads "
              "per open() (by kind) |", "|---|---|---|"]
    for (workload, cache), kinds in per_open.items():
        text = ", ".join(f"{kind} {value:.2f}" for kind, value in sorted(kinds.items()))
        lines.append(f"| {workload} files | {cache} | {text or 'none'} |")
    lines += ["", "Requests per open() count what reached the mount's Python code (extent "
              "files: files it read whole from the daemon's extents, on the daemon's host, "
              "instead of asking the daemon); Python 3.11's buffered open() also sends one "
              "ioctl (isatty) per file, which libfuse answers in C (dlfs/fuse/fs.py)."]
    if syscalls:
        kinds = ("open", "isatty ioctl", "read", "close")
        lines += ["", "| warm 4 KiB file, 1 thread, µs per call | " + " | ".join(kinds)
                  + " | sum |", "|---|" + "---:|" * (len(kinds) + 1)]
        for reader, costs in syscalls.items():
            cells = [f"{costs[k]:.1f}" if k in costs else "" for k in kinds]
            total = f"{sum(costs.values()):.1f}" if len(costs) == len(kinds) else ""
            lines.append(f"| {reader} | " + " | ".join(cells) + f" | {total} |")
        lines += ["", "The ioctl is the one round trip an open() of a cached file costs "
                  "through the mount (the kernel forwards every ioctl to a FUSE file system "
                  "and remembers no answer).  Same CPU / other CPU: this thread and the "
                  "mount's threads pinned to one CPU, or to different ones."]
        note = halt_polling_note()
        if note:
            lines.append(note)
    lines += ["", "cold: the page caches of ext4, of the mount and of the daemon's extent "
              "files are dropped before each timed pass; warm: a second pass over the same "
              "files (the second epoch).  The mount keeps names and attributes of files the "
              "kernel forgot (idle inodes), so a cold pass needs one read per file, for its "
              "bytes: from the daemon's extents on its host (this run), else one RPC."]
    from bench.report import fresh_memory, proactive_reclaim

    if proactive_reclaim():
        lines.append(proactive_reclaim())
    memory_note = fresh_memory()
    if memory_note:
        lines.append(memory_note)
    if DISTURBED[0]:
        lines.append(f"{DISTURBED[0]} timed passes were repeated because another process "
                     "dropped the page cache while they ran (/proc/vmstat drop_pagecache).")
    if not cold_ok:
        lines.append("Cold rows skipped: dropping the page cache needs root.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
