"""torch.distributed.checkpoint into a DLFS space (native) against DCP's own file system on ext4.

    python -m bench.dcp_ckpt [--size-mib 256] [--ranks 2] [--repeats 3] [--dir /var/tmp/dlfs-bench-dcp]

`run(daemon_address, tmpdir, size_bytes, ranks)` is the measurement (the
checkpoint section of `./dev bench` calls it with its own daemon); run as
a script it starts a daemon with its data dir in --dir, on the same disk
as the ext4 directory.  `ranks` processes (gloo on the CPU, spawned) hold
`size_bytes` of float32 tensors between them, each its own keys (a few
large matrices, some vectors and a BytesIO), and in one run, one after the
other:

- `native_save_s`: `dcp.save` with `DLFSWriter` into a space;
- `fs_save_s`: `dcp.save` with DCP's `FileSystemWriter` into `tmpdir` (its
  default fsync of every file; the same `thread_count`);
- `native_load_cold_s` / `fs_load_cold_s`: `dcp.load` of each after
  `sync; echo 3 > /proc/sys/vm/drop_caches` (as root; `cold` is false
  otherwise, and the loads were warm);
- `native_async_block_s` / `fs_async_block_s`: how long `dcp.async_save`
  (the thread executor) blocks the caller, and `*_async_total_s` until its
  future is done.

Every time is rank 0's, between barriers (so the slowest rank's); each
row is the median of `repeats` runs, the two contenders of a row taking
turns to go first.  Loads are checked against what was saved, outside the
timed part.  Each rank computes with one thread (`torch.set_num_threads(1)`,
what torchrun sets for several ranks per host).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import uuid

THREADS = 2  # files per rank at once, for both writers
REPEATS = 3
LARGE_TENSOR_BYTES = 16 << 20


def run(daemon_address: str, tmpdir: str, size_bytes: int, ranks: int,
        repeats: int = REPEATS) -> dict:
    """The figures above for `ranks` processes saving about `size_bytes` in all: each
    row's median of `repeats` runs (every run in "runs")."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.Queue()
    port = _free_port()
    tag = uuid.uuid4().hex[:8]
    processes = [context.Process(target=_rank_main, args=(
        rank, ranks, port, daemon_address, tmpdir, size_bytes // ranks, tag, repeats, results))
        for rank in range(ranks)]
    for p in processes:
        p.start()
    try:
        outcome = results.get(timeout=1800)
    finally:
        for p in processes:
            p.join(60)
            if p.is_alive():
                p.kill()
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _state_dict(rank: int, nbytes: int) -> dict:
    import torch

    generator = torch.Generator().manual_seed(rank)
    state, left, n = {}, nbytes, 0
    while left > 0:
        size = min(LARGE_TENSOR_BYTES if n % 4 else LARGE_TENSOR_BYTES // 64, left)
        state[f"r{rank}.layer{n}.weight"] = torch.rand(max(1, size // 4), generator=generator)
        left -= size
        n += 1
    state[f"r{rank}.extra"] = io.BytesIO(b"x" * 4096)
    return state


def _zeros_like(state: dict) -> dict:
    import torch

    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else io.BytesIO()
            for k, v in state.items()}


def _check_equal(got: dict, want: dict) -> None:
    import torch

    for key, value in want.items():
        same = torch.equal(got[key], value) if isinstance(value, torch.Tensor) else \
            got[key].getvalue() == value.getvalue()
        if not same:
            raise AssertionError(f"{key} came back different")


def _drop_caches(rank: int) -> None:
    if rank == 0 and os.geteuid() == 0:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")


def _rank_main(rank, world, port, address, tmpdir, nbytes, tag, repeats, results) -> None:
    try:
        figures = _measure(rank, world, port, address, tmpdir, nbytes, tag, repeats)
        if rank == 0:
            results.put(figures)
    except BaseException as error:  # rank 0's failure, or any rank's, reaches the caller
        results.put(RuntimeError(f"rank {rank}: {type(error).__name__}: {error}"))
        raise


def _measure(rank, world, port, address, tmpdir, nbytes, tag, repeats) -> dict:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from dlfs.torch.checkpoint import DLFSReader, DLFSWriter

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # as torchrun sets it for several ranks on one host
    dist.init_process_group("gloo", rank=rank, world_size=world)
    buffer = io.BytesIO()  # torch.save and torch.load's first-call costs, outside the rows
    torch.save(torch.zeros(4), buffer)
    torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    state = _state_dict(rank, nbytes)
    base = f"dlfs://{address}/bench-dcp/{tag}"
    on_disk = os.path.join(tmpdir, f"dcp-{tag}")
    writers = {"native": lambda name: DLFSWriter(f"{base}/{name}", thread_count=THREADS),
               "fs": lambda name: dcp.FileSystemWriter(os.path.join(on_disk, name),
                                                       thread_count=THREADS)}
    readers = {"native": lambda name: DLFSReader(f"{base}/{name}"),
               "fs": lambda name: dcp.FileSystemReader(os.path.join(on_disk, name))}
    runs: dict = {}

    def timed(row: str, call) -> None:
        dist.barrier()
        started = time.perf_counter()
        call()
        dist.barrier()
        runs.setdefault(row, []).append(time.perf_counter() - started)

    def load(key: str) -> None:
        out = _zeros_like(state)
        _drop_caches(rank)
        timed(f"{key}_load_cold_s", lambda: dcp.load(out, storage_reader=readers[key]("save0")))
        _check_equal(out, state)

    def async_save(key: str, name: str) -> None:
        dist.barrier()
        started = time.perf_counter()
        future = dcp.async_save(state, storage_writer=writers[key](name))
        blocked = time.perf_counter() - started
        future.result()
        dist.barrier()
        runs.setdefault(f"{key}_async_block_s", []).append(blocked)
        runs.setdefault(f"{key}_async_total_s", []).append(time.perf_counter() - started)

    try:
        for n in range(repeats):  # each pair of rows in both orders, alternately
            order = ("native", "fs") if n % 2 == 0 else ("fs", "native")
            for key in order:
                timed(f"{key}_save_s", lambda: dcp.save(state, storage_writer=writers[key](
                    f"save{n}")))
            for key in order:
                load(key)
            for key in order:
                async_save(key, f"async{n}")
        figures: dict = {row: statistics.median(times) for row, times in sorted(runs.items())}
        figures.update(ranks=world, threads=THREADS, repeats=repeats, cold=os.geteuid() == 0,
                       bytes=world * sum(v.nbytes for v in state.values()
                                         if hasattr(v, "nbytes")),
                       runs=runs)
        return figures
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(on_disk, ignore_errors=True)
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    from dlfs.tools.launch import DaemonProcess

    parser = argparse.ArgumentParser(prog="python -m bench.dcp_ckpt", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--dir", default="/var/tmp/dlfs-bench-dcp",
                        help="the daemon's data dir and the ext4 checkpoints go below it")
    args = parser.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    root = tempfile.mkdtemp(dir=args.dir)
    try:
        with DaemonProcess(os.path.join(root, "data"), os.path.join(root, "daemon.log")) as d:
            figures = run(d.address, root, args.size_mib << 20, args.ranks, args.repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    json.dump(figures, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
