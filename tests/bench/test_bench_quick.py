"""`python -m bench --quick` runs end to end and writes well-formed results.

Speed is measured in bench/, never asserted here: this only checks that the
harness runs (tiny data, one timed run per row) and that its JSON has every
contender with numbers, the CPU figures where they apply, the ratios to
raw TCP, the targets, the alternating runs and the scaling experiment.  Rows that cannot run on
this machine (fio not installed, no FUSE) must say so instead of failing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONTENDERS = {"ext4-1", "ext4-8", "lmdb", "lmdb-random", "dlfs-grpc-1", "dlfs-grpc-4",
              "dlfs-grpc-prefetch", "dlfs-tcp-1", "dlfs-tcp-4", "dlfs-tcp-prefetch",
              "dlfs-tcp-out-1", "dlfs-unix-1", "dlfs-fuse", "dlfs-direct", "fio", "raw-tcp",
              "raw-unix-sendfile", "raw-tcp-mapped"}
COLD_ONLY = {"fio"}
WARM_ONLY = {"raw-tcp", "raw-unix-sendfile", "raw-tcp-mapped"}
ALWAYS_AVAILABLE = {"ext4-1", "ext4-8", "lmdb", "lmdb-random", "dlfs-grpc-1", "dlfs-grpc-4",
                    "dlfs-tcp-1", "dlfs-tcp-4", "dlfs-tcp-prefetch", "dlfs-tcp-out-1",
                    "dlfs-unix-1", "raw-tcp", "raw-unix-sendfile", "raw-tcp-mapped"}
# Rows whose "daemon" CPU figure is measured: they read through the daemon, or (raw-*)
# have a sender process.  The others show only the client figure.
SERVER_SIDE = {"dlfs-grpc-1", "dlfs-grpc-4", "dlfs-grpc-prefetch", "dlfs-tcp-1", "dlfs-tcp-4",
               "dlfs-tcp-prefetch", "dlfs-tcp-out-1", "dlfs-unix-1", "dlfs-fuse", "dlfs-direct",
               "raw-tcp", "raw-unix-sendfile", "raw-tcp-mapped"}
DATA_PATH_ROWS = {"dlfs-tcp-1", "dlfs-tcp-4", "dlfs-tcp-prefetch", "dlfs-tcp-out-1",
                  "dlfs-unix-1"}
NUMBERS = ("samples_per_s", "mb_per_s", "p50_ms", "p99_ms", "ratio_to_ext4_1")
COLUMNS = "| × ext4 1 thread | × raw TCP | daemon CPU-s/GB | client CPU-s/GB | note |"
TARGET_STATUSES = ("met", "missed", "not measured", "info")

pytest.importorskip("lmdb")


@pytest.mark.timeout(120)
def test_quick_benchmark_runs_and_writes_results(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--data-dir", str(tmp_path / "data"),
         "--out", str(out), "--workloads", "4k,110k,140m"],  # staging: its own test below
        cwd=REPO, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| contender | samples/s |" in proc.stdout and COLUMNS in proc.stdout
    assert "## Scaling: client processes against one daemon" in proc.stdout

    with open(out / "results-quick.json") as f:
        results = json.load(f)
    assert (out / "results-quick.md").exists()
    assert not (out / "results.json").exists()  # a quick run leaves a full run's results be
    assert results["quick"] is True
    assert results["machine"]["nproc"] >= 1
    assert results["git"]["commit"]
    assert {w["name"] for w in results["workloads"]} == {"4k", "110k", "140m"}

    rows = results["rows"]
    for workload in ("4k", "110k", "140m"):
        for cache in ("cold", "warm"):
            here = {r["contender"]: r for r in rows
                    if r["workload"] == workload and r["cache"] == cache}
            expected = CONTENDERS - (COLD_ONLY if cache == "warm" else WARM_ONLY)
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
                _check_cpu(row, key in SERVER_SIDE)
                if cache == "warm":
                    assert isinstance(row["ratio_to_raw_tcp"], float), (workload, key)
                else:
                    assert row["ratio_to_raw_tcp"] is None, (workload, key)
                if key in DATA_PATH_ROWS:
                    assert row["data_connections"] >= 1, (workload, cache, key)
            assert here["ext4-1"]["ratio_to_ext4_1"] == pytest.approx(1.0)
            if cache == "warm":
                assert here["raw-tcp"]["ratio_to_raw_tcp"] == pytest.approx(1.0)

    targets = {t["target"]: t for t in results["targets"]}
    assert any(name.startswith("cold 4 KB") for name in targets)
    assert all(t["status"] in TARGET_STATUSES for t in targets.values())
    for prefix in ("warm 110 KB: best of dlfs-tcp-1", "warm 4 KB: best DLFS TCP row",
                   "warm 110 KB: daemon CPU-s/GB of dlfs-tcp-1",
                   "warm 110 KB: client CPU-s/GB of dlfs-tcp-1", "cold 4 KB: best DLFS TCP row",
                   "cold 110 KB: best DLFS TCP row",
                   "warm 110 KB: DLFS GB/s never falls as clients are added",
                   "warm 110 KB: daemon CPU-s/GB <= 1.5x the raw senders'",
                   "warm 110 KB: 8 client processes >= 0.6x raw TCP"):
        assert any(name.startswith(prefix) for name in targets), prefix
    warm110 = next(t for name, t in targets.items() if name.startswith("warm 110 KB: best of"))
    assert warm110["status"] in ("met", "missed") and warm110["detail"].startswith("dlfs-tcp")

    # The 4 KB target from alternating runs of both rows (bench.paired).
    assert "## Alternating runs:" in proc.stdout
    paired = results["paired"]
    assert (paired["first"], paired["second"]) == ("lmdb", "dlfs-tcp-4")
    assert len(paired["pairs"]) == 3
    for pair in paired["pairs"]:
        assert pair["first_sps"] > 0 and pair["second_sps"] > 0
        assert pair["ratio"] == pytest.approx(pair["second_sps"] / pair["first_sps"])
    assert paired["ratio_min"] <= paired["ratio_median"] <= paired["ratio_max"]
    target = next(t for name, t in targets.items() if "alternating runs" in name)
    assert target["value"] == paired["ratio_median"] and target["status"] in ("met", "missed")

    scaling = results["scaling"]
    cpus = len(os.sched_getaffinity(0))
    assert [c["processes"] for c in scaling["cases"]] == [n for n in (1, 2, 4, 8, 12)
                                                          if n <= cpus]
    for case in scaling["cases"]:
        for side, fields in (("dlfs", ("gb_per_s", "daemon_cpu_s_per_gb",
                                       "daemon_user_cpu_s_per_gb", "daemon_cpu_utilisation",
                                       "client_cpu_s_per_gb", "machine_busy")),
                             ("raw", ("gb_per_s", "sender_cpu_s_per_gb",
                                      "receiver_cpu_s_per_gb", "machine_busy"))):
            for field in fields:
                value = case[side][field]
                assert isinstance(value, (int, float)) and value >= 0, (case, side, field)
            assert case[side]["gb_per_s"] > 0
        # The daemon's user time is part of its CPU time.
        assert case["dlfs"]["daemon_user_cpu_s_per_gb"] <= case["dlfs"]["daemon_cpu_s_per_gb"]
        assert case["ratio_to_raw"] > 0
        # The daemon's workers show in it, each with its CPU share.
        assert len(case["dlfs"]["worker_cpu_utilisation"]) == cpus
    assert scaling["explanation"]

    memory = results["memory"]["index_build"]
    assert memory and all(m["bytes_per_sample"] > 0 for m in memory)


def _check_cpu(row: dict, server_side: bool) -> None:
    """CPU figures: numbers (>= 0: a quick run may spend less than a clock tick) or absent."""
    where = (row["workload"], row["cache"], row["contender"])
    for side, measured in (("client", True), ("daemon", server_side)):
        total, per_gb = row[f"{side}_cpu_s"], row[f"{side}_cpu_s_per_gb"]
        if measured:
            assert isinstance(total, float) and total >= 0, (where, side, total)
            assert isinstance(per_gb, float) and per_gb >= 0, (where, side, per_gb)
        else:
            assert total is None and per_gb is None, (where, side)


@pytest.mark.timeout(120)
def test_quick_staging_rows_run_alone(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--workloads", "ingest", "--data-dir",
         str(tmp_path / "data"), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "## Staging: `dlfs ingest` against cp, tar and one file at a time" in proc.stdout
    assert not (out / "results-quick.json").exists()  # nor do the staging rows alone
    with open(out / "ingest-quick.json") as f:
        results = json.load(f)
    assert results["rows"] == []
    staging = results["ingest"]
    rows = {row["row"]: row for row in staging["rows"]}
    assert set(rows) >= {"tree", "tar"}
    for kind in ("tree", "tar"):
        row = rows[kind]
        assert row["available"] and row["ratio"] > 0 and row["dlfs_median_s"] > 0
        assert row["baseline_median_s"] > 0 and row["files"] == 300
    latency = [row for row in staging["rows"] if row["row"].startswith("latency")]
    assert len(latency) == 2
    for row in latency:
        assert row["available"] and row["ratio"] > 0 or row["note"].startswith("not available")
    targets = {t["target"]: t for t in results["targets"]}
    assert sum(name.startswith(("cold 110 KB tree", "cold tar", "1 ms per open"))
               for name in targets) == 4


@pytest.mark.timeout(120)
def test_cluster_benchmark_runs(tmp_path):
    """`./dev bench --workloads cluster --quick` (python -m bench): bench.cluster's rows."""
    proc = subprocess.run([sys.executable, "-m", "bench", "--workloads", "cluster", "--quick",
                           "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=110)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(tmp_path / "cluster-quick.json") as f:
        results = json.load(f)
    assert [m["daemons"] for m in results["measured"]] == [1, 2, 4]
    assert all(m["samples_per_s"] > 0 for m in results["measured"])
    ours = results["control_plane"][0]
    assert ours["client"].startswith("dlfs.coord.etcd_grpc") and ours["available"]
    assert all(ours[f"{op}_ms"] > 0 for op in ("read", "put", "read_txn", "put_to_watch"))
    # etcd3gw is optional: measured when installed, else its row says so.
    gateway = results["control_plane"][1]
    assert gateway["available"] or gateway["note"].startswith("not installed")
    for row in results["model"]:
        assert row["load_max_over_mean"] >= 1.0
        assert abs(row["moved_when_adding_one"] - row["expected_moved"]) < 0.05


@pytest.mark.timeout(300)
def test_scaling_runs_alone_as_on_the_gpu_machine(tmp_path):
    """`python -m bench.scaling`, the command the 16-core machine runs: its own data, daemon
    and report, both sides for each client count."""
    proc = subprocess.run([sys.executable, "-m", "bench.scaling", "--quick", "--clients", "1,2",
                           "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(tmp_path / "scaling.json") as f:
        results = json.load(f)
    assert [c["processes"] for c in results["cases"]] == [1, 2]
    for case in results["cases"]:
        assert case["dlfs"]["gb_per_s"] > 0 and case["raw"]["gb_per_s"] > 0
        assert case["dlfs"]["daemon_cpu_s_per_gb"] > 0 and case["raw"]["sender_cpu_s_per_gb"] > 0
        assert 0 <= case["dlfs"]["daemon_user_cpu_s_per_gb"] <= case["dlfs"]["daemon_cpu_s_per_gb"]
    # Which exchange the clients used, as this interpreter finds it (C where it is built).
    from dlfs.client.transport import datapath_conn

    from dlfs.server.read import mapped_sends

    exchange, send = results["client_exchange"], results["daemon_send"]
    assert (exchange == "C") == (datapath_conn.native is not None)
    assert (send == "C") == (mapped_sends.native is not None)
    assert all(side == "C" or side.startswith("Python (") for side in (exchange, send))
    names = [t[0] for t in results["targets"]]
    assert any("never falls" in name for name in names)
    assert "| clients N | DLFS GB/s | raw TCP GB/s |" in (tmp_path / "scaling.md").read_text()


def test_scaling_names_the_measuring_process_that_failed():
    """A client or receiver process that fails before its barrier aborts it; the parent
    then raises with that process's error, not an error of its own."""
    import multiprocessing

    from bench import scaling

    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    results.put({"error": "ConnectionRefusedError: no daemon"})
    barrier.abort()
    with pytest.raises(RuntimeError, match="a measuring process failed: ConnectionRefusedError"):
        scaling._wait(barrier, results)


@pytest.mark.timeout(300)
def test_the_device_script_runs_both_exchanges(tmp_path):
    """bench/device_scaling.sh, the one command for the GPU machine, tried small: the
    table with the C exchange and send, then with the Python ones, both under $OUT."""
    env = {**os.environ, "OUT": str(tmp_path / "out"), "DLFS_BENCH_DATA": str(tmp_path / "data"),
           # `python3` there is the machine's; here, this interpreter.
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    proc = subprocess.run(["bash", os.path.join(REPO, "bench", "device_scaling.sh"), "--quick",
                           "--clients", "1,2"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-4000:]
    from dlfs.client.transport import datapath_conn

    from dlfs.server.read import mapped_sends

    for side, exchange, send in (
            ("c", "C" if datapath_conn.native is not None else None,
             "C" if mapped_sends.native is not None else None),
            ("python", "Python (DLFS_NATIVE=0)", "Python (DLFS_NATIVE=0)")):
        with open(tmp_path / "out" / side / "scaling.json") as f:
            results = json.load(f)
        assert [c["processes"] for c in results["cases"]] == [1, 2]
        if exchange:
            assert results["client_exchange"] == exchange
        if send:
            assert results["daemon_send"] == send
        assert f"== {side}\n| clients N |" in proc.stdout


def test_the_bench_scripts_pass_shellcheck():
    scripts = [os.path.join(REPO, "bench", name) for name in ("native_for.sh",
                                                               "device_scaling.sh")]
    done = subprocess.run(["shellcheck", "--severity=style", *scripts], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout
