"""Cold start with and without dataset warm-up: one random epoch after the page cache was dropped.

    python -m bench.warmup [--quick] [--runs 3] [--data-dir /var/tmp/dlfs-bench-warmup]

Every row starts from a dropped page cache (as root: drop_caches; else
DONTNEED on the workload's files) and reads every sample once, in a seeded
random order, in batches of 256:

- `ext4-1`: one file per sample, `open().read()`, one thread (the baseline);
- `dlfs-cold`: `get_batch` over the data path, no warm-up;
- `dlfs-warm-first`: `dlfs warm` (Client.warm, waiting for it), then the
  epoch; the time is the warm-up plus the epoch (never the epoch alone);
- `dlfs-warm-on-read`: a daemon with --warm-on-first-read on (restarted, so
  the dataset's first read starts it): the epoch runs while the warm-up
  reads ahead in the background.

Rows print min/median/max epoch seconds and samples/s, and the ratio of
the median to ext4-1's in the same run.  The data is a 110 KB (ImageNet
JPEG-like) workload of bench.datagen, 10,000 samples (1.1 GB; quick: 300),
written to its own --data-dir.  Results: bench/results/warmup.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from bench import datagen, processes
from bench.measure import CacheControl, git_info
from dlfs import Client

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KiB = 1024


def workload(quick: bool) -> datagen.Workload:
    samples = 300 if quick else 10_000
    return datagen.Workload("110k", f"110 KB samples (ImageNet-JPEG-like), {samples:,}", samples,
                            56 * KiB, 164 * KiB, "imagenet", 256, 1)


def epoch_order(samples: int, batch: int, seed: int) -> list[np.ndarray]:
    order = np.random.default_rng([9, seed]).permutation(samples).astype(np.int64)
    return [order[i:i + batch] for i in range(0, samples, batch)]


def ext4_epoch(prepared, batches) -> float:
    started = time.perf_counter()
    for batch in batches:
        for i in batch.tolist():
            with open(prepared.file_path(i), "rb", buffering=0) as f:
                f.read()
    return time.perf_counter() - started


def dlfs_epoch(address: str, prepared, batches, *, warm_first: bool) -> tuple[float, float]:
    """(seconds in all, of which the warm-up) for one epoch; the client is opened inside."""
    started = time.perf_counter()
    warm_s = 0.0
    with Client(address) as client:
        ds = client.dataset(prepared.dataset)
        if warm_first:
            infos = client.warm(prepared.dataset, wait=True)
            assert all(i.state == "warm" for i in infos), infos
            warm_s = time.perf_counter() - started
        for batch in batches:
            ds.get_batch(batch)
    return time.perf_counter() - started, warm_s


def summarize(key: str, seconds: list[float], samples: int, warm_s: list[float]) -> dict:
    median = statistics.median(seconds)
    return {"key": key, "runs": len(seconds), "min_s": min(seconds), "median_s": median,
            "max_s": max(seconds), "samples_per_s": samples / median,
            "warm_median_s": statistics.median(warm_s) if warm_s else None}


def run(quick: bool, runs: int, data_dir: str, log) -> dict:
    [prepared] = datagen.prepare_all([workload(quick)], data_dir, log=log)
    samples = prepared.workload.samples
    caches = CacheControl()
    files = [prepared.file_path(i) for i in range(samples)] + prepared.extent_files()
    times: dict[str, list[float]] = {k: [] for k in
                                     ("ext4-1", "dlfs-cold", "dlfs-warm-first",
                                      "dlfs-warm-on-read")}
    warm_times: list[float] = []
    log_dir = os.path.join(data_dir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    for run_no in range(runs):
        batches = epoch_order(samples, prepared.workload.batch_size, run_no)
        caches.make_cold(files, prepared.extent_files())
        times["ext4-1"].append(ext4_epoch(prepared, batches))
        with processes.daemon(prepared.dlfs_data_dir, os.path.join(log_dir, "daemon.log"),
                              ["--warm-on-first-read", "off"]) as daemon:
            caches.make_cold(files, prepared.extent_files())
            times["dlfs-cold"].append(dlfs_epoch(daemon.address, prepared, batches,
                                                 warm_first=False)[0])
            caches.make_cold(files, prepared.extent_files())
            total, warm = dlfs_epoch(daemon.address, prepared, batches, warm_first=True)
            times["dlfs-warm-first"].append(total)
            warm_times.append(warm)
        caches.make_cold(files, prepared.extent_files())
        with processes.daemon(prepared.dlfs_data_dir, os.path.join(log_dir, "daemon.log"),
                              ["--warm-on-first-read", "on"]) as daemon:
            times["dlfs-warm-on-read"].append(dlfs_epoch(daemon.address, prepared, batches,
                                                         warm_first=False)[0])
        log(f"bench.warmup: run {run_no + 1}/{runs}: " +
            ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()))
    rows = [summarize(k, v, samples, warm_times if k == "dlfs-warm-first" else [])
            for k, v in times.items()]
    baseline = rows[0]["median_s"]
    for row in rows:
        row["ratio_vs_ext4"] = baseline / row["median_s"]
    return {"workload": prepared.workload.title, "samples": samples,
            "bytes": prepared.total_bytes, "cache_method": caches.method, "rows": rows,
            "quick": quick, "git": git_info(REPO), "cpus": os.cpu_count(),
            "when": time.strftime("%Y-%m-%d %H:%M:%S")}


def markdown(results: dict) -> str:
    lines = [f"Cold start, one random epoch of {results['workload']} "
             f"({results['bytes'] / 2**20:.0f} MiB), page cache dropped before each row "
             f"({results['cache_method']}); {results['rows'][0]['runs']} runs, "
             f"{results['when']}, git {results['git'].get('commit', '?')[:10]}.",
             "",
             "| row | epoch s incl. warm-up (min / median / max) | of which warm-up (median) "
             "| samples/s | vs ext4-1 |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for row in results["rows"]:
        warm = f"{row['warm_median_s']:.2f}" if row["warm_median_s"] is not None else "—"
        lines.append(f"| {row['key']} | {row['min_s']:.2f} / {row['median_s']:.2f} / "
                     f"{row['max_s']:.2f} | {warm} | {row['samples_per_s']:,.0f} | "
                     f"{row['ratio_vs_ext4']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.warmup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="300 samples, one run")
    parser.add_argument("--runs", type=int, help="runs per row (default 3, quick 1)")
    parser.add_argument("--data-dir", default="/var/tmp/dlfs-bench-warmup")
    parser.add_argument("--out", default=os.path.join(REPO, "bench", "results"))
    args = parser.parse_args(argv)
    results = run(args.quick, args.runs or (1 if args.quick else 3),
                  os.path.abspath(args.data_dir), lambda m: print(m, file=sys.stderr, flush=True))
    text = markdown(results)
    print(text)
    if not args.quick:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "warmup.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(args.out, "warmup.md"), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
