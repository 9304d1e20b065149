"""`python -m bench.dlio_mount [--quick]`: the real DLIO benchmark through the mount and from ext4.

    .venv/bin/python -m bench.dlio_mount             # about 12 minutes on 2 cores (+ data once)
    .venv/bin/python -m bench.dlio_mount --quick     # tiny data, one run (tests/bench runs it)
    ./dev bench --workloads dlio                      # the same through ./dev

Runs `dlio_benchmark` 2.0.0 (its own PyTorch data loader and readers,
unchanged) from the DLIO virtualenv (`--dlio-python`, default
$DLFS_TEST_DLIO_PYTHON, else .venv-dlio/bin/python; `./dev` builds it with
DLFS_WITH_DLIO=1) over datasets DLIO generates itself:

- `resnet50`: DLIO's resnet50 workload with JPEG files read by the
  PyTorch loader (one file per sample);
- `unet3d`: DLIO's unet3d workload, NPZ volumes of varied sizes;
- `resnet50-over-budget`: the resnet50 data again, served by a daemon whose
  `--warm-memory-share` is set so that its warm-up budget holds only
  `OVER_BUDGET_SHARE` of the dataset: the warm-up stops there and the rest
  of the first epoch is read from the device through the mount;
- `resnet50-over-budget-via-daemon`: the same with `--extent-reads off`:
  the mount on the daemon's host otherwise reads files from the daemon's
  extents itself, which a mount on another host cannot; this is what such
  a mount does (each file beyond the push a round trip to the daemon).
  Not in --quick.

Each case runs the same DLIO command (same `read_threads`, batch size and
emulated compute) twice per run: once with `data_folder` on ext4, once on
`dlfs-mount ADDR MNT --dataset NAME` of a freshly started daemon
(`--warm-on-first-read on`: the daemon's warm-up starts with the epoch's
first read and is part of the first epoch's time) and a fresh mount.  The
page cache is dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`) right
before each DLIO run, after the daemon and the mount are up.  Reported per
epoch: DLIO's own training throughput (samples/s, from its summary.json),
median of the runs with min..max, and the ratio of the medians
mount / ext4 against the issue's targets (>= 1.0x in every epoch; >= 0.8x
in the first epoch of the over-budget case).  Beside it: when the warm-up
finished relative to the first epoch, and the requests the mount answered
per sample read.  Results: bench/results/dlio_mount.{md,json}.

Generated data and the daemon's data dir are cached under --data-dir
(default /var/tmp/dlfs-bench-dlio), keyed by the case's parameters.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

from bench import processes
from bench.fuse_bench import page_cache_drops
from bench.measure import CacheControl, git_info, process_cpu_s, process_tree_cpu_s
from bench.report import fresh_memory, proactive_reclaim
from dlfs import Client
from dlfs.tools.launch import MountProcess, fuse_unavailable
from dlfs.server.read.warmup import memory_bytes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20

# Targets of issue 15: the mount's samples/s over ext4's.
TARGET_RATIO = 1.0
TARGET_RATIO_OVER_BUDGET_FIRST = 0.8
# The over-budget case's daemon may warm up this share of the dataset.
OVER_BUDGET_SHARE = 0.25
RUN_ATTEMPTS = 3  # a DLIO run disturbed by a foreign drop_caches is repeated up to this often
DLIO_TIMEOUT_S = 1800  # one DLIO run; the full runs take well under a minute each
WARM_POLL_S = 0.1  # how often the warm-up's state is sampled during a mount run


@dataclasses.dataclass(frozen=True)
class Case:
    """One DLIO workload: the DLIO config it starts from and what is overridden."""

    key: str
    data: str  # which generated data set (cases may share one)
    workload: str  # DLIO's config name
    overrides: tuple[str, ...]  # ++workload.* settings (dataset, reader, train)
    budget_share_of_data: float | None = None  # the daemon's warm-up budget / the data's bytes
    mount_args: tuple[str, ...] = ()  # more `dlfs-mount` options
    label: str = ""  # what the options mean, for the report

    def dataset_overrides(self) -> list[str]:
        return [o for o in self.overrides if o.startswith("++workload.dataset.")]


def resnet50(files: int, epochs: int) -> tuple[str, ...]:
    return ("++workload.framework=pytorch", "++workload.reader.data_loader=pytorch",
            "++workload.dataset.format=jpeg", f"++workload.dataset.num_files_train={files}",
            "++workload.dataset.num_samples_per_file=1",
            "++workload.dataset.record_length=114660",
            "++workload.reader.read_threads=2", "++workload.reader.batch_size=64",
            "++workload.train.computation_time=0.05", f"++workload.train.epochs={epochs}")


def unet3d(files: int, record_bytes: int, epochs: int) -> tuple[str, ...]:
    return (f"++workload.dataset.num_files_train={files}",
            f"++workload.dataset.record_length={record_bytes}",
            f"++workload.dataset.record_length_stdev={record_bytes // 4}",
            "++workload.reader.read_threads=2", "++workload.reader.batch_size=4",
            "++workload.train.computation_time=0.05", f"++workload.train.epochs={epochs}",
            "++workload.workflow.checkpoint=False")


def cases(quick: bool) -> list[Case]:
    """The cases; sizes chosen so a full run takes minutes on a 2-core VM."""
    epochs = 2 if quick else 3
    jpeg = resnet50(128 if quick else 4096, epochs)
    npz = unet3d(8 if quick else 64, (1 if quick else 16) * MiB, epochs)
    chosen = [Case("resnet50", "resnet50", "resnet50_a100", jpeg),
              Case("unet3d", "unet3d", "unet3d_a100", npz),
              Case("resnet50-over-budget", "resnet50", "resnet50_a100", jpeg, OVER_BUDGET_SHARE)]
    if not quick:  # the same mount code as above but for where the bytes come from
        chosen.append(Case("resnet50-over-budget-via-daemon", "resnet50", "resnet50_a100", jpeg,
                           OVER_BUDGET_SHARE, ("--extent-reads", "off"),
                           "every read through the daemon, as from another host"))
    return chosen


# --- DLIO ---------------------------------------------------------------------------------------

def default_dlio_python() -> str:
    return os.environ.get("DLFS_TEST_DLIO_PYTHON") or os.path.join(REPO, ".venv-dlio", "bin",
                                                                    "python")


def dlio_unavailable(python: str) -> str:
    """Why DLIO cannot run with `python`, or ""."""
    if not os.access(python, os.X_OK):
        return (f"no DLIO Python at {python}: build it with `DLFS_WITH_DLIO=1 ./dev test` "
                "(.venv-dlio) or pass --dlio-python")
    probe = subprocess.run([python, "-c", "import dlio_benchmark"], capture_output=True,
                           text=True)
    if probe.returncode:
        return f"{python} cannot import dlio_benchmark: {probe.stderr.strip()[-300:]}"
    return ""


def dlio(python: str, case: Case, data_folder: str, out_dir: str, *extra: str,
         train: bool = True) -> dict:
    """Run DLIO once for `case` on `data_folder`; its summary.json ({} unless `train`).
    Raises RuntimeError with the tail of DLIO's output when it fails."""
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    command = [python, "-m", "dlio_benchmark.main", f"workload={case.workload}",
               *case.overrides, f"++workload.dataset.data_folder={data_folder}",
               f"++hydra.run.dir={out_dir}", *extra]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(command, env=env, cwd=out_dir, capture_output=True, text=True,
                            timeout=DLIO_TIMEOUT_S)
    with open(os.path.join(out_dir, "dlio-output.txt"), "w") as f:
        f.write(result.stdout + result.stderr)
    summary = os.path.join(out_dir, "summary.json")
    if result.returncode or (train and not os.path.exists(summary)):
        raise RuntimeError(f"DLIO failed ({result.returncode}) in {out_dir}:\n"
                           f"{(result.stdout + result.stderr)[-3000:]}")
    if not train:
        return {}
    with open(summary) as f:
        return json.load(f)


def epoch_windows(out_dir: str) -> list[tuple[float, float]]:
    """(start, end) of each epoch as Unix times, from DLIO's per_epoch_stats.json (UTC)."""
    with open(os.path.join(out_dir, "per_epoch_stats.json")) as f:
        stats = json.load(f)

    def unix(text: str) -> float:
        return datetime.datetime.fromisoformat(text).replace(
            tzinfo=datetime.timezone.utc).timestamp()

    return [(unix(stats[e]["start"]), unix(stats[e]["end"]))
            for e in sorted(stats, key=int) if e.isdigit()]


# --- data ---------------------------------------------------------------------------------------

def prepare(python: str, case: Case, data_dir: str, log) -> tuple[str, int]:
    """(data folder, bytes) of `case`'s data, generated by DLIO and ingested into the
    daemon data dir beside it (dataset name = `case.data`); reused while the
    parameters match."""
    root = os.path.join(data_dir, case.data)
    folder = os.path.join(root, "data")
    want = {"workload": case.workload, "dataset": case.dataset_overrides()}
    ready = os.path.join(root, "ready.json")
    if os.path.exists(ready):
        with open(ready) as f:
            have = json.load(f)
        if {k: have.get(k) for k in want} == want:
            return folder, have["bytes"]
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    log(f"bench.dlio_mount: generating {case.data} with DLIO in {folder}")
    dlio(python, case, folder, os.path.join(root, "generate"),
         "++workload.workflow.generate_data=True", "++workload.workflow.train=False",
         train=False)
    total = sum(os.path.getsize(os.path.join(d, name))
                for d, _dirs, names in os.walk(folder) for name in names)
    with processes.daemon(os.path.join(root, "dlfs"), os.path.join(root, "daemon.log")) as d:
        with Client(d.address) as client:
            client.ingest(folder, case.data, progress=False)
    with open(ready, "w") as f:
        json.dump({**want, "bytes": total}, f)
    return folder, total


# --- runs ---------------------------------------------------------------------------------------

class WarmWatch:
    """Samples a dataset's warm-up state on a thread: when it finished (Unix time) and its
    last status."""

    def __init__(self, address: str, name: str):
        self.address, self.name = address, name
        self.finished_at: float | None = None
        self.status: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "WarmWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with Client(self.address) as client:
            while True:
                [info] = client.warm_status(self.name)
                self.status = dataclasses.asdict(info)
                if info.state not in ("none", "queued", "warming") and self.finished_at is None:
                    self.finished_at = time.time()
                if self._stop.wait(WARM_POLL_S):
                    return


def undisturbed(run_once) -> dict:
    """`run_once()`, repeated (up to RUN_ATTEMPTS times) while another process drops
    the page cache during it (/proc/vmstat): on a shared machine a foreign
    drop_caches would make a warm epoch cold.  The result says how many
    attempts were thrown away, and whether the last was disturbed too."""
    for attempt in range(RUN_ATTEMPTS):
        result = run_once()
        if not result.pop("foreign_drops"):
            return {**result, "repeated": attempt, "disturbed": False}
    return {**result, "repeated": RUN_ATTEMPTS - 1, "disturbed": True}


def ext4_run(python: str, case: Case, folder: str, out_dir: str, caches: CacheControl) -> dict:
    caches.make_cold([])
    drops = page_cache_drops()
    summary = dlio(python, case, folder, out_dir)
    return {"samples_per_s": summary["metric"]["train_throughput_samples_per_second"],
            "foreign_drops": page_cache_drops() - drops}


def mount_run(python: str, case: Case, data_dir: str, data_bytes: int, out_dir: str,
              caches: CacheControl) -> dict:
    """One DLIO run through a fresh daemon and a fresh mount; the epochs' samples/s,
    the warm-up's status and timing, and the mount's request counts."""
    root = os.path.join(data_dir, case.data)
    args = ["--warm-on-first-read", "on"]
    if case.budget_share_of_data is not None:
        share = case.budget_share_of_data * data_bytes / memory_bytes()
        args += ["--warm-memory-share", f"{share:.6f}"]
    logs = os.path.join(data_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    with processes.daemon(os.path.join(root, "dlfs"), os.path.join(logs, "daemon.log"),
                          args) as daemon:
        mount = MountProcess(daemon.address, os.path.join(data_dir, "mnt"),
                             os.path.join(logs, "mount.log"),
                             ["--dataset", case.data, *case.mount_args])
        with mount, WarmWatch(daemon.address, case.data) as warm:
            caches.make_cold([])
            drops = page_cache_drops()
            cpu = process_tree_cpu_s(daemon.pid), process_cpu_s(mount.pid)
            summary = dlio(python, case, mount.mountpoint, out_dir)
            cpu = (process_tree_cpu_s(daemon.pid) - cpu[0],
                   process_cpu_s(mount.pid) - cpu[1])
            drops = page_cache_drops() - drops
            requests = mount.request_counts()
            calls = mount.request_counts(label="daemon calls")
    windows = epoch_windows(out_dir)
    first_start, first_end = windows[0]
    return {"samples_per_s": summary["metric"]["train_throughput_samples_per_second"],
            "warm": warm.status,
            "warm_done_into_epoch1_s": (None if warm.finished_at is None
                                        else warm.finished_at - first_start),
            "epoch1_s": first_end - first_start, "requests": requests, "daemon_calls": calls,
            "daemon_cpu_s": cpu[0], "mount_cpu_s": cpu[1], "foreign_drops": drops}


def run(python: str, quick: bool, runs: int, data_dir: str, only: set[str], log) -> dict:
    caches = CacheControl()
    results: dict = {"cases": [], "quick": quick, "runs": runs, "cache_method": caches.method,
                     "git": git_info(REPO), "cpus": os.cpu_count(),
                     "memory_bytes": memory_bytes(), "when": time.strftime("%Y-%m-%d %H:%M:%S"),
                     "fresh_memory": fresh_memory()}
    for case in cases(quick):
        if only and case.key not in only:
            continue
        folder, data_bytes = prepare(python, case, data_dir, log)
        files = sum(len(names) for _d, _dirs, names in os.walk(folder))
        entry = {"key": case.key, "workload": case.workload, "overrides": list(case.overrides),
                 "files": files, "bytes": data_bytes, "ext4": [], "mount": []}
        if case.budget_share_of_data is not None:
            entry["warm_budget_bytes"] = int(case.budget_share_of_data * data_bytes)
        if case.mount_args:
            entry["mount_args"], entry["label"] = list(case.mount_args), case.label
        out = os.path.join(data_dir, "out", case.key)
        for run_no in range(runs):
            entry["ext4"].append(undisturbed(
                lambda: ext4_run(python, case, folder, out + "-ext4", caches)))
            entry["mount"].append(undisturbed(
                lambda: mount_run(python, case, data_dir, data_bytes, out + "-mount", caches)))
            log(f"bench.dlio_mount: {case.key} run {run_no + 1}/{runs}: ext4 " +
                " ".join(f"{v:,.0f}" for v in entry["ext4"][-1]["samples_per_s"]) +
                ", mount " + " ".join(f"{v:,.0f}" for v in entry["mount"][-1]["samples_per_s"]) +
                " samples/s by epoch")
        results["cases"].append(entry)
    return results


# --- report -------------------------------------------------------------------------------------

def epoch_rows(entry: dict) -> list[dict]:
    """Per epoch: ext4 and mount samples/s (median, min, max over runs), ratio, target."""
    rows = []
    epochs = len(entry["ext4"][0]["samples_per_s"])
    for epoch in range(epochs):
        ext4 = [r["samples_per_s"][epoch] for r in entry["ext4"]]
        mount = [r["samples_per_s"][epoch] for r in entry["mount"]]
        over_budget = "warm_budget_bytes" in entry
        target = (TARGET_RATIO_OVER_BUDGET_FIRST if over_budget and epoch == 0
                  else TARGET_RATIO)
        ratio = statistics.median(mount) / statistics.median(ext4)
        rows.append({"epoch": epoch + 1, "ext4": ext4, "mount": mount, "ratio": ratio,
                     "target": target, "met": ratio >= target})
    return rows


def markdown(results: dict) -> str:
    def spread(values: list[float]) -> str:
        text = f"{statistics.median(values):,.0f}"
        return text + (f" ({min(values):,.0f}..{max(values):,.0f})" if len(values) > 1 else "")

    lines = [f"# DLIO through the mount{' (--quick: too small to judge speed)' if results['quick'] else ''}",
             "",
             f"dlio_benchmark 2.0.0, PyTorch loader; page cache dropped before every DLIO run "
             f"({results['cache_method']}); {results['runs']} run(s) per row, median "
             f"(min..max); {results['cpus']} CPUs, {results['when']}, git "
             f"{results['git'].get('commit', '?')[:10]}"
             f"{' (+ changes)' if results['git'].get('dirty') else ''}.",
             "",
             "| case | data | epoch | ext4 samples/s | mount samples/s | mount / ext4 | target |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for entry in results["cases"]:
        data = f"{entry['files']:,} files, {entry['bytes'] / MiB:,.0f} MiB"
        if "warm_budget_bytes" in entry:
            data += f", warm-up budget {entry['warm_budget_bytes'] / MiB:,.0f} MiB"
        if entry.get("label"):
            data += f"; {entry['label']} (`{' '.join(entry['mount_args'])}`)"
        for row in epoch_rows(entry):
            verdict = "met" if row["met"] else "**missed**"
            lines.append(f"| {entry['key']} | {data} | {row['epoch']} | {spread(row['ext4'])} | "
                         f"{spread(row['mount'])} | {row['ratio']:.2f}x | "
                         f">= {row['target']:.1f}x {verdict} |")
    lines += ["", "| case | run | epoch 1 s (mount) | warm-up | warm-up done, s into epoch 1 "
              "| CPU s, daemon / mount (all epochs) | requests per file read (mount) |",
              "| --- | ---: | ---: | --- | ---: | ---: | --- |"]
    for entry in results["cases"]:
        reads = entry["files"] * len(entry["mount"][0]["samples_per_s"])
        for i, r in enumerate(entry["mount"]):
            warm = r["warm"]
            state = (f"{warm.get('state')}, {warm.get('bytes_warmed', 0) / MiB:,.0f} of "
                     f"{warm.get('bytes_total', 0) / MiB:,.0f} MiB")
            done = r["warm_done_into_epoch1_s"]
            per_file = ", ".join(f"{k} {v / reads:.2f}" for k, v in sorted(r["requests"].items()))
            lines.append(f"| {entry['key']} | {i + 1} | {r['epoch1_s']:.2f} | {state} | "
                         f"{'not done' if done is None else f'{done:.2f}'} | "
                         f"{r['daemon_cpu_s']:.1f} / {r['mount_cpu_s']:.1f} | {per_file} |")
    lines += ["", "DLIO's throughput of an epoch counts its steps over the epoch's wall time, "
              "so the first epoch of the mount includes the daemon's warm-up (it starts with "
              "the first read).  Requests per file read: what reached the mount's Python code "
              "over all epochs, divided by files x epochs."]
    runs = [r for entry in results["cases"] for r in entry["ext4"] + entry["mount"]]
    repeated = sum(r["repeated"] for r in runs)
    disturbed = sum(r["disturbed"] for r in runs)
    if repeated:
        lines.append(f"{repeated} DLIO runs were repeated because another process dropped the "
                     f"page cache while they ran (/proc/vmstat drop_pagecache); {disturbed} of "
                     f"the runs in the table were still disturbed after {RUN_ATTEMPTS} attempts.")
    if proactive_reclaim():
        lines.append(proactive_reclaim())
    if results.get("fresh_memory"):
        lines.append(results["fresh_memory"])
    if results.get("large_reads"):
        lines.append(f"READs of large files through the mount: {results['large_reads']}.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dlio_mount", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny data, 2 epochs, one run")
    parser.add_argument("--runs", type=int, help="runs per case (default 2, quick 1)")
    parser.add_argument("--cases", default="", help="comma-separated subset of "
                        + ",".join(c.key for c in cases(False)))
    parser.add_argument("--dlio-python", default=default_dlio_python(),
                        help="a Python with dlio_benchmark 2.0.0 and dlfs (default %(default)s)")
    parser.add_argument("--data-dir", default="/var/tmp/dlfs-bench-dlio")
    parser.add_argument("--out", help="directory for dlio_mount.{md,json} (default "
                        "bench/results; --quick writes them only when given)")
    args = parser.parse_args(argv)
    reason = dlio_unavailable(args.dlio_python) or fuse_unavailable()
    if reason:
        print(f"bench.dlio_mount: cannot run: {reason}", file=sys.stderr)
        return 2
    with processes.splice_pipes() as large_reads:
        results = run(args.dlio_python, args.quick, args.runs or (1 if args.quick else 2),
                      os.path.abspath(args.data_dir), set(filter(None, args.cases.split(","))),
                      lambda m: print(m, file=sys.stderr, flush=True))
    results["large_reads"] = large_reads
    text = markdown(results)
    print(text)
    out = args.out or (None if args.quick else os.path.join(REPO, "bench", "results"))
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "dlio_mount.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(out, "dlio_mount.md"), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
