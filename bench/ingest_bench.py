"""Staging: `dlfs ingest` against what people do today, every baseline in the same run.

    python -m bench --workloads ingest            # only these rows (about 3 minutes)
    python -m bench --workloads ingest --quick    # tiny data, one run each

Rows (each run of a row alternates baseline and DLFS; medians of `runs`):

- **cold tree**: `dlfs ingest TREE NAME` (the CLI, as a user runs it, start-up
  and walk included; it returns once the dataset is durable) against
  `cp -r TREE DST` on the same file system, then `sync` (so both end with
  the bytes on disk); the ratio without the `sync` is reported beside it.
  TREE is the 110k workload's one-file-per-sample tree.  Cold: the page
  cache is dropped before every command (as root; else DONTNEED advice).
- **cold tar**: `dlfs ingest TREE.tar NAME` (an uncompressed tar of the same
  tree) against `tar -xf TREE.tar -C DST` + `sync`, and against the cold
  tree row's `cp -r` + `sync`.
- **latency per open**: the tree's first files (and a tree of 4 KiB files),
  served by `latencyfs` (bench/latencyfs.c: a FUSE pass-through that
  sleeps DELAY in every open, like a parallel file system's metadata round
  trip; its backing files warm), ingested with `readers=1` (one file at a
  time, what `dlfs ingest` did before) and with the default readers.  These
  two run in this process through `Client.ingest` (walk, reads, stream,
  seal), so the CLI's interpreter start-up, the same for both, does not
  dilute the ratio.

The daemon is a real `dlfs-server` on a data dir next to the sources; the
ingest's CPU is the CLI process's (RUSAGE_CHILDREN) and the daemon's
(/proc/PID/stat).  The machine's load average is recorded: on a shared VM,
other tenants slow baseline and DLFS alike, and the per-run ratios show how
much they move.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bench import latency_fs, processes
from dlfs import Client
from dlfs.staging.read_pool import READERS_DEFAULT

LATENCY_US = 1000
LATENCY_FILES = 3000
LATENCY_FILES_QUICK = 300
SMALL_FILE_BYTES = 4096
GOALS = {"tree": 1.0, "tar": 1.0, "latency": 8.0}


def run(tree: str, scratch: str, *, runs: int, quick: bool, cache, log) -> dict:
    """Every ingest row; `tree` is the 110k workload's files dir, `scratch` a
    directory on the same file system (created; the daemon's data dir lives there)."""
    os.makedirs(scratch, exist_ok=True)
    files = _tree_files(tree)
    total = sum(os.path.getsize(p) for p in files)
    tar_path = _tar_of(tree, scratch, log)
    result = {"runs": runs, "quick": quick, "cold_method": cache.method,
              "load_average_start": os.getloadavg(), "source": tree,
              "files": len(files), "bytes": total, "rows": []}
    data_dir = os.path.join(scratch, "dlfs")
    shutil.rmtree(data_dir, ignore_errors=True)
    with processes.daemon(data_dir, os.path.join(scratch, "daemon.log")) as daemon:
        runner = _Runner(daemon, scratch, cache, files + [tar_path])
        log(f"bench: ingest: cold tree ({len(files):,} files, {total / 1e9:.2f} GB) vs cp -r")
        result["rows"].append(runner.cold_tree(tree, len(files), total, runs))
        log("bench: ingest: cold tar vs tar -xf")
        result["rows"].append(runner.cold_tar(tar_path, len(files), total, runs,
                                              result["rows"][0]))
        reason = latency_fs.unavailable()
        count = LATENCY_FILES_QUICK if quick else LATENCY_FILES
        for label, backing in (("110 KB", _subset(tree, files, count, scratch)),
                               ("4 KiB", _small_tree(scratch, count))):
            log(f"bench: ingest: {label} files behind {LATENCY_US} us per open, 1 reader vs many")
            if reason:
                result["rows"].append({"row": f"latency {label}", "available": False,
                                       "note": f"not available: {reason}"})
                continue
            result["rows"].append(runner.latency(label, backing, runs))
    result["load_average_end"] = os.getloadavg()
    return result


class _Runner:
    def __init__(self, daemon, scratch: str, cache, cold_files: list[str]):
        self.daemon = daemon
        self.scratch = scratch
        self.cache = cache
        self.cold_files = cold_files
        self.dst = os.path.join(scratch, "copy")
        self.count = 0

    # --- rows -------------------------------------------------------------------------

    def cold_tree(self, tree: str, files: int, total: int, runs: int) -> dict:
        dlfs, copy, sync = [], [], []
        for _ in range(runs):
            copy_s, sync_s = self._baseline(["cp", "-r", tree, self.dst])
            copy.append(copy_s)
            sync.append(sync_s)
            dlfs.append(self._ingest(tree))
        baseline = [c + s for c, s in zip(copy, sync)]
        return _row("tree", "cold 110 KB tree: dlfs ingest vs cp -r + sync", files, total,
                    dlfs, "cp -r + sync", baseline, extra={
                        "baseline_no_sync_s": copy,
                        "ratio_no_sync": _ratio(copy, [d["wall_s"] for d in dlfs])})

    def cold_tar(self, tar_path: str, files: int, total: int, runs: int, tree_row: dict) -> dict:
        dlfs, baseline = [], []
        for _ in range(runs):
            extract_s, sync_s = self._baseline(["tar", "-xf", tar_path, "-C", self.dst],
                                               make_dst=True)
            baseline.append(extract_s + sync_s)
            dlfs.append(self._ingest(tar_path))
        cp = tree_row["baseline_s"]
        return _row("tar", "cold tar of the tree: dlfs ingest TAR vs tar -xf + sync", files,
                    total, dlfs, "tar -xf + sync", baseline, extra={
                        "tar_bytes": os.path.getsize(tar_path),
                        "ratio_to_cp": _ratio(cp, [d["wall_s"] for d in dlfs])})

    def latency(self, label: str, backing: str, runs: int) -> dict:
        files = _tree_files(backing)
        total = sum(os.path.getsize(p) for p in files)
        mountpoint = os.path.join(self.scratch, "latency-mnt")
        one, many = [], []
        with latency_fs.LatencyMount(backing, mountpoint, LATENCY_US,
                                     os.path.join(self.scratch, "build")):
            self.cache.make_warm(files)  # the delay is per open, not the disk
            self._ingest_here(mountpoint)  # warm-up: the mount's dentries and attributes
            ceiling = {"one_s": [], "many_s": []}
            for _ in range(runs):
                one.append(self._ingest_here(mountpoint, readers=1))
                many.append(self._ingest_here(mountpoint))
                ceiling["one_s"].append(_read_all(mountpoint, 1))
                ceiling["many_s"].append(_read_all(mountpoint, READERS_DEFAULT))
        row = _row("latency", f"{label} files, {LATENCY_US} us extra per open: "
                   f"{READERS_DEFAULT} readers vs 1", len(files), total, many,
                   "Client.ingest(readers=1)", [r["wall_s"] for r in one])
        row["baseline_detail"] = one
        row["read_only"] = ceiling
        row["read_only_ratio"] = _ratio(ceiling["one_s"], ceiling["many_s"])
        return row

    # --- commands ---------------------------------------------------------------------

    def _baseline(self, command: list[str], make_dst: bool = False) -> tuple[float, float]:
        """(seconds of `command`, seconds of the `sync` after it), cold; cleans up after."""
        self._clean()
        if make_dst:
            os.makedirs(self.dst)
        self.cache.make_cold(self.cold_files)
        started = time.perf_counter()
        subprocess.run(command, check=True)
        copied = time.perf_counter()
        os.sync()
        synced = time.perf_counter()
        self._clean()
        return copied - started, synced - copied

    def _ingest(self, source: str, *, cold: bool = True, readers: int | None = None) -> dict:
        self.count += 1
        name = f"bench-ingest-{self.count}"
        if cold:
            os.sync()
            self.cache.make_cold(self.cold_files)
        command = [sys.executable, "-m", "dlfs.cli", "--server", self.daemon.address, "ingest",
                   source, name, "--progress", "none"]
        if readers is not None:
            command += ["--readers", str(readers)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        daemon_before = _cpu_of(self.daemon.pid)
        started = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if proc.returncode:
            raise RuntimeError(f"dlfs ingest failed: {proc.stderr[-2000:]}")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = {"wall_s": wall,
                  "client_cpu_s": (after.ru_utime - before.ru_utime)
                  + (after.ru_stime - before.ru_stime),
                  "daemon_cpu_s": _cpu_of(self.daemon.pid) - daemon_before,
                  "summary": proc.stdout.strip().splitlines()[-2:]}
        with Client(self.daemon.address) as client:
            client.delete(name)
        return result

    def _ingest_here(self, source: str, readers: int = READERS_DEFAULT) -> dict:
        """`Client.ingest` in this process: wall and CPU seconds (this process's CPU
        includes its other threads, which are idle meanwhile)."""
        self.count += 1
        name = f"bench-ingest-{self.count}"
        before = resource.getrusage(resource.RUSAGE_SELF)
        daemon_before = _cpu_of(self.daemon.pid)
        with Client(self.daemon.address) as client:
            started = time.perf_counter()
            info = client.ingest(source, name, readers=readers, progress=False)
            wall = time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_SELF)
            daemon_cpu = _cpu_of(self.daemon.pid) - daemon_before
            client.delete(name)
        return {"wall_s": wall, "daemon_cpu_s": daemon_cpu,
                "client_cpu_s": (after.ru_utime - before.ru_utime)
                + (after.ru_stime - before.ru_stime),
                "summary": [f"{info.samples} samples, {info.bytes} bytes"]}

    def _clean(self) -> None:
        shutil.rmtree(self.dst, ignore_errors=True)


def _row(kind: str, title: str, files: int, total: int, dlfs: list[dict], baseline_label: str,
         baseline: list[float], extra: dict | None = None) -> dict:
    walls = [d["wall_s"] for d in dlfs]
    median = statistics.median(walls)
    row = {"row": kind, "title": title, "available": True, "files": files, "bytes": total,
           "dlfs_s": walls, "dlfs_median_s": median,
           "dlfs_mb_per_s": total / median / 1e6, "dlfs_files_per_s": files / median,
           "client_cpu_s": statistics.median(d["client_cpu_s"] for d in dlfs),
           "daemon_cpu_s": statistics.median(d["daemon_cpu_s"] for d in dlfs),
           "dlfs_summary": dlfs[-1]["summary"],
           "baseline": baseline_label, "baseline_s": baseline,
           "baseline_median_s": statistics.median(baseline),
           "ratio": _ratio(baseline, walls),
           "ratios_per_run": [b / d for b, d in zip(baseline, walls)],
           "goal": GOALS[kind]}
    row.update(extra or {})
    return row


def _ratio(baseline: list[float], dlfs: list[float]) -> float:
    """How many times faster DLFS is: median baseline time over median DLFS time."""
    return statistics.median(baseline) / statistics.median(dlfs)


def _read_all(root: str, threads: int) -> float:
    """Seconds to open, read and close every file under `root` with `threads` threads:
    what the source itself allows, with no ingest at all."""
    files = _tree_files(root)

    def read(path: str) -> int:
        with open(path, "rb", buffering=0) as f:
            return len(f.read())

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        sum(pool.map(read, files, chunksize=16))
    return time.perf_counter() - started


def _cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree_files(root: str) -> list[str]:
    found = []
    for directory, _, names in os.walk(root):
        found.extend(os.path.join(directory, n) for n in names)
    return sorted(found)


def _tar_of(tree: str, scratch: str, log) -> str:
    """An uncompressed tar of `tree` (members ./train/...), made once per tree."""
    key = os.path.basename(os.path.dirname(os.path.abspath(tree)))
    path = os.path.join(scratch, f"{key}.tar")
    if not os.path.exists(path):
        log(f"bench: ingest: writing {path}")
        subprocess.run(["tar", "-C", tree, "-cf", path + ".tmp", "."], check=True)
        os.rename(path + ".tmp", path)
    return path


def _subset(tree: str, files: list[str], count: int, scratch: str) -> str:
    """A tree of hard links to the first `count` files of `tree`."""
    root = os.path.join(scratch, f"latency-110k-{count}")
    if not os.path.isdir(root):
        tmp = root + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        for path in files[:count]:
            target = os.path.join(tmp, os.path.relpath(path, tree))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.link(path, target)
        os.rename(tmp, root)
    return root


def _small_tree(scratch: str, count: int) -> str:
    """`count` files of SMALL_FILE_BYTES random bytes, 100 per directory."""
    root = os.path.join(scratch, f"latency-4k-{count}")
    if not os.path.isdir(root):
        tmp = root + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        rng = np.random.default_rng(16)
        for i in range(count):
            directory = os.path.join(tmp, f"shard-{i // 100:04d}")
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, f"sample-{i:06d}.bin"), "wb") as f:
                f.write(rng.bytes(SMALL_FILE_BYTES))
        os.rename(tmp, root)
    return root


def markdown(result: dict | None) -> list[str]:
    """The "Staging" section of results.md."""
    if not result:
        return []
    lines = ["## Staging: `dlfs ingest` against cp, tar and one file at a time", ""]
    if result.get("skipped"):
        return lines + [f"Not run: {result['skipped']}.", ""]
    load = result["load_average_start"], result["load_average_end"]
    lines.append(f"Source: {result['files']:,} files, {result['bytes'] / 1e9:.2f} GB "
                 f"(`{result['source']}`); {result['runs']} run(s) per row, baseline and DLFS "
                 f"alternating; medians.  Cold: {result['cold_method']}.  Load average at "
                 f"start {load[0][0]:.1f}, at end {load[1][0]:.1f} (other tenants of the VM).")
    lines.append("")
    lines.append("| row | DLFS | baseline | × baseline (per run) | DLFS MB/s | files/s | "
                 "client CPU-s | daemon CPU-s |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in result["rows"]:
        if not row.get("available"):
            lines.append(f"| {row['row']} | — | — | — | — | — | — | — |  {row['note']}")
            continue
        per_run = ", ".join(f"{r:.2f}" for r in row["ratios_per_run"])
        lines.append(f"| {row['title']} | {row['dlfs_median_s']:.2f} s | {row['baseline']}: "
                     f"{row['baseline_median_s']:.2f} s | **{row['ratio']:.2f}x** ({per_run}) | "
                     f"{row['dlfs_mb_per_s']:,.0f} | {row['dlfs_files_per_s']:,.0f} | "
                     f"{row['client_cpu_s']:.2f} | {row['daemon_cpu_s']:.2f} |")
    lines.append("")
    for row in result["rows"]:
        if row.get("row") == "tree" and row.get("available"):
            lines.append(f"Without the `sync` after `cp -r` (bytes not yet on disk when it "
                         f"returns): {row['ratio_no_sync']:.2f}x.")
        if row.get("row") == "tar" and row.get("available"):
            lines.append(f"Ingest of the tar against `cp -r` + `sync` of the tree: "
                         f"{row['ratio_to_cp']:.2f}x.")
        if row.get("row") == "latency" and row.get("available"):
            ceiling = row["read_only"]
            lines.append(
                f"{row['title'].split(',')[0]}: only reading them through the same mount (no "
                f"ingest) takes {statistics.median(ceiling['one_s']):.2f} s with 1 thread and "
                f"{statistics.median(ceiling['many_s']):.2f} s with {READERS_DEFAULT} "
                f"({row['read_only_ratio']:.2f}x): the most any reader of this emulated source "
                "gains on this machine.")
    lines.append("")
    return lines


def targets(result: dict | None) -> list[tuple[str, float | None, float, str]]:
    """(name, value, goal, detail) of the staging targets."""
    if not result or result.get("skipped"):
        return []
    found = []
    names = {"tree": "cold 110 KB tree: dlfs ingest >= 1.0x cp -r + sync",
             "tar": "cold tar of the tree: dlfs ingest >= 1.0x tar -xf + sync",
             "latency": "1 ms per open: dlfs ingest >= 8x one file at a time"}
    for row in result["rows"]:
        kind = row["row"].split()[0]
        if not row.get("available"):
            found.append((f"{names['latency']} ({row['row']})", None, GOALS["latency"],
                          row.get("note", "")))
            continue
        label = names[kind] + (f" ({row['title'].split(' files')[0]} files)"
                               if kind == "latency" else "")
        found.append((label, row["ratio"], row["goal"],
                      f"{row['dlfs_median_s']:.2f} s vs {row['baseline_median_s']:.2f} s"))
    return found
