"""`python -m bench --quick` runs end to end and writes well-formed results.

Speed is measured in bench/, never asserted here: this only checks that the
harness runs (tiny data, one timed run per row) and that its JSON has every
contender with numbers.  Rows that cannot run on this machine (fio not
installed, no FUSE) must say so instead of failing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONTENDERS = {"ext4-1", "ext4-8", "lmdb", "lmdb-random", "dlfs-grpc-1", "dlfs-grpc-4",
              "dlfs-grpc-prefetch", "dlfs-fuse", "dlfs-direct", "fio"}
ALWAYS_AVAILABLE = {"ext4-1", "ext4-8", "lmdb", "lmdb-random", "dlfs-grpc-1", "dlfs-grpc-4"}
NUMBERS = ("samples_per_s", "mb_per_s", "p50_ms", "p99_ms", "ratio_to_ext4_1")

pytest.importorskip("lmdb")


@pytest.mark.timeout(120)
def test_quick_benchmark_runs_and_writes_results(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--data-dir", str(tmp_path / "data"),
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| contender | samples/s |" in proc.stdout

    with open(out / "results.json") as f:
        results = json.load(f)
    assert (out / "results.md").exists()
    assert results["quick"] is True
    assert results["machine"]["nproc"] >= 1
    assert results["git"]["commit"]
    assert {w["name"] for w in results["workloads"]} == {"4k", "110k", "140m"}

    rows = results["rows"]
    for workload in ("4k", "110k", "140m"):
        for cache in ("cold", "warm"):
            here = {r["contender"]: r for r in rows
                    if r["workload"] == workload and r["cache"] == cache}
            expected = CONTENDERS - ({"fio"} if cache == "warm" else set())
            assert set(here) == expected, (workload, cache, sorted(here))
            for key, row in here.items():
                if not row["available"]:
                    assert key not in ALWAYS_AVAILABLE, (workload, cache, key, row["note"])
                    assert row["note"], (workload, cache, key)
                    continue
                for field in NUMBERS:
                    if field in ("p50_ms", "p99_ms") and row["latency_kind"] == "io" \
                            and row[field] is None:
                        continue
                    assert isinstance(row[field], (int, float)) and row[field] > 0, \
                        (workload, cache, key, field, row[field])
            assert here["ext4-1"]["ratio_to_ext4_1"] == pytest.approx(1.0)

    targets = {t["target"]: t for t in results["targets"]}
    assert any(name.startswith("cold 4 KB") for name in targets)
    assert all(t["status"] in ("met", "missed", "not measured") for t in targets.values())
    memory = results["memory"]["index_build"]
    assert memory and all(m["bytes_per_sample"] > 0 for m in memory)


@pytest.mark.timeout(120)
def test_cluster_benchmark_runs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench.cluster", "--quick", "--out",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(tmp_path / "cluster-quick.json") as f:
        results = json.load(f)
    assert [m["daemons"] for m in results["measured"]] == [1, 2, 4]
    assert all(m["samples_per_s"] > 0 for m in results["measured"])
    for row in results["model"]:
        assert row["load_max_over_mean"] >= 1.0
        assert abs(row["moved_when_adding_one"] - row["expected_moved"]) < 0.05
