"""Many daemons: measured scaling here, the control plane's cost, and a model of
placement at 1,000 nodes.

    python -m bench.cluster [--quick] [--out bench/results]

1. *Measured*: 1, 2 and 4 real daemons on this machine, members of a cluster
   in a real etcd on loopback (one cluster per row), one striped dataset
   (20,000 samples of 4 KiB, replicas 1), warm random batches of 256 through
   `Client(etcd=...)` with 4 batches in flight.  On a 2-core VM all daemons
   share the same two cores and page cache, so this shows the cost of
   splitting a batch (more, smaller RPCs in parallel), not the gain of more
   nodes; on real nodes each daemon brings its own NVMe and cores.
2. *Control plane*: what DLFS asks of etcd, timed against the same etcd: a
   read, a put, a read then a transaction on its mod revision (a commit), and
   a put until a watch on its prefix hears of it (a member learning a
   commit); `runs` runs of `calls` calls each, the median per call of every
   run, then the median of the runs.  For DLFS's own client
   (`dlfs.coord.etcd_grpc`, stubs generated from etcd's API) and, when it is
   installed (`pip install etcd3gw`), etcd3gw (etcd's JSON gateway), the
   client docs/cluster.md compares it with.
3. *Model*: rendezvous placement (the real `dlfs.client.cluster.placement.place`) of
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
from dlfs.tools.launch import EtcdProcess

BATCH = 256


def measure(daemons_count: int, samples: int, seconds: float, workdir: str,
            etcd_url: str) -> dict:
    cluster = f"scale-{daemons_count}"
    daemons = [processes.daemon(os.path.join(workdir, f"d{daemons_count}-{i}"),
                                os.path.join(workdir, f"d{daemons_count}-{i}.log"),
                                ["--etcd", etcd_url, "--cluster", cluster])
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
        with Client(etcd=etcd_url, cluster=cluster) as client:
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


def control_plane(etcd_url: str, calls: int, runs: int) -> list[dict]:
    """Per client and operation: the median time of one call, in ms (see the module
    doc).  A client that is not installed gets a row saying so."""
    rows = []
    for name, make in (("dlfs.coord.etcd_grpc (gRPC stubs)", _GrpcOps),
                       ("etcd3gw (JSON gateway)", _GatewayOps)):
        try:
            ops = make(etcd_url)
        except ImportError as exc:
            rows.append({"client": name, "available": False, "note": f"not installed ({exc})"})
            continue
        try:
            row = {"client": name, "available": True}
            for op in ("read", "put", "read_txn", "put_to_watch"):
                medians = []
                for _ in range(runs):
                    times = sorted(getattr(ops, op)(i) for i in range(calls))
                    medians.append(times[len(times) // 2])
                row[f"{op}_ms"] = 1e3 * sorted(medians)[len(medians) // 2]
            rows.append(row)
        finally:
            ops.close()
    return rows


class _GrpcOps:
    """The calls DLFS makes, through its own etcd client; each returns seconds."""

    def __init__(self, url: str):
        import threading

        from dlfs.coord import etcd_grpc

        self._etcd_grpc = etcd_grpc
        self.client = etcd_grpc.EtcdClient(url)
        self.client.put("/bench/k", b"0")
        self.heard = threading.Event()
        self.watch = self.client.watch("/bench/w/", lambda _revision: self.heard.set())
        self.heard.wait(5)

    def read(self, _i: int) -> float:
        t = time.perf_counter()
        self.client.get("/bench/k")
        return time.perf_counter() - t

    def put(self, i: int) -> float:
        t = time.perf_counter()
        self.client.put("/bench/k", str(i).encode())
        return time.perf_counter() - t

    def read_txn(self, i: int) -> float:
        g = self._etcd_grpc
        t = time.perf_counter()
        kv = self.client.get("/bench/k")
        self.client.txn([g.Compare("/bench/k", "mod", "==", kv.mod_revision)],
                        [g.Put("/bench/k", str(i).encode())])
        return time.perf_counter() - t

    def put_to_watch(self, i: int) -> float:
        self.heard.clear()
        t = time.perf_counter()
        self.client.put("/bench/w/k", str(i).encode())
        self.heard.wait(5)
        return time.perf_counter() - t

    def close(self) -> None:
        self.watch.stop()
        self.client.close()


class _GatewayOps:
    """The same calls through etcd3gw (etcd's JSON gateway over HTTP)."""

    def __init__(self, url: str):
        import base64
        import threading

        import etcd3gw

        host, _, port = url.removeprefix("http://").rpartition(":")
        self._b64 = lambda data: base64.b64encode(data).decode()
        self.client = etcd3gw.client(host=host, port=int(port))
        self.client.put("/bench/k", "0")
        self.heard = threading.Event()
        events, self._cancel = self.client.watch_prefix("/bench/w/")
        self._thread = threading.Thread(target=lambda: [self.heard.set() for _ in events],
                                        daemon=True)
        self._thread.start()

    def read(self, _i: int) -> float:
        t = time.perf_counter()
        self.client.get("/bench/k")
        return time.perf_counter() - t

    def put(self, i: int) -> float:
        t = time.perf_counter()
        self.client.put("/bench/k", str(i))
        return time.perf_counter() - t

    def read_txn(self, i: int) -> float:
        t = time.perf_counter()
        [(_value, meta)] = self.client.get("/bench/k", metadata=True)
        key = self._b64(b"/bench/k")
        self.client.transaction({
            "compare": [{"key": key, "result": "EQUAL", "target": "MOD",
                         "mod_revision": meta["mod_revision"]}],
            "success": [{"request_put": {"key": key, "value": self._b64(str(i).encode())}}],
            "failure": []})
        return time.perf_counter() - t

    def put_to_watch(self, i: int) -> float:
        self.heard.clear()
        t = time.perf_counter()
        self.client.put("/bench/w/k", str(i))
        self.heard.wait(5)
        return time.perf_counter() - t

    def close(self) -> None:
        self._cancel()


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
    calls, runs = (30, 1) if args.quick else (300, 3)
    model_samples = 20000 if args.quick else 1_000_000
    workdir = tempfile.mkdtemp(prefix="dlfs-cluster-bench-", dir="/var/tmp")
    try:
        with EtcdProcess(os.path.join(workdir, "etcd"), os.path.join(workdir, "etcd.log")) as etcd:
            calls_ms = control_plane(etcd.url, calls, runs)
            measured = [measure(n, samples, seconds, workdir, etcd.url) for n in (1, 2, 4)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    modelled = model(model_samples, measured[0]["samples_per_s"])
    lines = [f"# Many daemons ({platform.node()}, {os.cpu_count()} CPUs)", "",
             f"Measured: one striped dataset of {samples:,} x 4 KiB, replicas 1, on the "
             "members of a cluster in etcd; warm random batches of 256 through "
             "Client(etcd=...), 4 in flight; all daemons share this machine's "
             f"{os.cpu_count()} cores.", "",
             "| daemons | samples/s | p50 ms | p99 ms |", "| ---: | ---: | ---: | ---: |"]
    lines += [f"| {m['daemons']} | {m['samples_per_s']:,.0f} | {m['p50_ms']:.1f} | "
              f"{m['p99_ms']:.1f} |" for m in measured]
    lines += ["", f"Control plane: one etcd {_etcd_version()} on loopback; median ms per "
              f"call ({runs} run(s) of {calls} calls, the median of the runs' medians).", "",
              "| client | read | put | read + txn | put -> watch event |",
              "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['client']} | {r['read_ms']:.2f} | {r['put_ms']:.2f} | "
              f"{r['read_txn_ms']:.2f} | {r['put_to_watch_ms']:.2f} |" if r["available"]
              else f"| {r['client']} | {r['note']} | | | |" for r in calls_ms]
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
        json.dump({"measured": measured, "control_plane": calls_ms, "model": modelled,
                   "etcd": _etcd_version(), "commit": _commit()}, f, indent=2)
    return 0


def _etcd_version() -> str:
    import subprocess

    from dlfs.tools.launch import ETCD_BINARY

    out = subprocess.run([ETCD_BINARY, "--version"], capture_output=True, text=True).stdout
    return out.split("\n")[0].removeprefix("etcd Version: ").strip()


def _commit() -> str:
    import subprocess

    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=os.path.dirname(__file__))
    return done.stdout.strip()


if __name__ == "__main__":
    raise SystemExit(main())
