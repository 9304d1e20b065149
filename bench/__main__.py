"""`python -m bench [--quick]`: every contender, every workload, cold and warm, one table.

    ./dev bench                      # full run: about 10 minutes on 2 cores (+ first-time data)
    ./dev bench --quick              # tiny sizes, under a minute (what CI runs)
    ./dev bench --workloads 4k --caches cold --contenders ext4-1,dlfs-grpc-1,fio
    ./dev bench --workloads ingest   # only the staging rows (dlfs ingest vs cp -r, tar -x, ...)
    ./dev bench --workloads dlio     # the real DLIO benchmark through the mount (bench.dlio_mount)
    ./dev bench --workloads cluster  # many daemons in an etcd cluster, the control plane (bench.cluster)
    ./dev bench --workloads dataloader  # the README's DataLoaders against ext4 (bench.train_bench)
    ./dev bench --workloads checkpoint  # checkpoint saves and cold restores against ext4 and fio

Prints the markdown table and writes results.json, results.md and
results.png to --out (results-quick.* with --quick).  Generated data is cached in --data-dir.  Besides the
rows: the scaling experiment (1, 2, 4, 8, 12 client processes up to the
CPUs, beside raw TCP with as many connections, warm 110 KB; --no-scaling
skips it, --scaling-clients picks the counts), the memory experiment (--no-memory), the
staging rows (workload "ingest": bench/ingest_bench.py) and the README's DataLoader examples
against a DataLoader over the same ext4 files (workload "dataloader": `python -m bench.train_bench
--first-example`, into dataloader.{md,json}), and checkpoints (workload
"checkpoint": bench/checkpoint_bench.py, into checkpoint.{md,json}).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

from bench import (checkpoint_bench, cluster, datagen, dlio_mount, ingest_bench, memory,
                   paired, processes, report, runner, scaling, train_bench)
from bench.contenders import BenchEnv
from bench.lineup import all_contenders
from bench.measure import CacheControl, proc_status_kib
from dlfs.tools.launch import MountProcess, fuse_unavailable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DLIO = "dlio"  # the --workloads name of bench.dlio_mount
CLUSTER = "cluster"  # the --workloads name of bench.cluster
DATALOADER = "dataloader"  # the --workloads name of bench.train_bench --first-example
CHECKPOINT = "checkpoint"  # the --workloads name of bench.checkpoint_bench
SEPARATE = {DLIO, CLUSTER, DATALOADER, CHECKPOINT}  # benchmarks with results files of their own
# The target measured by alternating runs as well (bench.paired): DLFS TCP with 4 batches
# in flight against LMDB one thread, warm 4 KB.
PAIRED_WORKLOAD, PAIRED_KEYS = "4k", ("lmdb", "dlfs-tcp-4")
DATA_DIR, QUICK_DATA_DIR = "/var/tmp/dlfs-bench", "/var/tmp/dlfs-bench-quick"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="tiny workloads, one timed run each (checks that it runs, not speed)")
    parser.add_argument("--data-dir", default=None,
                        help="where generated data, the DLFS data dir and logs live (cached; "
                             f"default {DATA_DIR}, with --quick {QUICK_DATA_DIR}: a quick "
                             "run's datasets never join a full run's daemon)")
    parser.add_argument("--out", default=os.path.join(REPO, "bench", "results"),
                        help="directory for results.json, results.md, results.png "
                             "(results-quick.* with --quick: a quick run never replaces a "
                             "full run's results)")
    parser.add_argument("--workloads", default="4k,110k,140m,ingest,dataloader,checkpoint",
                        help="comma-separated subset of 4k,110k,140m (read rows), ingest "
                             "(the staging rows: dlfs ingest vs cp -r, tar -x and one file at "
                             "a time; they use the 110k workload's files), and dlio: the real "
                             "DLIO benchmark through the mount and from ext4 (python -m "
                             "bench.dlio_mount; not in the default, about 6 minutes), and "
                             "cluster: 1, 2 and 4 daemons in a cluster on a real etcd, etcd "
                             "call latencies, the placement model at 1,000 nodes (python -m "
                             "bench.cluster; not in the default, about 2 minutes), and "
                             "dataloader: the README's DataLoader examples (ReadAhead, and a "
                             "transform in workers) against a DataLoader over the same ext4 "
                             "files, cold and warm (python -m bench.train_bench "
                             "--first-example; about a minute, plus its files once), and "
                             "checkpoint: torch.save of 1 GiB from 2 processes into a "
                             "checkpoint space and cold restores, against ext4 and fio "
                             "(python -m bench.checkpoint_bench; about 2 minutes)")
    parser.add_argument("--caches", default="warm,cold", help="comma-separated: warm,cold")
    parser.add_argument("--contenders", default="",
                        help="comma-separated subset of contender keys (default: all; ext4-1 is "
                             "always included as the baseline)")
    parser.add_argument("--runs", type=int, help="timed runs per row (default 3, quick 1)")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory experiment")
    parser.add_argument("--no-scaling", action="store_true",
                        help="skip the scaling experiment (N client processes beside N raw TCP "
                             "connections, warm 110 KB)")
    parser.add_argument("--scaling-clients", default="", metavar="N,N,...",
                        help="client process counts of the scaling experiment (default: 1, 2, "
                             "4, 8, 12 up to the CPUs)")
    parser.add_argument("--no-restart", action="store_true",
                        help="skip starting a daemon on a 1,000,000-sample catalog")
    parser.add_argument("--reader-threads", type=int,
                        help="pass --reader-threads to the daemon (default: its own)")
    parser.add_argument("--daemon-arg", action="append", default=[], metavar="ARG",
                        help="extra dlfs-server argument, e.g. --daemon-arg=--chunk-bytes=16777216"
                             " (repeatable)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    started = time.monotonic()

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    wanted = set(args.workloads.split(","))
    unknown = wanted - {"4k", "110k", "140m", "ingest"} - SEPARATE
    if unknown:
        parser_error = f"unknown workloads: {', '.join(sorted(unknown))}"
        print(f"python -m bench: {parser_error}", file=sys.stderr)
        return 2
    if wanted <= SEPARATE:  # only these: none of the rows, scaling or memory
        return _separate(args, wanted)
    staging = "ingest" in wanted
    reads = wanted - {"ingest"} - SEPARATE
    if staging:
        wanted.add("110k")  # the staging rows ingest its tree
    workloads = [w for w in (datagen.quick_workloads() if args.quick else datagen.full_workloads())
                 if w.name in wanted]
    caches = [c for c in args.caches.split(",") if c in ("warm", "cold")]
    settings = runner.Settings(
        runs=args.runs or (1 if args.quick else 3),
        cold_budget_s=1.0 if args.quick else 4.0,
        warm_budget_s=1.0 if args.quick else 2.0,
        fio_runtime_s=1.0 if args.quick else 5.0,
    )
    scaling_window_s = 0.5 if args.quick else 3.0
    data_dir = os.path.abspath(args.data_dir or (QUICK_DATA_DIR if args.quick else DATA_DIR))
    prepared = datagen.prepare_all(workloads, data_dir, log=progress)
    staging_tree = next((p.files_dir for p in prepared if p.workload.name == "110k"), None)
    prepared = [p for p in prepared if p.workload.name in reads]
    if not reads:
        args.no_memory = args.no_scaling = True
    cache_control = CacheControl()
    daemon_args = ["--reader-threads", str(args.reader_threads)] if args.reader_threads else []
    daemon_args += args.daemon_arg
    daemon_info: dict = {}
    measurements, contenders, scaling_results, paired_results = [], [], None, None
    if reads:
        measurements, contenders, scaling_results, paired_results = run_reads(
            args, prepared, data_dir, daemon_args, daemon_info, settings, caches, cache_control,
            scaling_window_s, progress)
    staging_results = None
    if staging:
        try:
            staging_results = ingest_bench.run(
                staging_tree, os.path.join(data_dir, "ingest"), runs=settings.runs,
                quick=args.quick, cache=cache_control, log=progress)
        except Exception as exc:  # noqa: BLE001 - reported in the results, the run goes on
            logging.getLogger("bench").exception("staging rows failed")
            staging_results = {"skipped": f"failed: {type(exc).__name__}: {exc}"[:300]}
    memory_results = None
    if not args.no_memory:
        sizes = [2_000, 20_000] if args.quick else [100_000, 1_000_000]
        restart = None if (args.quick or args.no_restart) else 1_000_000
        memory_results = memory.run(sizes, restart, data_dir, log=progress)
    results = report.build_results(
        prepared=prepared, measurements=measurements, contenders=contenders,
        memory=memory_results, scaling=scaling_results, daemon=daemon_info,
        ingest=staging_results, paired=paired_results,
        settings={"runs": settings.runs, "cold_budget_s": settings.cold_budget_s,
                  "warm_budget_s": settings.warm_budget_s,
                  "fio_runtime_s": settings.fio_runtime_s, "caches": caches,
                  "scaling_window_s": None if args.no_scaling else scaling_window_s,
                  "reader_threads": args.reader_threads, "daemon_args": daemon_args},
        cache_method=cache_control.method, quick=args.quick, data_dir=data_dir, repo=REPO,
        elapsed_s=time.monotonic() - started)
    # A run of the staging rows alone does not overwrite a full run's results, nor does
    # a quick run (its files end in -quick, as bench.cluster's do).
    stem = ("results" if reads else "ingest") + ("-quick" if args.quick else "")
    paths = report.write(results, args.out, stem)
    print(report.markdown(results))
    progress(f"bench: wrote {', '.join(paths.values())} in {time.monotonic() - started:.0f} s")
    return _separate(args, wanted)


def _separate(args: argparse.Namespace, wanted: set[str]) -> int:
    """The benchmarks with results files of their own that `wanted` names."""
    return max(run_dlio(args) if DLIO in wanted else 0,
               run_cluster(args) if CLUSTER in wanted else 0,
               run_dataloader(args) if DATALOADER in wanted else 0,
               run_checkpoint(args) if CHECKPOINT in wanted else 0)


def run_checkpoint(args: argparse.Namespace) -> int:
    """The checkpoint rows (bench.checkpoint_bench) with this run's --quick and --out."""
    return checkpoint_bench.main((["--quick"] if args.quick else []) + ["--out", args.out])


def run_reads(args, prepared, data_dir, daemon_args, daemon_info, settings, caches,
              cache_control, scaling_window_s, progress):
    """The read rows, the paired runs and the scaling experiment: (measurements,
    contenders, scaling, paired)."""
    measurements = []
    scaling_results = paired_results = None
    with processes.daemon(os.path.join(data_dir, "dlfs"), os.path.join(data_dir, "daemon.log"),
                          daemon_args) as daemon:
        daemon_info["rss_start_kib"] = proc_status_kib(daemon.pid, "VmRSS")
        daemon_info["startup_s"] = daemon.startup_s
        fuse_reason = fuse_unavailable()
        fuse_reason = fuse_reason and f"not available: {fuse_reason}"
        mountpoint = os.path.join(data_dir, "mnt")
        fuse = None
        if not fuse_reason:
            try:
                fuse = MountProcess(daemon.address, mountpoint,
                                    os.path.join(data_dir, "fuse.log")).start()
            except Exception as exc:  # noqa: BLE001 - the FUSE rows say why
                first_line = str(exc).splitlines()[0]  # the rest quotes fuse.log
                fuse, fuse_reason = None, f"not available: mount failed: {first_line}"
        try:
            env = BenchEnv(daemon_address=daemon.address, daemon_pid=daemon.pid,
                           o_direct_cold=not cache_control.root,
                           fio_runtime_s=settings.fio_runtime_s,
                           fuse_mountpoint=mountpoint if fuse else None, fuse_reason=fuse_reason,
                           fuse_pid=fuse.pid if fuse else 0)
            contenders = all_contenders(env)
            if args.contenders:
                keep = set(args.contenders.split(",")) | {report.BASELINE}
                contenders = [c for c in contenders if c.key in keep]
            by_key = {c.key: c for c in contenders}
            for p in prepared:
                measurements += runner.run_workload(p, contenders, caches, settings,
                                                    cache_control, progress)
                if p.workload.name == PAIRED_WORKLOAD and "warm" in caches \
                        and set(PAIRED_KEYS) <= by_key.keys():
                    paired_results = paired.run_paired(
                        p, *(by_key[k] for k in PAIRED_KEYS), settings, cache_control,
                        pairs=3 if args.quick else paired.PAIRS, progress=progress)
                daemon_info[f"rss_after_{p.workload.name}_kib"] = proc_status_kib(daemon.pid, "VmRSS")
            if not args.no_scaling:
                scaling_results = run_scaling(prepared, daemon, settings.runs, scaling_window_s,
                                              progress, args.scaling_clients)
            daemon_info["hwm_end_kib"] = proc_status_kib(daemon.pid, "VmHWM")
        finally:
            if fuse is not None:
                fuse.unmount()
    return measurements, contenders, scaling_results, paired_results


def run_dlio(args: argparse.Namespace) -> int:
    """The DLIO benchmark (bench.dlio_mount) with this run's --quick and --out."""
    return dlio_mount.main((["--quick"] if args.quick else []) + ["--out", args.out])


def run_dataloader(args: argparse.Namespace) -> int:
    """The README's DataLoader against ext4 (bench.train_bench --first-example) into
    --out's dataloader.{md,json} (dataloader-quick.* with --quick)."""
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "dataloader" + ("-quick" if args.quick else ""))
    data_dir = os.path.abspath(args.data_dir or (QUICK_DATA_DIR if args.quick else DATA_DIR))
    status = train_bench.main(["--first-example", "--out", f"{stem}.json", "--data-dir",
                               os.path.join(data_dir, DATALOADER)]
                              + (["--quick"] if args.quick else []))
    if status == 0:
        with open(f"{stem}.json") as f:
            text = json.load(f)["markdown"]
        with open(f"{stem}.md", "w") as f:
            f.write(text + "\n")
    return status


def run_cluster(args: argparse.Namespace) -> int:
    """The many-daemons benchmark (bench.cluster) with this run's --quick and --out."""
    return cluster.main((["--quick"] if args.quick else []) + ["--out", args.out])


def run_scaling(prepared: list, daemon, runs: int, window_s: float, progress,
                clients: str = "") -> dict:
    """The scaling experiment on the 110k workload, or why it did not run."""
    workload = next((p for p in prepared if p.workload.name == scaling.WORKLOAD), None)
    if workload is None:
        return {"skipped": f"needs the {scaling.WORKLOAD} workload (--workloads)"}
    try:
        return scaling.run(workload, daemon.address, daemon.pid, runs=runs, duration_s=window_s,
                           counts=scaling.client_counts(len(os.sched_getaffinity(0)), clients),
                           log=progress)
    except Exception as exc:  # noqa: BLE001 - reported in the results, the run goes on
        logging.getLogger("bench").exception("scaling experiment failed")
        return {"skipped": f"failed: {type(exc).__name__}: {exc}"[:300]}


if __name__ == "__main__":
    sys.exit(main())
