"""Results out: a markdown table, JSON with the machine and git hash, a PNG chart, target checks.

Every row shows the median of the timed runs (min–max beside it), batch
latency p50/p99 pooled over the runs, the ratio of its median samples/s
to the ext4 one-file-per-sample, 1-thread row of the same workload and
cache state, the ratio of its MB/s to raw-tcp's (warm rows), and the CPU
seconds per GB delivered of the daemon and of the benchmark process.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import time

import numpy as np

from bench import ingest_bench
from bench.contenders import Contender
from bench.datagen import Prepared
from bench.measure import Measurement, git_info

BASELINE = "ext4-1"
RAW_TCP = "raw-tcp"  # the loopback TCP ceiling (bench.ceilings): warm rows' MB/s are compared to it
# Rows that read through the daemon over a network transport, and those of them over TCP.
TCP_ROWS = ("dlfs-tcp-1", "dlfs-tcp-4", "dlfs-tcp-prefetch", "dlfs-tcp-out-1")
NETWORK_ROWS = ("dlfs-grpc-1", "dlfs-grpc-4", "dlfs-grpc-prefetch") + TCP_ROWS
# Rows whose tail latency is checked (p99 < 4x p50).
LATENCY_ROWS = NETWORK_ROWS + ("dlfs-unix-1", "dlfs-direct")
# Runs of one row whose fastest is this much faster than its slowest are flagged:
# another process competed for the CPUs or the disk (or emptied the page cache).
NOISY_SPREAD = 1.5


def machine_info(data_dir: str) -> dict:
    """What the numbers were measured on."""
    info: dict = {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "hostname": platform.node(),
    }
    try:
        with open("/proc/meminfo") as f:
            info["mem_total_mib"] = int(f.readline().split()[1]) // 1024
        with open("/proc/cpuinfo") as f:
            info["cpu_model"] = next((line.split(":", 1)[1].strip() for line in f
                                      if line.startswith("model name")), "")
    except OSError:
        pass
    info["disk"] = _disk_info(data_dir)
    info["proactive_reclaim"] = proactive_reclaim()
    versions = {}
    from importlib import metadata

    for package in ("grpcio", "protobuf", "numpy", "lmdb", "crc32c"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    fio = shutil.which("fio")
    if fio:
        versions["fio"] = subprocess.run([fio, "--version"], capture_output=True,
                                         text=True).stdout.strip()
    info["versions"] = versions
    return info


def proactive_reclaim() -> str:
    """A sentence on memory reclaim that runs without memory pressure, or "".

    Some VMs (here: a Firecracker guest) run DAMON with a `pageout` scheme:
    page-cache pages not touched for about a minute are reclaimed even with
    most of RAM free.  A "warm" pass then finds part of the data gone, and a
    FUSE mount (one daemon round trip per missing file) suffers most.
    """
    root = "/sys/kernel/mm/damon/admin/kdamonds"
    found = []
    for kdamond in sorted(glob.glob(os.path.join(root, "*"))):
        if _read(os.path.join(kdamond, "state")) != "on":
            continue
        for scheme in sorted(glob.glob(os.path.join(kdamond, "contexts/*/schemes/*"))):
            if _read(os.path.join(scheme, "action")) != "pageout":
                continue
            context = os.path.dirname(os.path.dirname(scheme))
            aggr_us = _read(os.path.join(context, "monitoring_attrs/intervals/aggr_us"))
            age = _read(os.path.join(scheme, "access_pattern/age/min"))
            if aggr_us.isdigit() and age.isdigit():
                found.append(f"{int(aggr_us) * int(age) / 1e6:.0f} s")
    if _read("/sys/module/damon_reclaim/parameters/enabled") == "Y":
        found.append("DAMON_RECLAIM")
    if not found:
        return ""
    return (f"This machine reclaims idle memory proactively (DAMON pageout of pages idle for "
            f"{', '.join(found)}), even with RAM free: warm rows can be partly cold, most of "
            "all for the FUSE mount.")


def fresh_memory(probe_bytes: int = 256 * 2**20, idle_s: float = 2.0) -> str:
    """A sentence on what a first touch of memory costs here, or "" when
    memory freed a while ago costs no more than memory freed just now.

    A VM whose host takes freed guest memory back (virtio-balloon free page
    reporting, within about a second here) pays an exit to the host on the
    next first touch of each such page.  Everything that fills fresh memory
    pays it: a FUSE mount's page-cache fills (a CPU copy in the guest) and
    new buffers; ext4's page-cache fills are written by the host's disk
    emulation instead.  Takes about `idle_s` plus a few tenths of a second.
    """
    def first_touch_s() -> float:
        started = time.perf_counter()
        memory = np.empty(probe_bytes, dtype=np.uint8)
        memory[::4096] = 1
        elapsed = time.perf_counter() - started
        del memory
        return elapsed

    first_touch_s()
    recycled = first_touch_s()  # the pages just freed, still the guest's
    time.sleep(idle_s)
    returned = first_touch_s()
    if returned < 2 * recycled:
        return ""
    gb = probe_bytes / 1e9
    return (f"First touch of memory freed {idle_s:.0f} s earlier: {gb / returned:.1f} GB/s, "
            f"against {gb / recycled:.1f} GB/s for memory freed just before: the host takes "
            "idle guest memory back (free page reporting), so every fill of fresh memory (the "
            "mount's page cache, new buffers) pays up to "
            f"{returned / recycled:.0f}x; ext4's page-cache fills are written by the host.")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _disk_info(path: str) -> dict:
    def run(*args: str) -> str:
        try:
            return subprocess.run(args, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    source_fs = run("findmnt", "-no", "SOURCE,FSTYPE", "--target", path).split()
    out = {"source": source_fs[0] if source_fs else "", "fstype": source_fs[1] if len(source_fs) > 1
           else ""}
    device = os.path.basename(out["source"])
    if device:
        out["lsblk"] = run("lsblk", "-dno", "NAME,SIZE,ROTA,MODEL,TRAN", out["source"])
        scheduler = f"/sys/block/{device}/queue/scheduler"
        if os.path.exists(scheduler):
            with open(scheduler) as f:
                out["scheduler"] = f.read().strip()
    return out


def build_results(*, prepared: list[Prepared], measurements: list[Measurement],
                  contenders: list[Contender], memory: dict | None, scaling: dict | None,
                  daemon: dict, ingest: dict | None = None, paired: dict | None = None,
                  settings: dict, cache_method: str, quick: bool, data_dir: str,
                  repo: str, elapsed_s: float) -> dict:
    labels = {c.key: c.label for c in contenders}
    rows = []
    for m in measurements:
        summary = m.summary()
        baseline = _find(measurements, m.workload, m.cache, BASELINE)
        base_sps = baseline.summary()["samples_per_s"] if baseline and baseline.available else None
        ratio = (summary["samples_per_s"] / base_sps
                 if summary["samples_per_s"] is not None and base_sps else None)
        raw = _find(measurements, m.workload, "warm", RAW_TCP)
        raw_mbs = raw.summary()["mb_per_s"] if raw and raw.available else None
        ratio_raw = (summary["mb_per_s"] / raw_mbs
                     if m.cache == "warm" and summary["mb_per_s"] is not None and raw_mbs
                     else None)
        rows.append({"workload": m.workload, "cache": m.cache, "contender": m.contender,
                     "label": labels.get(m.contender, m.contender), "available": m.available,
                     "note": m.note, "latency_kind": m.latency_kind,
                     "ratio_to_ext4_1": ratio, "ratio_to_raw_tcp": ratio_raw, **summary})
    results = {
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "quick": quick,
        "git": git_info(repo),
        "machine": machine_info(data_dir),
        "cold_method": cache_method,
        "settings": settings,
        "elapsed_s": elapsed_s,
        "workloads": [{"name": p.workload.name, "title": p.workload.title,
                       "samples": p.workload.samples, "bytes": p.total_bytes,
                       "batch_size": p.workload.batch_size,
                       "batches_per_run": p.workload.batches_max,
                       "generate_s": p.generate_s} for p in prepared],
        "rows": rows,
        "daemon": daemon,
        "memory": memory,
        "scaling": scaling,
        "ingest": ingest,
        "paired": paired,
    }
    results["targets"] = check_targets(results)
    return results


def _find(measurements, workload, cache, key):
    return next((m for m in measurements
                 if m.workload == workload and m.cache == cache and m.contender == key), None)


def _row(results: dict, workload: str, cache: str, key: str) -> dict | None:
    row = next((r for r in results["rows"] if r["workload"] == workload and r["cache"] == cache
                and r["contender"] == key), None)
    return row if row and row["available"] and row["samples_per_s"] else None


def _best(results: dict, workload: str, cache: str, keys, field: str = "samples_per_s"):
    """The row among `keys` with the highest `field`, or None when none was measured."""
    rows = [r for k in keys if (r := _row(results, workload, cache, k))]
    return max(rows, key=lambda r: r[field]) if rows else None


def check_targets(results: dict) -> list[dict]:
    """The issue's targets, each with its measured value and met / missed / not measured.

    `compare` is how value relates to goal when met (">=", "<" or "<=");
    a target without a goal (None) is a figure reported beside one ("info").
    """
    targets = []

    def add(name: str, value, goal: float | None, detail: str, compare: str = ">=") -> None:
        if goal is None:
            status = "info" if value is not None else "not measured"
        elif value is None:
            status = "not measured"
        else:
            met = {">=": value >= goal, "<": value < goal, "<=": value <= goal}[compare]
            status = "met" if met else "missed"
        targets.append({"target": name, "value": value, "goal": goal, "compare": compare,
                        "status": status, "detail": detail})

    def sps(row: dict) -> str:
        return f"{row['contender']}: {row['samples_per_s']:,.0f}/s"

    def mbs(row: dict) -> str:
        return f"{row['contender']}: {row['mb_per_s']:,.0f} MB/s"

    if not results["rows"]:  # a run of the staging rows alone
        for name, value, goal, detail in ingest_bench.targets(results.get("ingest")):
            add(name, value, goal, detail)
        return targets
    cold4 = _best(results, "4k", "cold", NETWORK_ROWS)
    ext = _row(results, "4k", "cold", BASELINE)
    fio = _row(results, "4k", "cold", "fio")
    add("cold 4 KB: best DLFS network row >= 8x ext4 1 thread",
        cold4["ratio_to_ext4_1"] if cold4 and ext else None, 8.0,
        f"{sps(cold4)} vs ext4 {ext['samples_per_s']:,.0f}/s" if cold4 and ext else "")
    add("cold 4 KB: best DLFS network row >= 70% of fio",
        cold4["samples_per_s"] / fio["samples_per_s"] if cold4 and fio else None, 0.70,
        f"{sps(cold4)} vs fio {fio['samples_per_s']:,.0f}/s"
        if cold4 and fio else "fio not available" if cold4 else "")
    cold4_tcp = _best(results, "4k", "cold", TCP_ROWS)
    add("cold 4 KB: best DLFS TCP row >= 0.85x fio samples/s",
        cold4_tcp["samples_per_s"] / fio["samples_per_s"] if cold4_tcp and fio else None, 0.85,
        f"{sps(cold4_tcp)} vs fio {fio['samples_per_s']:,.0f}/s"
        if cold4_tcp and fio else "fio not available" if cold4_tcp else "")
    cold110 = _best(results, "110k", "cold", NETWORK_ROWS)
    add("cold 110 KB: best DLFS network row >= 2x ext4 1 thread",
        cold110["ratio_to_ext4_1"] if cold110 and cold110["ratio_to_ext4_1"] else None, 2.0,
        sps(cold110) if cold110 else "")
    cold110_tcp = _best(results, "110k", "cold", TCP_ROWS, "mb_per_s")
    devices = [r for k in ("fio", "ext4-8") if (r := _row(results, "110k", "cold", k))]
    device = max(devices, key=lambda r: r["mb_per_s"]) if devices else None
    add("cold 110 KB: best DLFS TCP row MB/s >= 0.9x max(fio, ext4-8)",
        cold110_tcp["mb_per_s"] / device["mb_per_s"] if cold110_tcp and device else None, 0.9,
        f"{mbs(cold110_tcp)} vs {mbs(device)}" if cold110_tcp and device else "")
    warm4 = _row(results, "4k", "warm", "dlfs-grpc-4")
    add("warm 4 KB: DLFS gRPC, 4 in flight >= 1x ext4 1 thread",
        warm4["ratio_to_ext4_1"] if warm4 else None, 1.0,
        f"{warm4['samples_per_s']:,.0f}/s" if warm4 else "")
    warm4_tcp = _best(results, "4k", "warm", TCP_ROWS)
    add("warm 4 KB: best DLFS TCP row >= 1.5x ext4 1 thread",
        warm4_tcp["ratio_to_ext4_1"] if warm4_tcp else None, 1.5,
        sps(warm4_tcp) if warm4_tcp else "")
    lmdb = _row(results, "4k", "warm", "lmdb")
    tcp4 = _row(results, "4k", "warm", "dlfs-tcp-4")
    add("warm 4 KB: DLFS TCP, 4 in flight >= LMDB one thread",
        tcp4["samples_per_s"] / lmdb["samples_per_s"] if tcp4 and lmdb else None, 1.0,
        f"{tcp4['samples_per_s']:,.0f}/s vs LMDB {lmdb['samples_per_s']:,.0f}/s"
        if tcp4 and lmdb else "")
    # The same comparison from alternating runs (bench.paired): the machine's drift
    # between the two rows, minutes apart, is larger than the margin asked about.
    pair = results.get("paired") or {}
    add("warm 4 KB: DLFS TCP, 4 in flight >= LMDB one thread, alternating runs (median pair)",
        pair.get("ratio_median"), 1.0,
        f"{len(pair['pairs'])} pairs, {pair['ratio_min']:.2f}-{pair['ratio_max']:.2f}x; "
        f"medians {pair['second_sps_median']:,.0f}/s vs LMDB {pair['first_sps_median']:,.0f}/s"
        if pair.get("pairs") else pair.get("skipped", ""))
    # The bound of that comparison: the same sample ranges streamed from the page cache
    # over loopback TCP with nothing but the copies (bench.ceilings.RawTcpMapped).
    from_cache = _row(results, "4k", "warm", "raw-tcp-mapped")
    add("warm 4 KB: DLFS TCP, 4 in flight vs TCP from the page cache (raw-tcp-mapped)",
        tcp4["samples_per_s"] / from_cache["samples_per_s"] if tcp4 and from_cache else None,
        None, f"{tcp4['samples_per_s']:,.0f}/s vs {from_cache['samples_per_s']:,.0f}/s; LMDB "
        f"{lmdb['samples_per_s'] / from_cache['samples_per_s']:.2f}x of it"
        if tcp4 and from_cache and lmdb else "")
    direct = _row(results, "4k", "warm", "dlfs-direct")
    add("warm 4 KB: co-located client (direct) >= 4x ext4 1 thread",
        direct["ratio_to_ext4_1"] if direct else None, 4.0,
        f"{direct['samples_per_s']:,.0f}/s" if direct else "Client(direct=True) not available")
    raw = _row(results, "110k", "warm", RAW_TCP)
    warm110 = _best(results, "110k", "warm", ("dlfs-tcp-1", "dlfs-tcp-4", "dlfs-tcp-out-1"),
                    "mb_per_s")
    add("warm 110 KB: best of dlfs-tcp-1/-4/-out-1 MB/s >= 0.8x raw TCP",
        warm110["mb_per_s"] / raw["mb_per_s"] if warm110 and raw else None, 0.8,
        f"{mbs(warm110)} vs raw-tcp {raw['mb_per_s']:,.0f} MB/s" if warm110 and raw else "")
    tcp1 = _row(results, "110k", "warm", "dlfs-tcp-1")
    for side, who, goal in (("daemon", "sender", 1.75), ("client", "receiver", None)):
        field = f"{side}_cpu_s_per_gb"
        mine, theirs = (tcp1 or {}).get(field), (raw or {}).get(field)
        add(f"warm 110 KB: {side} CPU-s/GB of dlfs-tcp-1 "
            + (f"<= {goal:g}x" if goal else "vs") + f" raw TCP {who}'s",
            mine / theirs if mine is not None and theirs else None, goal,
            f"{mine:.3f} vs {theirs:.3f} CPU-s/GB" if mine is not None and theirs else "",
            compare="<=")
    scaling = results.get("scaling") or {}
    for name, value, goal, detail, compare in scaling.get("targets") or ():
        add(name, value, goal, detail, compare=compare)
    for workload in ("4k", "110k"):
        for cache in ("cold", "warm"):
            for key in LATENCY_ROWS:
                row = _row(results, workload, cache, key)
                if row and row["p50_ms"]:
                    add(f"p99 < 4x p50: {key} {workload} {cache}", row["p99_ms"] / row["p50_ms"],
                        4.0, f"p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms",
                        compare="<")
    for name, value, goal, detail in ingest_bench.targets(results.get("ingest")):
        add(name, value, goal, detail)
    memory = results.get("memory") or {}
    restart = memory.get("daemon_restart")
    builds = memory.get("index_build") or []
    if restart:
        add(f"memory: daemon RSS for {restart['samples']:,} samples < 300 MB",
            restart["full_rss_kib"] * 1024 / 1e6, 300.0,
            f"{restart['bytes_per_sample']:.0f} B/sample over an empty daemon "
            f"({restart['empty_rss_kib'] * 1024 / 1e6:.0f} MB); peak "
            f"{restart['full_hwm_kib'] * 1024 / 1e6:.0f} MB", compare="<")
    elif builds:
        big = builds[-1]
        add(f"memory: directory of {big['samples']:,} samples < 300 MB (index only)",
            big["retained_bytes"] / 1e6, 300.0,
            f"{big['bytes_per_sample']:.0f} B/sample", compare="<")
    return targets


# --- markdown -------------------------------------------------------------------------------

def _fmt(value, spec: str, empty: str = "—") -> str:
    return empty if value is None else format(value, spec)


def markdown(results: dict) -> str:
    lines = [f"# DLFS benchmark — {results['timestamp']}" + (" (quick)" if results["quick"] else ""),
             ""]
    machine = results["machine"]
    git = results["git"]
    lines.append(f"Machine: {machine.get('nproc')} CPUs ({machine.get('cpu_model', '?')}), "
                 f"{machine.get('mem_total_mib', 0) / 1024:.1f} GiB RAM, kernel "
                 f"{machine.get('kernel')}, disk {machine['disk'].get('lsblk') or machine['disk']}"
                 f" ({machine['disk'].get('fstype', '?')}); git {git['commit'][:12]}"
                 + (" (dirty)" if git["dirty"] else "") + ".")
    if machine.get("proactive_reclaim"):
        lines.append(machine["proactive_reclaim"])
    lines.append(f"Cold: {results['cold_method']}.  Runs per row: {results['settings']['runs']} "
                 "timed after one warm-up; samples/s is the median (min–max); latency is per "
                 "batch call, pooled over the runs.  Ratio: samples/s over ext4 one-file-per-"
                 "sample, 1 thread, same workload and cache state; × raw TCP: MB/s over raw-tcp's "
                 "(warm).  CPU-s/GB: CPU seconds per 1e9 bytes delivered, totals over the timed "
                 "runs, of the daemon (/proc/PID/stat; for raw-* rows the sender process) and of "
                 "the benchmark process (getrusage, all threads).")
    lines.append("")
    workloads = {w["name"]: w for w in results["workloads"]}
    for name, w in workloads.items():
        for cache in ("cold", "warm"):
            rows = [r for r in results["rows"] if r["workload"] == name and r["cache"] == cache]
            if not rows:
                continue
            lines.append(f"## {w['title']} — {cache}, batches of {w['batch_size']} "
                         f"(up to {w['batches_per_run']} per run)")
            lines.append("")
            lines.append("| contender | samples/s | MB/s | p50 ms | p99 ms | × ext4 1 thread | "
                         "× raw TCP | daemon CPU-s/GB | client CPU-s/GB | note |")
            lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
            for r in rows:
                if not r["available"]:
                    lines.append(f"| {r['label']} | — | — | — | — | — | — | — | — | {r['note']} |")
                    continue
                spread = ""
                if r.get("runs", 0) > 1:
                    spread = (f" ({r['samples_per_s_min']:,.0f}–{r['samples_per_s_max']:,.0f})")
                note = r["note"]
                if r.get("runs", 0) > 1 and r["samples_per_s_min"] > 0 and \
                        r["samples_per_s_max"] / r["samples_per_s_min"] > NOISY_SPREAD:
                    spread_x = r["samples_per_s_max"] / r["samples_per_s_min"]
                    note = (note + "; " if note else "") + (
                        f"**noisy**: runs differ {spread_x:.1f}x (busy machine?)")
                if r["latency_kind"] == "io":
                    note = (note + "; " if note else "") + "latency per I/O"
                lines.append(
                    f"| {r['label']} | {r['samples_per_s']:,.0f}{spread} | {r['mb_per_s']:,.0f} | "
                    f"{_fmt(r['p50_ms'], '.2f')} | {_fmt(r['p99_ms'], '.2f')} | "
                    f"{_fmt(r['ratio_to_ext4_1'], '.2f')} | {_fmt(r['ratio_to_raw_tcp'], '.2f')} | "
                    f"{_fmt(r['daemon_cpu_s_per_gb'], '.2f')} | "
                    f"{_fmt(r['client_cpu_s_per_gb'], '.2f')} | {note} |")
            lines.append("")
    daemon = results.get("daemon") or {}
    if daemon:
        lines.append(f"Daemon RSS: {daemon.get('rss_start_kib', 0) / 1024:.0f} MiB after start, "
                     + ", ".join(f"after {k[len('rss_after_'):-len('_kib')]}: {v / 1024:.0f} MiB"
                                 for k, v in daemon.items() if k.startswith("rss_after_")) +
                     f"; peak (VmHWM) {daemon.get('hwm_end_kib', 0) / 1024:.0f} MiB.")
        lines.append("")
    memory = results.get("memory")
    if memory:
        lines.append("## Memory of the sample directory")
        lines.append("")
        lines.append("| samples | retained RSS | bytes/sample | peak bytes/sample | of which arrays "
                     "| of which names | index build s |")
        lines.append("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for b in memory.get("index_build", []):
            lines.append(f"| {b['samples']:,} | {b['retained_bytes'] / 1e6:.0f} MB | "
                         f"{b['bytes_per_sample']:.0f} | {b['peak_bytes_per_sample']:.0f} | "
                         f"{b['arrays_bytes_per_sample']:.0f} | {b['names_bytes_per_sample']:.0f} | "
                         f"{b['build_s']:.2f} |")
        fit = memory.get("fit")
        if fit:
            lines.append("")
            lines.append(f"Linear fit: {fit['bytes_per_sample']:.0f} bytes per sample + "
                         f"{fit['fixed_bytes'] / 1e6:.1f} MB fixed.")
        restart = memory.get("daemon_restart")
        if restart:
            lines.append("")
            lines.append(
                f"Real daemon on a data dir with {restart['samples']:,} samples: RSS "
                f"{restart['full_rss_kib'] / 1024:.0f} MiB (empty data dir: "
                f"{restart['empty_rss_kib'] / 1024:.0f} MiB; {restart['bytes_per_sample']:.0f} "
                f"B/sample), peak {restart['full_hwm_kib'] / 1024:.0f} MiB, serving after "
                f"{restart['full_startup_s']:.1f} s (empty: {restart['empty_startup_s']:.1f} s).")
            if "pss_bytes_per_sample" in restart:
                workers = restart["full_workers"]
                lines.append("")
                lines.append(
                    f"With its {len(workers)} data path workers (the figures above are the main "
                    "process's): each worker's RSS "
                    + ", ".join(f"{w['rss_kib'] / 1024:.0f}" for w in workers)
                    + " MiB (PSS " + ", ".join(f"{w['pss_kib'] / 1024:.0f}" for w in workers)
                    + f" MiB); all the daemon's processes together {restart['pss_bytes_per_sample']:.0f}"
                    " B/sample of PSS (the shared index counted once).  One process "
                    "(--datapath-workers 0): RSS "
                    f"{restart['one_process_full_rss_kib'] / 1024:.0f} MiB, "
                    f"{restart['one_process_bytes_per_sample']:.0f} B/sample.")
        lines.append("")
    lines += paired_markdown(results.get("paired"), results.get("rows") or [])
    lines += scaling_markdown(results.get("scaling"))
    lines += ingest_bench.markdown(results.get("ingest"))
    lines.append("## Targets")
    lines.append("")
    lines.append("| target | measured | goal | status | detail |")
    lines.append("| --- | ---: | ---: | --- | --- |")
    for t in results["targets"]:
        goal = "—" if t["goal"] is None else f"{t['compare']} {t['goal']:g}"
        lines.append(f"| {t['target']} | {_fmt(t['value'], '.2f')} | {goal} | "
                     f"{t['status']} | {t['detail']} |")
    lines.append("")
    return "\n".join(lines)


def paired_markdown(paired: dict | None, rows: list[dict]) -> list[str]:
    """The alternating runs of bench/paired.py as markdown lines."""
    if not paired:
        return []
    labels = {r["contender"]: r["label"] for r in rows}
    first, second = paired["first"], paired["second"]
    lines = [f"## Alternating runs: {labels.get(second, second)} against "
             f"{labels.get(first, first)} ({paired['workload']}, warm)", ""]
    if paired.get("skipped"):
        return lines + [f"Not run: {paired['skipped']}.", ""]
    lines += ["Both open at once; their timed runs alternate (A B, then B A), so each pair "
              "sees the same machine.  Ratio: the second's samples/s over the first's.", "",
              f"| pair | {first} samples/s | {second} samples/s | ratio |",
              "| ---: | ---: | ---: | ---: |"]
    for k, r in enumerate(paired["pairs"], 1):
        lines.append(f"| {k} | {r['first_sps']:,.0f} | {r['second_sps']:,.0f} | "
                     f"{r['ratio']:.2f} |")
    lines += ["", f"Median ratio {paired['ratio_median']:.2f} ({paired['ratio_min']:.2f}–"
              f"{paired['ratio_max']:.2f}).", ""]
    return lines


def scaling_markdown(scaling: dict | None) -> list[str]:
    """The scaling experiment (bench/scaling.py) as markdown lines."""
    if not scaling:
        return []
    lines = ["## Scaling: client processes against one daemon, and raw TCP with as many "
             "connections (warm 110 KB)", ""]
    if scaling.get("skipped"):
        return lines + [f"Not run: {scaling['skipped']}.", ""]
    if scaling.get("timestamp"):
        lines += [f"{scaling['timestamp']}; git {scaling['git'].get('commit', '')[:12]}; "
                  f"{scaling['cpus']} CPUs ({scaling['machine'].get('cpu_model', '')}).", ""]
    lines.append(
        f"DLFS: N processes, each its own `Client(addr, data_path=\"tcp\")`, one batch of "
        f"{scaling['batch_size']} in flight, its own random batches.  Raw TCP: N sender "
        "processes (`sendall` of one reused buffer of the mean batch size) each into its own "
        "receiver process (`recv_into`), N connections at once; from the page cache: each "
        "sender `sendmsg`s its own random batches from mappings of the extent files.  "
        + (f"Clients' exchange: {scaling['client_exchange']}.  " if scaling.get("client_exchange")
           else "")
        + (f"Daemon's send from mappings: {scaling['daemon_send']}.  "
           if scaling.get("daemon_send") else "")
        + f"{scaling['runs']} window(s) "
        f"of {scaling['duration_s']:g} s per side and N, all processes started together; "
        f"{scaling['cpus']} CPUs.  GB/s: median (min–max) of the aggregate.  Daemon CPUs busy: "
        "CPU seconds of the daemon and all its processes per wall second (1.0 = one CPU), "
        "each data path worker's in brackets.  Daemon CPU-s/GB: user and system time together; "
        "in brackets its user time alone, what the daemon's own code costs (the rest is the "
        "kernel's work for it: the copies, TCP).")
    lines.append("")
    lines.append("| clients N | DLFS GB/s | raw TCP GB/s | DLFS / raw | daemon CPUs busy "
                 "(workers) | daemon CPU-s/GB (user) | raw senders' CPU-s/GB | daemon / senders | "
                 "client CPU-s/GB | raw receivers' CPU-s/GB | machine busy | softirq threads' "
                 "CPU-s/GB (DLFS, raw) | with them: daemon / senders | raw TCP from the page "
                 "cache GB/s | DLFS / it | its senders' CPU-s/GB | daemon / them |")
    lines.append("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
                 "| ---: | ---: | ---: | ---: | ---: | ---: |")
    for c in scaling["cases"]:
        dlfs, raw, cached = c["dlfs"], c["raw"], c.get("raw_from_cache")
        workers = dlfs.get("worker_cpu_utilisation") or []
        lines.append(
            f"| {c['processes']} | {dlfs['gb_per_s']:.2f} ({dlfs['gb_per_s_min']:.2f}–"
            f"{dlfs['gb_per_s_max']:.2f}) | {raw['gb_per_s']:.2f} ({raw['gb_per_s_min']:.2f}–"
            f"{raw['gb_per_s_max']:.2f}) | {_fmt(c['ratio_to_raw'], '.2f')} | "
            f"{dlfs['daemon_cpu_utilisation']:.2f}"
            + (f" ({', '.join(f'{u:.2f}' for u in workers)})" if workers else "")
            + f" | {_fmt(dlfs['daemon_cpu_s_per_gb'], '.2f')}"
            + (f" ({dlfs['daemon_user_cpu_s_per_gb']:.3f})"
               if dlfs.get("daemon_user_cpu_s_per_gb") is not None else "") + " | "
            f"{_fmt(raw['sender_cpu_s_per_gb'], '.2f')} | {_fmt(c['cpu_ratio_to_raw'], '.2f')} | "
            f"{_fmt(dlfs['client_cpu_s_per_gb'], '.2f')} | "
            f"{_fmt(raw['receiver_cpu_s_per_gb'], '.2f')} | {dlfs['machine_busy']:.0%} | "
            f"{_fmt(dlfs.get('softirq_cpu_s_per_gb'), '.2f')}, "
            f"{_fmt(raw.get('softirq_cpu_s_per_gb'), '.2f')} | "
            f"{_fmt(c.get('cpu_ratio_with_softirq'), '.2f')} | "
            + (f"{cached['gb_per_s']:.2f} ({cached['gb_per_s_min']:.2f}–"
               f"{cached['gb_per_s_max']:.2f})" if cached else "—")
            + f" | {_fmt(c.get('ratio_to_raw_from_cache'), '.2f')} | "
            f"{_fmt(cached.get('sender_cpu_s_per_gb') if cached else None, '.2f')} | "
            f"{_fmt(c.get('cpu_ratio_to_raw_from_cache'), '.2f')} |")
    lines += ["", scaling["explanation"], ""]
    if scaling.get("timestamp"):  # run alone: its own targets
        lines += ["| target | measured | goal | detail |", "| --- | ---: | ---: | --- |"]
        for name, value, goal, detail, compare in scaling["targets"]:
            wanted = "—" if goal is None else f"{compare} {goal:g}"
            lines.append(f"| {name} | {_fmt(value, '.2f')} | {wanted} | {detail} |")
        lines.append("")
    return lines


# --- chart ----------------------------------------------------------------------------------

def chart(results: dict, path: str) -> str:
    """Bar chart of samples/s ratio to ext4 1 thread per workload and cache state.

    Returns "" when written, else why not (matplotlib missing).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no PNG chart"
    groups = [(w["name"], w["title"], cache) for w in results["workloads"]
              for cache in ("cold", "warm")]
    groups = [g for g in groups if any(r["workload"] == g[0] and r["cache"] == g[2]
                                       for r in results["rows"])]
    if not groups:
        return "no read rows: no PNG chart"
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 2.2 + 1.9 * len(groups)), squeeze=False)
    for ax, (name, title, cache) in zip(axes[:, 0], groups):
        rows = [r for r in results["rows"] if r["workload"] == name and r["cache"] == cache]
        labels = [r["contender"] for r in rows]
        values = [r["ratio_to_ext4_1"] or 0 for r in rows]
        colors = ["#1f77b4" if r["contender"].startswith("dlfs") else "#999999" for r in rows]
        ax.barh(labels, values, color=colors)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log")
        ax.invert_yaxis()
        ax.set_title(f"{title} — {cache}", fontsize=9)
        ax.tick_params(labelsize=8)
        for y, (value, r) in enumerate(zip(values, rows)):
            text = f"{value:.2f}x  {r['samples_per_s']:,.0f}/s" if value else "n/a"
            ax.text(value if value else 1.0, y, " " + text, va="center", fontsize=7)
    axes[-1, 0].set_xlabel("samples/s relative to ext4 one-file-per-sample, 1 thread (log)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return ""


def write(results: dict, out_dir: str, stem: str = "results") -> dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, f"{stem}.json"),
             "markdown": os.path.join(out_dir, f"{stem}.md"),
             "png": os.path.join(out_dir, f"{stem}.png")}
    text = markdown(results)
    with open(paths["markdown"], "w") as f:
        f.write(text)
    problem = chart(results, paths["png"])
    if problem:
        results["chart"] = problem
        del paths["png"]
    with open(paths["json"], "w") as f:
        json.dump(results, f, indent=2, default=float)
    return paths
