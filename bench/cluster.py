"""Many daemons: measured scaling here, and a model of placement at 1,000 nodes.

    python -m bench.cluster [--quick] [--out bench/results]

1. *Measured*: 1, 2 and 4 real daemons on this machine, one striped dataset
   (20,000 samples of 4 KiB, replicas 1), warm random batches of 256 through
   `Client([...])` with 4 batches in flight.  On a 2-core VM all daemons
   share the same two cores and page cache, so this shows the cost of
   splitting a batch (more, smaller RPCs in parallel), not the gain of more
   nodes; on real nodes each daemon brings its own NVMe and cores.
2. *Model*: rendezvous placement (the real `dlfs.client.cluster.placement.place`) of
   1,000,000 samples on 10..1,000 daemons: per-daemon load spread, the
   fraction of samples moved when one daemon is added, and the throughput a
   batch of 256 gets when each daemon serves its part at the single-daemon
   rate measured in (1) while the slowest part decides the batch time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bench import processes
from dlfs import Client
from dlfs.client.cluster.placement import place

BATCH = 256


def measure(daemons_count: int, samples: int, seconds: float, workdir: str) -> dict:
    daemons = [processes.daemon(os.path.join(workdir, f"d{daemons_count}-{i}"),
                                os.path.join(workdir, f"d{daemons_count}-{i}.log"))
               for i in range(daemons_count)]
    for daemon in daemons:
        daemon.start()
    try:
        source = os.path.join(workdir, "src")
        if not os.path.isdir(source):
            rng = np.random.default_rng(0)
            for i in range(samples):
                directory = os.path.join(source, f"s{i // 1000:03d}")
                os.makedirs(directory, exist_ok=True)
                with open(os.path.join(directory, f"{i:06d}.bin"), "wb") as f:
                    f.write(rng.bytes(4096))
        with Client([d.address for d in daemons]) as client:
            client.ingest(source, "scale", replicas=1, progress=False)
            ds = client.dataset("scale")
            rng = np.random.default_rng(1)
            pool = ThreadPoolExecutor(4)
            ds.get_batch(np.arange(samples))  # warm every daemon's page cache
            started, done, latencies = time.perf_counter(), 0, []

            def one() -> float:
                t = time.perf_counter()
                ds.get_batch(rng.integers(0, samples, BATCH))
                return time.perf_counter() - t

            while time.perf_counter() - started < seconds:
                latencies += [f.result() for f in [pool.submit(one) for _ in range(4)]]
                done += 4 * BATCH
            elapsed = time.perf_counter() - started
            pool.shutdown()
        latencies.sort()
        return {"daemons": daemons_count, "samples_per_s": done / elapsed,
                "p50_ms": 1e3 * latencies[len(latencies) // 2],
                "p99_ms": 1e3 * latencies[int(len(latencies) * 0.99)]}
    finally:
        for daemon in daemons:
            daemon.stop()


def model(samples: int, single_rate: float, replicas: int = 2) -> list[dict]:
    paths = [f"train/n{i % 1000:08d}/{i:08d}.JPEG" for i in range(samples)]
    rows = []
    for nodes in (10, 100, 1000):
        members = [f"node{i:04d}:7010" for i in range(nodes)]
        started = time.perf_counter()
        holders = place("imagenet", paths, members, replicas)
        place_s = time.perf_counter() - started
        load = np.bincount(holders.ravel(), minlength=nodes)
        grown = place("imagenet", paths, members + ["node-new:7010"], replicas)
        moved = float((np.sort(grown, 1) != np.sort(holders, 1)).any(1).mean())
        # A batch of 256 random samples: each node serves its share (primary
        # holder) at the single-daemon rate; the largest share sets the time.
        rng = np.random.default_rng(2)
        batch_times = []
        for _ in range(200):
            primary = holders[rng.integers(0, samples, BATCH), 0]
            batch_times.append(np.bincount(primary).max() / single_rate)
        per_node_batches = 1.0 / np.mean(batch_times)
        rows.append({
            "nodes": nodes, "replicas": replicas, "place_s": place_s,
            "load_mean": float(load.mean()), "load_relative_std": float(load.std() / load.mean()),
            "load_max_over_mean": float(load.max() / load.mean()),
            "moved_when_adding_one": moved, "expected_moved": replicas / (nodes + 1),
            # Every node serves batches for many clients at once: aggregate rate
            # scales with nodes as long as clients keep them all busy.
            "aggregate_samples_per_s": nodes * single_rate / (load.max() / load.mean()),
            "one_batch_parallel_speedup": per_node_batches * BATCH / single_rate,
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (CI)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args(argv)
    samples, seconds = (2000, 1.0) if args.quick else (20000, 8.0)
    model_samples = 20000 if args.quick else 1_000_000
    workdir = tempfile.mkdtemp(prefix="dlfs-cluster-bench-", dir="/var/tmp")
    try:
        measured = [measure(n, samples, seconds, workdir) for n in (1, 2, 4)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    modelled = model(model_samples, measured[0]["samples_per_s"])
    lines = [f"# Many daemons ({platform.node()}, {os.cpu_count()} CPUs)", "",
             f"Measured: one striped dataset of {samples:,} x 4 KiB, replicas 1, warm random "
             "batches of 256 through Client([...]), 4 in flight; all daemons share this "
             "machine's 2 cores.", "",
             "| daemons | samples/s | p50 ms | p99 ms |", "| ---: | ---: | ---: | ---: |"]
    lines += [f"| {m['daemons']} | {m['samples_per_s']:,.0f} | {m['p50_ms']:.1f} | "
              f"{m['p99_ms']:.1f} |" for m in measured]
    lines += ["", f"Model: rendezvous placement of {model_samples:,} samples, replicas 2; "
              "aggregate assumes every node serves at the single-daemon rate above.", "",
              "| nodes | placement s | load rel. std | max/mean load | moved adding 1 node "
              "(expected) | aggregate samples/s |", "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['nodes']} | {r['place_s']:.1f} | {r['load_relative_std']:.3f} | "
              f"{r['load_max_over_mean']:.3f} | {r['moved_when_adding_one']:.4f} "
              f"({r['expected_moved']:.4f}) | {r['aggregate_samples_per_s']:,.0f} |"
              for r in modelled]
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(args.out, exist_ok=True)
    name = "cluster-quick" if args.quick else "cluster"
    with open(os.path.join(args.out, f"{name}.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump({"measured": measured, "model": modelled}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
