"""Load: 32 concurrent clients issue random batches against one daemon.

Short by default (CI); `DLFS_LOAD_SECONDS=60 ./dev test tests/e2e/test_load.py -s`
is the long run.  Zero errors, zero wrong bytes, bounded daemon memory; the
latency figures are printed, never asserted.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time

import numpy as np
import pytest

from helpers.trees import write_tree

SECONDS = float(os.environ.get("DLFS_LOAD_SECONDS", "8"))
PROCESSES = 4
THREADS_PER_PROCESS = 8  # 32 clients, each with its own channel
SAMPLES = 2000


def sample_bytes(i: int) -> bytes:
    return np.random.default_rng(i).bytes(500 + (i * 37) % 8000)


def client_process(address: str, seconds: float, seed: int, results) -> None:
    import threading

    from dlfs import Client

    expected = [sample_bytes(i) for i in range(SAMPLES)]
    latencies: list[float] = []
    failures: list[str] = []
    samples = [0]
    lock = threading.Lock()

    def worker(index: int) -> None:
        rng = np.random.default_rng(seed * 100 + index)
        with Client(address, reconnect_timeout_s=0) as client:
            ds = client.dataset("load")
            stop = time.monotonic() + seconds
            while time.monotonic() < stop:
                ids = rng.integers(0, SAMPLES, int(rng.integers(1, 257)))
                started = time.perf_counter()
                try:
                    got = ds.get_batch(ids)
                except Exception as exc:  # noqa: BLE001 - counted, reported
                    with lock:
                        failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                elapsed = time.perf_counter() - started
                wrong = [int(i) for i, s in zip(ids, got) if s != expected[i]]
                with lock:
                    latencies.append(elapsed)
                    samples[0] += len(ids)
                    if wrong:
                        failures.append(f"wrong bytes for samples {wrong[:5]}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS_PER_PROCESS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put((latencies, failures, samples[0]))


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.soak
def test_32_clients_random_batches(daemon, tmp_path):
    # Zero-padded names keep sorted path order equal to i, so id i holds sample_bytes(i).
    write_tree(tmp_path / "src", {f"{i:05d}": sample_bytes(i) for i in range(SAMPLES)})
    from dlfs import Client

    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "load")
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=client_process, args=(daemon.address, SECONDS, p, results))
                 for p in range(PROCESSES)]
    rss_start = rss_kib(daemon.process.pid)
    started = time.monotonic()
    for p in processes:
        p.start()
    rss_samples = []
    outcomes = []
    # Results are taken as they come: a process exits only once the queue's pipe has
    # taken all it put (its latencies outgrow the pipe's buffer when batches are fast).
    while len(outcomes) < len(processes) and time.monotonic() - started < SECONDS + 120:
        rss_samples.append(rss_kib(daemon.process.pid))
        try:
            outcomes.append(results.get(timeout=0.5))
        except queue.Empty:
            pass
    assert len(outcomes) == len(processes), "a client process never reported"
    for p in processes:
        p.join(30)
    elapsed = time.monotonic() - started
    latencies = sorted(x for lat, _, _ in outcomes for x in lat)
    failures = [f for _, fail, _ in outcomes for f in fail]
    samples = sum(n for _, _, n in outcomes)
    assert not failures, failures[:10]
    assert latencies, "no batch completed"
    p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
    print(f"\n32 clients, {elapsed:.1f} s: {len(latencies)} batches, {samples / elapsed:.0f} "
          f"samples/s, batch latency p50 {p50 * 1e3:.1f} ms p99 {p99 * 1e3:.1f} ms, daemon RSS "
          f"{rss_start // 1024} -> max {max(rss_samples) // 1024} MiB")
    # Memory stays bounded: buffers are per stream and released; no growth with time.
    assert max(rss_samples) < rss_start + 512 * 1024
    half = len(rss_samples) // 2
    if half >= 4:
        assert max(rss_samples[half:]) < max(rss_samples[:half]) * 1.5 + 64 * 1024
    assert daemon.alive()
