"""Memory of the sample directory: RSS per sample for a 1,000,000-sample dataset.

Two experiments:

1. *Index build* (always): a fresh Python process imports the server
   modules, notes its RSS, builds a `SampleBlock` of N synthetic ImageNet
   paths (`train/nXXXXXXXX/nXXXXXXXX_NNNNN.JPEG`, 1,000 class folders) with
   their location arrays, builds the `DatasetIndex` from it (timed: the
   replay cost of a restart, minus reading the catalog), drops the block
   and measures RSS again.  Retained bytes per sample = RSS delta / N; the
   peak (VmHWM) shows what a restart needs transiently.  Run for several N
   to show that the cost is linear.
2. *Daemon restart* (full runs): a data dir holding one dataset of N
   one-byte samples is written once through `Store` (cached), then the real
   daemon is started on it: time until it serves, and its VmRSS / VmHWM,
   against the same daemon on an empty data dir.  With its data path
   workers (the default) each worker's RSS and PSS are reported too, and
   the PSS of all the daemon's processes together: the index of a dataset
   is one shared mapping, so its pages count once in the sum of PSS
   (shared pages are split among the processes that touched them) but in
   every process's RSS.  The same start with `--datapath-workers 0` (one
   process) is the reference.

    python -m bench.memory [--samples 1000000] [--restart] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

from bench.measure import proc_status_kib

CLASSES = 1000


def synthetic_paths(n: int) -> list[str]:
    per_class = -(-n // CLASSES)
    paths = []
    for c in range(CLASSES):
        wnid = f"n{1440764 + c * 17:08d}"
        paths.extend(f"train/{wnid}/{wnid}_{k:05d}.JPEG" for k in range(per_class))
        if len(paths) >= n:
            break
    return paths[:n]


def _child_build(n: int) -> dict:
    """Runs in a fresh process: RSS before and after building an n-sample index."""
    import numpy as np

    from dlfs.server.core.catalog_records import SampleBlock
    from dlfs.server.core.directory import DatasetIndex

    gc.collect()
    pid = os.getpid()
    rss0 = proc_status_kib(pid)
    paths = synthetic_paths(n)
    rng = np.random.default_rng(0)
    lengths = rng.integers(56 << 10, 164 << 10, n).astype(np.uint64)
    offsets = np.zeros(n, np.uint64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    block = SampleBlock(paths, (offsets >> np.uint64(30)).astype(np.uint32), offsets, lengths,
                        rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32),
                        np.full(n, 0o100644, np.uint32), np.full(n, time.time_ns(), np.int64))
    shuffle = rng.permutation(n)  # the daemon gets samples in arrival order
    block = SampleBlock([paths[i] for i in shuffle.tolist()],
                        *(getattr(block, f)[shuffle] for f in
                          ("extent", "offset", "length", "crc", "mode", "mtime_ns")))
    del paths
    gc.collect()
    rss_block = proc_status_kib(pid)
    started = time.perf_counter()
    index = DatasetIndex("memory", 1, 0, block)
    build_s = time.perf_counter() - started
    del block
    gc.collect()
    rss1 = proc_status_kib(pid)
    arrays = sum(a.nbytes for a in (index.extent, index.offset, index.length, index.crc,
                                    index.mode, index.mtime_ns, index.parent))
    names = sys.getsizeof(index.names) + sum(sys.getsizeof(s) for s in index.names)
    return {
        "samples": n,
        "build_s": build_s,
        "rss_before_kib": rss0,
        "rss_with_block_kib": rss_block,
        "rss_after_kib": rss1,
        "hwm_kib": proc_status_kib(pid, "VmHWM"),
        "retained_bytes": (rss1 - rss0) * 1024,
        "bytes_per_sample": (rss1 - rss0) * 1024 / n,
        "peak_bytes_per_sample": (proc_status_kib(pid, "VmHWM") - rss0) * 1024 / n,
        "arrays_bytes_per_sample": arrays / n,
        "names_bytes_per_sample": names / n,
        "dirs": len(index.dirs),
    }


def index_build(n: int) -> dict:
    """`_child_build(n)` in a fresh interpreter (so earlier allocations do not blur RSS)."""
    proc = subprocess.run([sys.executable, "-m", "bench.memory", "--child-build", str(n)],
                          capture_output=True, text=True, check=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _build_restart_data_dir(data_dir: str, n: int, log) -> float:
    """One dataset of n one-byte samples, written through Store; cached by a marker."""
    marker = os.path.join(data_dir, "bench-ready.json")
    if os.path.exists(marker):
        with open(marker) as f:
            if json.load(f).get("samples") == n:
                return 0.0
    import shutil

    from dlfs.server.config import ServerConfig
    from dlfs.server.store import Store

    log(f"bench: writing a {n}-sample catalog for the restart experiment in {data_dir}")
    shutil.rmtree(data_dir, ignore_errors=True)
    started = time.monotonic()
    store = Store.open(ServerConfig(data_dir=data_dir))
    try:
        session = store.ingests.begin("memory")
        mtime = time.time_ns()
        for i, path in enumerate(synthetic_paths(n)):
            session.start_file(path, 1, 0o100644, mtime)
            session.write(bytes((i & 0xFF,)))
        store.ingests.commit(session)
    finally:
        store.close()
    with open(marker, "w") as f:
        json.dump({"samples": n}, f)
    return time.monotonic() - started


def daemon_restart(data_dir: str, n: int, log=print) -> dict:
    """Start the real daemon on an empty and on an n-sample data dir; RSS and start time."""
    from bench import processes

    full_dir = os.path.join(data_dir, f"memory-{n}")
    empty_dir = os.path.join(data_dir, "memory-empty")
    write_s = _build_restart_data_dir(full_dir, n, log)
    out = {"samples": n, "write_s": write_s}
    for workers, prefix in ((None, ""), (0, "one_process_")):
        extra = [] if workers is None else ["--datapath-workers", str(workers)]
        for label, directory in (("empty", empty_dir), ("full", full_dir)):
            os.makedirs(directory, exist_ok=True)
            with processes.daemon(directory, os.path.join(
                    data_dir, f"memory-daemon-{prefix}{label}.log"), extra) as daemon:
                time.sleep(0.5)  # let the gRPC threads settle
                out[f"{prefix}{label}_startup_s"] = daemon.startup_s
                out[f"{prefix}{label}_rss_kib"] = proc_status_kib(daemon.pid, "VmRSS")
                out[f"{prefix}{label}_hwm_kib"] = proc_status_kib(daemon.pid, "VmHWM")
                tree = _process_tree_memory(daemon.pid)
                out[f"{prefix}{label}_pss_kib"] = sum(p["pss_kib"] for p in tree)
                out[f"{prefix}{label}_workers"] = tree[1:]
        out[f"{prefix}rss_delta_bytes"] = (out[f"{prefix}full_rss_kib"]
                                           - out[f"{prefix}empty_rss_kib"]) * 1024
        out[f"{prefix}bytes_per_sample"] = out[f"{prefix}rss_delta_bytes"] / n
        out[f"{prefix}pss_bytes_per_sample"] = (out[f"{prefix}full_pss_kib"]
                                                - out[f"{prefix}empty_pss_kib"]) * 1024 / n
        out[f"{prefix}peak_bytes_per_sample"] = (out[f"{prefix}full_hwm_kib"]
                                                 - out[f"{prefix}empty_rss_kib"]) * 1024 / n
    return out


def _process_tree_memory(pid: int) -> list[dict]:
    """RSS and PSS (KiB) of process `pid`, then of each of its children (the data path
    workers), from /proc."""
    found = []
    for member in [pid] + _children(pid):
        pss = 0
        with open(f"/proc/{member}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
        found.append({"pid": member, "rss_kib": proc_status_kib(member, "VmRSS"),
                      "pss_kib": pss})
    return found


def _children(pid: int) -> list[int]:
    children = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            children += [int(c) for c in f.read().split()]
    return children


def run(sizes: list[int], restart_samples: int | None, data_dir: str, log=print) -> dict:
    builds = []
    for n in sizes:
        result = index_build(n)
        log(f"bench: memory: {n:>9,} samples: {result['bytes_per_sample']:.0f} B/sample retained "
            f"({result['retained_bytes'] / 1e6:.0f} MB), peak {result['peak_bytes_per_sample']:.0f}"
            f" B/sample, index build {result['build_s']:.2f} s")
        builds.append(result)
    out: dict = {"index_build": builds}
    if len(builds) >= 2:  # linear fit: bytes = fixed + per_sample * n
        (n0, r0), (n1, r1) = [(b["samples"], b["retained_bytes"]) for b in (builds[0], builds[-1])]
        slope = (r1 - r0) / (n1 - n0)
        out["fit"] = {"bytes_per_sample": slope, "fixed_bytes": r0 - slope * n0}
    if restart_samples:
        restart = daemon_restart(data_dir, restart_samples, log)
        log(f"bench: memory: daemon with {restart_samples:,} samples: RSS "
            f"{restart['full_rss_kib'] / 1024:.0f} MiB (empty {restart['empty_rss_kib'] / 1024:.0f}"
            f" MiB; {restart['bytes_per_sample']:.0f} B/sample), all its processes' PSS "
            f"{restart['pss_bytes_per_sample']:.0f} B/sample, peak "
            f"{restart['full_hwm_kib'] / 1024:.0f} MiB, ready in {restart['full_startup_s']:.1f} s; "
            f"one process: RSS {restart['one_process_full_rss_kib'] / 1024:.0f} MiB "
            f"({restart['one_process_bytes_per_sample']:.0f} B/sample)")
        out["daemon_restart"] = restart
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--restart", action="store_true",
                        help="also start a real daemon on a data dir with that many samples")
    parser.add_argument("--data-dir", default="/var/tmp/dlfs-bench")
    parser.add_argument("--child-build", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_build:
        print(json.dumps(_child_build(args.child_build)))
        return 0
    sizes = sorted({max(1, args.samples // 10), args.samples})
    print(json.dumps(run(sizes, args.samples if args.restart else None, args.data_dir), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
