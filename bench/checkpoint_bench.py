"""Checkpoints: the same state saved and restored through DLFS and ext4, same disk, one run.

    python -m bench.checkpoint_bench [--quick] [--out bench/results]
    ./dev bench --workloads checkpoint

Every row saves (then restores) the same training state: `PROCESSES`
processes, each a dict of float32 tensors of `STATE_BYTES / PROCESSES` in
all (16 MiB each, plus small ones), started together at a barrier.

Writes, each timed from the barrier until every process's file is durable:
- `ext4 torch.save + fsync` (the baseline): `torch.save` into a file of a
  directory on the data dir's file system, then `fsync` and close;
- `dlfs client torch.save`: `torch.save` into `Space.open(path, "wb")`,
  whose close returns once the file is durable and visible (the data path);
- `dlfs mount torch.save + fsync`: the baseline's code, unmodified, into a
  directory of the space through a whole-daemon `dlfs-mount`;
- `fio seq write`: the device's limit, `fio --rw=write --bs=4M --direct=1
  --end_fsync=1`, one job per process, the same bytes.

Restores, cold (the page cache dropped first, and checked to be cold on
the daemon's side: no extent page of the files is cached):
- `ext4 torch.load cold` (the baseline), `dlfs client torch.load cold`
  (`torch.load(Space.open(path, "rb"))`), `dlfs mount torch.load cold` (the
  baseline's code through the mount), `fio seq read` (the limit).

torch.distributed.checkpoint (bench.dcp_ckpt, the same bytes and processes):
`dlfs DCP writer` (DLFSWriter) and `DCP FileSystemWriter through the mount`
against `DCP FileSystemWriter on ext4` (fsync of every file), their cold
loads (DLFSReader and FileSystemReader through the mount against
FileSystemReader on ext4), and how long `dcp.async_save` blocks the caller.

Also: the daemon's CPU-seconds (its main process and data path workers)
per GB written.  Ratios are against the ext4 row of the same run; targets
are in issue 53 ("Done means").  Writes `checkpoint.{md,json}`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import subprocess
import tempfile
import time

from bench import dcp_ckpt, processes
from bench.measure import CacheControl, git_info, process_tree_cpu_s
from dlfs.tools.launch import MountProcess

MiB = 1 << 20
PROCESSES = 2
TENSOR_BYTES = 16 * MiB
SPACE = "ckpt-bench"


def make_state(total_bytes: int, rank: int) -> dict:
    """A model-and-optimizer-like dict of tensors of about `total_bytes`."""
    import torch

    generator = torch.Generator().manual_seed(rank)
    count = max(1, total_bytes // TENSOR_BYTES)
    per = min(total_bytes, TENSOR_BYTES) // 4
    return {"model": {f"layer{i}.weight": torch.randn(per, generator=generator)
                      for i in range(count)},
            "step": 1000 + rank, "rng": torch.randn(16, generator=generator)}


def _prepared(kind: str, where: str, rank: int, total_bytes: int):
    """What one process does once the barrier opens (imports, the state, a client made
    before: a training job has them already)."""
    import torch

    if kind.startswith("save"):
        state = make_state(total_bytes, rank)
    if kind.endswith("dlfs"):
        from dlfs import Client

        space = Client(where).space(SPACE)
    path = os.path.join(where, f"rank{rank}.pt")
    name = f"step/rank{rank}.pt"

    def save_ext4() -> None:
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())

    def save_dlfs() -> None:
        with space.open(name, "wb") as f:  # durable and visible when close returns
            torch.save(state, f)

    def load_ext4() -> None:
        torch.load(path, weights_only=True)

    def load_dlfs() -> None:
        torch.load(space.open(name, "rb"), weights_only=True)

    return {"save_ext4": save_ext4, "save_dlfs": save_dlfs, "load_ext4": load_ext4,
            "load_dlfs": load_dlfs}[kind]


def _worker(kind: str, where: str, rank: int, total_bytes: int, barrier, done) -> None:
    step = _prepared(kind, where, rank, total_bytes)
    barrier.wait()
    step()
    done.put((rank, time.perf_counter()))


def timed(kind: str, where: str, total_bytes: int) -> float:
    """Seconds from the barrier until every process finished `kind`."""
    context = multiprocessing.get_context("spawn")
    barrier, done = context.Barrier(PROCESSES + 1), context.Queue()
    workers = [context.Process(target=_worker, args=(kind, where, rank,
                                                     total_bytes // PROCESSES, barrier, done))
               for rank in range(PROCESSES)]
    for worker in workers:
        worker.start()
    barrier.wait(300)
    started = time.perf_counter()
    ends = [done.get(timeout=600)[1] for _ in workers]
    for worker in workers:
        worker.join(60)
        if worker.exitcode != 0:
            raise RuntimeError(f"{kind} failed in a worker (exit {worker.exitcode})")
    return max(ends) - started


def fio(mode: str, directory: str, total_bytes: int) -> float | None:
    """fio's sequential `mode` ("write" or "read") bandwidth over the same bytes, GB/s."""
    if shutil.which("fio") is None:
        return None
    per_job = max(4 * MiB, total_bytes // PROCESSES)
    command = ["fio", "--name=ckpt", f"--directory={directory}", f"--rw={mode}", "--bs=4M",
               "--direct=1", "--ioengine=psync", f"--size={per_job}",
               f"--numjobs={PROCESSES}", "--group_reporting", "--output-format=json"]
    if mode == "write":
        command.append("--end_fsync=1")
    result = json.loads(subprocess.run(command, check=True, capture_output=True,
                                       text=True).stdout)
    job = result["jobs"][0][mode]
    return job["bw_bytes"] / 1e9


def run(total_bytes: int, workdir: str, log=print) -> dict:
    cache = CacheControl()
    ext4_dir = os.path.join(workdir, "ext4")
    os.makedirs(ext4_dir)
    daemon = processes.daemon(os.path.join(workdir, "data"), os.path.join(workdir, "d.log"))
    rows: dict[str, float | None] = {}
    with daemon:
        from dlfs import Client

        with Client(daemon.address) as client:
            client.create_space(SPACE).mkdir("step")
        log("checkpoint: ext4 torch.save + fsync")
        rows["ext4 torch.save + fsync"] = timed("save_ext4", ext4_dir, total_bytes)
        log("checkpoint: dlfs client torch.save")
        cpu_before = process_tree_cpu_s(daemon.pid)
        rows["dlfs client torch.save"] = timed("save_dlfs", daemon.address, total_bytes)
        daemon_cpu_s = process_tree_cpu_s(daemon.pid) - cpu_before
        mount = MountProcess(daemon.address, os.path.join(workdir, "mnt"),
                             os.path.join(workdir, "mount.log")).start()
        try:
            mounted = os.path.join(mount.mountpoint, SPACE, "mounted")
            os.makedirs(mounted)
            log("checkpoint: dlfs mount torch.save + fsync")
            rows["dlfs mount torch.save + fsync"] = timed("save_ext4", mounted, total_bytes)
            log("checkpoint: fio sequential write")
            fio_dir = os.path.join(workdir, "fio")
            os.makedirs(fio_dir)
            write_limit = fio("write", fio_dir, total_bytes)
            ext4_files = [os.path.join(ext4_dir, n) for n in os.listdir(ext4_dir)]
            log("checkpoint: cold restores")
            cache.make_cold(ext4_files)
            rows["ext4 torch.load cold"] = timed("load_ext4", ext4_dir, total_bytes)
            extents = [os.path.join(root, name)
                       for root, _, names in os.walk(os.path.join(workdir, "data", "extents"))
                       for name in names]
            cache.make_cold(extents, extents)
            rows["dlfs client torch.load cold"] = timed("load_dlfs", daemon.address, total_bytes)
            cache.make_cold(extents, extents)
            rows["dlfs mount torch.load cold"] = timed("load_ext4", mounted, total_bytes)
            cache.make_cold(ext4_files)
            read_limit = fio("read", fio_dir, total_bytes)
            log("checkpoint: torch.distributed.checkpoint")
            repeats = 1 if total_bytes < 256 * MiB else dcp_ckpt.REPEATS
            dcp = dcp_ckpt.run(daemon.address, os.path.join(workdir, "dcp"), total_bytes, PROCESSES,
                               repeats=repeats)
            log("checkpoint: DCP's FileSystemWriter through the mount")
            through = dcp_ckpt.run(daemon.address, os.path.join(mount.mountpoint, SPACE, "dcp"),
                                   total_bytes, PROCESSES, repeats=repeats)
        finally:
            mount.unmount()
    rows["DCP FileSystemWriter on ext4"] = dcp["fs_save_s"]
    rows["dlfs DCP writer"] = dcp["native_save_s"]
    rows["DCP FileSystemReader cold"] = dcp["fs_load_cold_s"]
    rows["dlfs DCP reader cold"] = dcp["native_load_cold_s"]
    rows["DCP FileSystemWriter through the mount"] = through["fs_save_s"]
    rows["DCP FileSystemReader through the mount cold"] = through["fs_load_cold_s"]
    gb = total_bytes / 1e9
    return {"bytes": total_bytes, "processes": PROCESSES, "seconds": rows, "dcp": dcp,
            "gb_per_s": {k: gb / v for k, v in rows.items() if v},
            "fio_write_gb_per_s": write_limit, "fio_read_gb_per_s": read_limit,
            "daemon_cpu_s_per_gb_written": daemon_cpu_s / gb}


def report(result: dict) -> list[str]:
    rates = result["gb_per_s"]
    bases = {"torch": (rates["ext4 torch.save + fsync"], rates["ext4 torch.load cold"]),
             "DCP": (rates["DCP FileSystemWriter on ext4"], rates["DCP FileSystemReader cold"])}
    base_write, base_read = bases["torch"]
    lines = [f"# Checkpoints ({platform.node()}, {os.cpu_count()} CPUs)", "",
             f"{result['processes']} processes save (then restore) "
             f"{result['bytes'] / MiB:,.0f} MiB of tensors in all, on the data dir's disk.",
             "", "| row | GB/s | x ext4 |", "| --- | ---: | ---: |"]
    for name, rate in rates.items():
        write, read = bases["DCP" if "DCP" in name else "torch"]
        base = read if ("load" in name or "Reader" in name or "reader" in name) else write
        lines.append(f"| {name} | {rate:.3f} | {rate / base:.2f} |")
    for name, key, base in (("fio seq write (the device's limit)", "fio_write_gb_per_s",
                             base_write),
                            ("fio seq read (the device's limit)", "fio_read_gb_per_s",
                             base_read)):
        value = result[key]
        lines.append(f"| {name} | {value:.3f} | {value / base:.2f} |" if value else
                     f"| {name} | not available (no fio) | |")
    dcp = result["dcp"]
    lines += ["", f"`dcp.async_save` blocks the caller {dcp['native_async_block_s'] * 1e3:.0f} ms "
              f"with DLFSWriter, {dcp['fs_async_block_s'] * 1e3:.0f} ms with FileSystemWriter "
              f"({dcp['native_async_block_s'] / dcp['fs_async_block_s']:.2f}x); until its "
              f"future is done {dcp['native_async_total_s']:.2f} s against "
              f"{dcp['fs_async_total_s']:.2f} s.",
              "", f"The daemon's CPU-s per GB written (torch.save rows): "
              f"{result['daemon_cpu_s_per_gb_written']:.2f}."]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.checkpoint_bench",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (CI)")
    parser.add_argument("--bytes", type=int, default=0, help="state bytes in all")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args(argv)
    total = args.bytes or (64 * MiB if args.quick else 1024 * MiB)
    workdir = tempfile.mkdtemp(prefix="dlfs-ckpt-bench-", dir="/var/tmp")
    try:
        result = run(total, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result["git"] = git_info(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result["time"] = time.strftime("%Y-%m-%d %H:%M:%S")
    lines = report(result)
    print("\n".join(lines))
    stem = "checkpoint-quick" if args.quick else "checkpoint"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
