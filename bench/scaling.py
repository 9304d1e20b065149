"""Scaling: several client processes against one daemon, warm 110 KB batches over TCP.

Each case starts N client processes (multiprocessing, spawned: the
benchmark process holds gRPC threads, which do not survive a fork).  Every
process opens its own `Client(address, data_path="tcp")`, reads a few
batches to connect and warm up, then all start together (a barrier) and
each reads its own seeded sequence of random batches, one batch in flight,
for `duration_s`.  A case is `runs` such windows in the same processes.

Per window: aggregate bytes / (last process's stop - first one's start);
the daemon's CPU seconds (/proc/PID/stat) and wall seconds of the window
give its CPU-s/GB and its utilisation (1.0 = one CPU busy all the time);
the clients' CPU is each process's getrusage, summed; "machine busy" is the
share of all CPUs not idle in /proc/stat (other tenants of a shared machine
count too).  The issue asks for 4 processes >= 1.5x one; `explain` says
what limits them when they are not.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import statistics
import time

from bench.datagen import Prepared, Workload, batch_sequence
from bench.measure import CacheControl, process_cpu_s, self_cpu_s

WORKLOAD = "110k"
CLIENT_PROCESSES = (1, 4)
WARM_UP_BATCHES = 2
# A spawned process imports numpy, grpc and dlfs, connects and warms up within this.
WORKER_START_TIMEOUT_S = 120.0
TARGET_RATIO = 1.5


def run(prepared: Prepared, daemon_address: str, daemon_pid: int, *, runs: int,
        duration_s: float, log=print) -> dict:
    """Both cases on `prepared` (the 110 KB workload, warm); figures for results.json."""
    CacheControl.make_warm(prepared.extent_files())
    cases = []
    for processes in CLIENT_PROCESSES:
        case = measure_case(prepared, daemon_address, daemon_pid, processes, runs, duration_s)
        log(f"bench: scaling {processes} client process{'es' if processes > 1 else ''}: "
            f"{case['gb_per_s']:.2f} GB/s, daemon {case['daemon_cpu_utilisation']:.2f} CPU, "
            f"{case['daemon_cpu_s_per_gb']:.2f} CPU-s/GB")
        cases.append(case)
    one, many = cases[0], cases[-1]
    ratio = many["gb_per_s"] / one["gb_per_s"] if one["gb_per_s"] else None
    return {"workload": prepared.workload.name, "transport": "tcp", "runs": runs,
            "duration_s": duration_s, "cpus": len(os.sched_getaffinity(0)),
            "batch_size": prepared.workload.batch_size, "cases": cases,
            "ratio": ratio, "goal": TARGET_RATIO,
            "explanation": explain(one, many, ratio, len(os.sched_getaffinity(0)))}


def measure_case(prepared: Prepared, daemon_address: str, daemon_pid: int, processes: int,
                 runs: int, duration_s: float) -> dict:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes + 1)
    results = context.Queue()
    workers = [context.Process(target=_worker, name=f"bench-scaling-{k}",
                               args=(daemon_address, prepared.dataset, prepared.workload, k,
                                     runs, duration_s, barrier, results))
               for k in range(processes)]
    for worker in workers:
        worker.start()
    windows = []
    try:
        for _ in range(runs):
            try:
                barrier.wait(WORKER_START_TIMEOUT_S)
            except multiprocessing.BrokenBarrierError:
                raise RuntimeError(_worker_error(results) or "a client process did not start")
            daemon0, busy0, wall0 = process_cpu_s(daemon_pid), _machine_busy(), time.monotonic()
            got = [results.get(timeout=duration_s + WORKER_START_TIMEOUT_S)
                   for _ in range(processes)]
            daemon1, busy1, wall1 = process_cpu_s(daemon_pid), _machine_busy(), time.monotonic()
            failed = [g["error"] for g in got if "error" in g]
            if failed:
                raise RuntimeError(f"a client process failed: {failed[0]}")
            nbytes = sum(g["bytes"] for g in got)
            span_s = max(g["stopped"] for g in got) - min(g["started"] for g in got)
            wall_s = wall1 - wall0
            windows.append({
                "bytes": nbytes, "samples": sum(g["samples"] for g in got), "span_s": span_s,
                "gb_per_s": nbytes / 1e9 / span_s, "wall_s": wall_s,
                "daemon_cpu_s": daemon1 - daemon0,
                "client_cpu_s": sum(g["cpu_s"] for g in got),
                "machine_busy": (busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1e-9),
            })
    finally:
        for worker in workers:
            worker.join(WORKER_START_TIMEOUT_S)
            if worker.is_alive():
                worker.kill()
                worker.join()
    return _summarise(processes, windows)


def _summarise(processes: int, windows: list[dict]) -> dict:
    rates = [w["gb_per_s"] for w in windows]
    gb = sum(w["bytes"] for w in windows) / 1e9
    wall_s = sum(w["wall_s"] for w in windows)
    daemon_s = sum(w["daemon_cpu_s"] for w in windows)
    client_s = sum(w["client_cpu_s"] for w in windows)
    return {
        "processes": processes,
        "gb_per_s": statistics.median(rates), "gb_per_s_min": min(rates),
        "gb_per_s_max": max(rates),
        "samples_per_s": statistics.median(w["samples"] / w["span_s"] for w in windows),
        "daemon_cpu_s_per_gb": daemon_s / gb if gb else None,
        "daemon_cpu_utilisation": daemon_s / wall_s,
        "client_cpu_s_per_gb": client_s / gb if gb else None,
        "client_cpu_utilisation": client_s / wall_s,
        "machine_busy": statistics.median(w["machine_busy"] for w in windows),
        "windows": windows,
    }


def explain(one: dict, many: dict, ratio: float | None, cpus: int) -> str:
    """What the figures say limits several client processes (sentences for the report).

    Saturated CPUs: the daemon's plus the clients' utilisation near the
    CPUs there are (or the machine near fully busy).  A daemon near one CPU
    is said too: past that, its threads' Python work (one interpreter lock)
    may be what bounds it on a larger machine.
    """
    if ratio is None:
        return "not measured"
    n = many["processes"]
    daemon, clients = many["daemon_cpu_utilisation"], many["client_cpu_utilisation"]
    text = (f"{n} processes reach {ratio:.2f}x one.  With {n} the daemon used {daemon:.2f} CPU "
            f"(with 1: {one['daemon_cpu_utilisation']:.2f}) and the clients {clients:.2f}, "
            f"{daemon + clients:.2f} of {cpus} CPUs; the machine was "
            f"{many['machine_busy']:.0%} busy (with 1: {one['machine_busy']:.0%}).")
    if ratio >= TARGET_RATIO:
        return text
    limits = []
    if many["machine_busy"] >= 0.9 or daemon + clients >= 0.9 * cpus:
        limits.append(
            f"the CPUs are saturated: every GB costs {many['daemon_cpu_s_per_gb']:.2f} CPU-s in "
            f"the daemon and {many['client_cpu_s_per_gb']:.2f} in the clients, so once they "
            "fill the cores more client processes only share the same CPU time")
    if daemon >= 0.85:
        limits.append("the daemon is at about one CPU, a share of this machine it cannot grow "
                      "while clients need the rest (whether its threads, which share one "
                      "interpreter lock, could use more cores is not shown here)")
    if not limits:
        limits.append("neither the CPUs nor the daemon are saturated: the limit is elsewhere "
                      "(queueing in the daemon, memory bandwidth)")
    return text + "  What limits them: " + "; and ".join(limits) + "."


def _machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs from /proc/stat's first line."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already in user
    return total - idle, total


def _worker_error(results) -> str:
    try:
        while True:
            got = results.get(timeout=1.0)
            if "error" in got:
                return f"a client process failed: {got['error']}"
    except queue.Empty:
        return ""


def _worker(address: str, dataset: str, workload: Workload, seed: int, runs: int,
            duration_s: float, barrier, results) -> None:
    """One client process: warm up, then `runs` windows of `duration_s` started by `barrier`."""
    try:
        from dlfs import Client

        batches = batch_sequence(workload, seed=1 + seed)
        with Client(address, data_path="tcp") as client:
            ds = client.dataset(dataset)
            for ids in batches[:WARM_UP_BATCHES]:
                ds.get_batch(ids)
            position = 0
            for _ in range(runs):
                barrier.wait(WORKER_START_TIMEOUT_S)
                cpu0 = self_cpu_s()
                started = time.monotonic()
                stop_at = started + duration_s
                nbytes = samples = 0
                while True:
                    out = ds.get_batch(batches[position % len(batches)])
                    position += 1
                    nbytes += sum(len(s) for s in out)
                    samples += len(out)
                    del out  # the reply buffer goes back to the client's pool
                    now = time.monotonic()
                    if now >= stop_at:
                        break
                results.put({"bytes": nbytes, "samples": samples, "started": started,
                             "stopped": now, "cpu_s": self_cpu_s() - cpu0})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        results.put({"error": f"{type(exc).__name__}: {exc}"})
        barrier.abort()
