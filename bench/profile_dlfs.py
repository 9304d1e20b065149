"""Profile DLFS get_batch: py-spy on the daemon, pyinstrument on the client.

    python -m bench.profile_dlfs --workload 4k --cache warm --seconds 20 --out /tmp/prof

Needs a full benchmark's generated data in --data-dir (run `python -m bench`
once) and `py-spy` / `pyinstrument` installed (neither is a dependency of
the benchmark itself).  Starts its own daemon on the DLFS data dir, reads
the workload's batch sequence in a loop for --seconds (cold: the page
cache is dropped every --cold-every batches, as root), and writes:

- `daemon-<workload>-<cache>.txt`  py-spy collapsed stacks of the daemon (all threads)
- `daemon-<workload>-<cache>-gil.txt`  the same, only samples holding the GIL
- `client-<workload>-<cache>.txt`  pyinstrument's text report of the client
- a summary of self and inclusive time per function on stdout
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import time

from bench import datagen, processes
from bench.measure import CacheControl


def top_functions(collapsed_path: str, limit: int = 25) -> str:
    """Self and inclusive share of samples per function from py-spy's raw (collapsed) output."""
    self_counts: collections.Counter = collections.Counter()
    incl_counts: collections.Counter = collections.Counter()
    total = 0
    with open(collapsed_path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            n = int(count)
            total += n
            frames = [_short(fr) for fr in stack.split(";")]
            if frames:
                self_counts[frames[-1]] += n
            for frame in set(frames):
                incl_counts[frame] += n
    if not total:
        return "(no samples)"
    lines = [f"{total} samples", "self%  incl%  function"]
    for name, n in self_counts.most_common(limit):
        lines.append(f"{100 * n / total:5.1f}  {100 * incl_counts[name] / total:5.1f}  {name}")
    lines.append("-- inclusive --")
    for name, n in incl_counts.most_common(limit):
        lines.append(f"{100 * self_counts[name] / total:5.1f}  {100 * n / total:5.1f}  {name}")
    return "\n".join(lines)


def _short(frame: str) -> str:
    # py-spy frames look like "function (path/to/file.py:line)"; keep function and file name.
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    filename = os.path.basename(where.rsplit(":", 1)[0]) if where else ""
    return f"{name} ({filename})" if filename else name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_dlfs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="/var/tmp/dlfs-bench")
    parser.add_argument("--workload", default="4k", choices=("4k", "110k", "140m"))
    parser.add_argument("--cache", default="warm", choices=("warm", "cold"))
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--cold-every", type=int, default=20,
                        help="cold: drop the page cache every this many batches")
    parser.add_argument("--in-flight", type=int, default=1)
    parser.add_argument("--no-verify", action="store_true", help="get_batch(verify=False)")
    parser.add_argument("--out", default="/tmp/dlfs-profile")
    parser.add_argument("--py-spy-arg", action="append", default=[], metavar="ARG",
                        help="extra py-spy record argument, e.g. --py-spy-arg=--native")
    args = parser.parse_args(argv)
    if shutil.which("py-spy") is None and not os.path.exists(
            os.path.join(os.path.dirname(sys.executable), "py-spy")):
        print("py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return 2
    py_spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    from pyinstrument import Profiler

    from dlfs import Client

    workload = next(w for w in datagen.full_workloads() if w.name == args.workload)
    prepared = datagen.prepare_all([workload], args.data_dir)[0]
    batches = datagen.batch_sequence(workload)
    os.makedirs(args.out, exist_ok=True)
    tag = f"{args.workload}-{args.cache}" + ("-noverify" if args.no_verify else "") + (
        f"-inflight{args.in_flight}" if args.in_flight > 1 else "")
    cache_control = CacheControl()
    with processes.daemon(prepared.dlfs_data_dir, os.path.join(args.out, "daemon.log")) as daemon:
        client = Client(daemon.address)
        dataset = client.dataset(prepared.dataset)
        verify = not args.no_verify
        for b in batches[:5]:
            dataset.get_batch(b, verify=verify)
        spies = [subprocess.Popen([py_spy, "record", "--pid", str(daemon.pid), "--format", "raw",
                                   "--rate", "200", "--duration", str(int(args.seconds)),
                                   "--nonblocking", *extra, *args.py_spy_arg, "-o",
                                   os.path.join(args.out, f"daemon-{tag}{suffix}.txt")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for extra, suffix in (([], ""), (["--gil"], "-gil"))]
        profiler = Profiler(interval=0.0005)
        samples = 0
        started = time.monotonic()
        profiler.start()
        i = 0
        if args.in_flight > 1:
            from concurrent.futures import ThreadPoolExecutor

            pool = ThreadPoolExecutor(args.in_flight)
        while time.monotonic() - started < args.seconds:
            if args.cache == "cold" and i % args.cold_every == 0:
                profiler.stop()
                cache_control.make_cold(prepared.extent_files())
                profiler.start()
            if args.in_flight > 1:
                group = [batches[(i + k) % len(batches)] for k in range(args.in_flight)]
                for out in pool.map(lambda b: dataset.get_batch(b, verify=verify), group):
                    samples += len(out)
                i += args.in_flight
            else:
                samples += len(dataset.get_batch(batches[i % len(batches)], verify=verify))
                i += 1
        profiler.stop()
        elapsed = time.monotonic() - started
        for spy in spies:
            spy.wait()
        client.close()
    with open(os.path.join(args.out, f"client-{tag}.txt"), "w") as f:
        f.write(profiler.output_text(unicode=False, color=False, show_all=False))
    print(f"{tag}: {samples / elapsed:,.0f} samples/s while profiled ({i} batches)")
    for suffix in ("", "-gil"):
        path = os.path.join(args.out, f"daemon-{tag}{suffix}.txt")
        print(f"\n== daemon {tag}{suffix} ==")
        print(top_functions(path) if os.path.exists(path) else "(py-spy wrote nothing)")
    print(f"\nclient profile: {os.path.join(args.out, f'client-{tag}.txt')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
