"""The commands that show what daemons hold: `datasets`, `ls`, `stat`, `cat`, `status`.

Each prints lines for people, or with --json one JSON document for scripts
(`cat` writes the sample's bytes either way).  JSON keys are the same for
every item of a kind, null where a field does not apply (a directory's
size, a file's entry count).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import shlex
import sys

from dlfs.cli.target import target_options
from dlfs.client import Client
from dlfs.coord.cluster_keys import MemberRecord
from dlfs.errors import DlfsError, InvalidArgument
from dlfs.paths import split_dataset_path
from dlfs.staging.progress import human_bytes
from dlfs.types import DaemonStatus, DatasetInfo, Entry
from dlfs.units import counted


def add_commands(command) -> None:
    command("datasets", "list the datasets, with their size and state", run_datasets,
            description="List the datasets of the daemons: samples, size, warm-up state, and "
            "ingests that are running, prepared or parked.", json_output=True)
    p = command("ls", "list a directory of a dataset", run_ls, json_output=True,
                description="List NAME's root or a directory DIR in it (a file: that file).")
    p.add_argument("target", metavar="NAME[/DIR]")
    p.add_argument("-l", dest="long", action="store_true",
                   help="long format: mode, size, mtime, as `ls -l` shows them through the "
                        "mount (a directory's entries: `dlfs stat` or --json)")
    p = command("stat", "show a file's or directory's metadata", run_stat, json_output=True,
                description="Show the metadata of NAME/PATH: type, size, sample id, CRC32C, "
                "mode, mtime.")
    p.add_argument("target", metavar="NAME/PATH")
    p = command("cat", "write a sample's bytes to stdout", run_cat)
    p.add_argument("target", metavar="NAME/PATH")
    command("status", "the daemons' health and counters", run_status, json_output=True,
            description="Show each daemon's uptime, version, data, reads served, errors and "
            "where its metrics are served (a cluster: first the members etcd lists); exit 1 "
            "if any daemon is down.")


def print_json(value) -> None:
    json.dump(value, sys.stdout, indent=2)
    sys.stdout.write("\n")


# --- datasets ---------------------------------------------------------------------------

def run_datasets(client: Client, args) -> int:
    infos = client.dataset_infos()
    warm = {info.name: _warm_summary(client, info.name) for info in infos
            if info.sealed and info.kind == "dataset"}
    if args.json:
        print_json([_dataset_json(info, warm.get(info.name)) for info in infos])
        return 0
    for info in infos:
        if info.kind == "space":
            print(f"{info.name}\t{counted(info.samples, 'file')}\t{human_bytes(info.bytes)}  "
                  "(checkpoint space)")
            continue
        state = _warm_text(warm.get(info.name)) if info.sealed else \
            _unsealed_text(args, info)
        print(f"{info.name}\t{counted(info.samples, 'sample')}\t{human_bytes(info.bytes)}{state}")
        if info.disagreement:
            print(f"  warning: {info.disagreement}")
    return 0


def _unsealed_text(args, info: DatasetInfo) -> str:
    if info.ingest_state == "parked":
        discard = shlex.join(["dlfs", *target_options(args), "discard", info.name])
        return ("  (ingest broke off: run the same `dlfs ingest` with --resume to continue it, "
                f"or `{discard}` to end it)")
    if info.ingest_state == "prepared":
        return "  (ingest prepared, waiting for its commit)"
    return "  (ingest in progress)"


def _warm_summary(client: Client, name: str) -> dict | None:
    """The daemons' latest warm-up of `name` as {states, bytes_warmed, bytes_total,
    bytes_resident (in their page caches now)}; None when there was none (or the
    daemons do not warm)."""
    try:
        infos = [i for i in client.warm_status(name) if i.state != "none"]
    except DlfsError:  # a daemon without warm-ups: nothing to show
        return None
    if not infos:
        return None
    return {"states": sorted({i.state for i in infos}),
            "bytes_warmed": sum(i.bytes_warmed for i in infos),
            "bytes_total": sum(i.bytes_total for i in infos),
            "bytes_resident": sum(i.bytes_resident for i in infos)}


def _warm_text(warm: dict | None) -> str:
    """"  (warm, 100% cached now)", "  (warming 40%, 38% cached now)", ... from
    `_warm_summary`: the warm-up's state, and what the page cache holds now (the kernel
    may have evicted what was warmed); "" if none."""
    if warm is None:
        return ""
    total = max(warm["bytes_total"], 1)
    share = (f" {100 * warm['bytes_warmed'] // total}%" if warm["states"] != ["warm"] else "")
    return (f"  ({'/'.join(warm['states'])}{share}, "
            f"{100 * warm['bytes_resident'] // total}% cached now)")


def cached_text(resident: int, total: int) -> str:
    """"0 B (0%) of it cached now": what of a dataset's `total` bytes the page cache
    holds now."""
    return f"{human_bytes(resident)} ({100 * resident // max(total, 1)}%) of it cached now"


def _dataset_json(info: DatasetInfo, warm: dict | None) -> dict:
    return {"name": info.name, "kind": info.kind, "samples": info.samples, "bytes": info.bytes,
            "sealed": info.sealed, "state": "sealed" if info.sealed else info.ingest_state,
            "generation": info.generation, "created_ns": info.created_ns,
            "members": list(info.members), "replicas": info.replicas, "warm": warm,
            "disagreement": info.disagreement or None}


# --- ls, stat, cat ----------------------------------------------------------------------

def _mtime(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M")


def entry_json(dataset: str, e: Entry) -> dict:
    """One file or directory for --json."""
    return {"dataset": dataset, "path": e.path, "name": e.name,
            "type": "directory" if e.is_dir else "file",
            "size": None if e.is_dir else e.size, "entries": e.children if e.is_dir else None,
            "id": None if e.is_dir else e.id,
            "crc32c": None if e.is_dir else f"{e.crc32c:08x}",
            "mode": e.mode, "permissions": e.permissions, "mtime_ns": e.mtime_ns}


def run_ls(client: Client, args) -> int:
    dataset, path = split_dataset_path(args.target)
    entry = client.stat(dataset, path)
    entries = [entry] if not entry.is_dir else client.listdir(dataset, path)
    if args.json:
        print_json([entry_json(dataset, e) for e in entries])
        return 0
    for e in entries:
        name = e.name + ("/" if e.is_dir else "")
        if args.long:
            print(f"{e.permissions} {e.size:>12} {_mtime(e.mtime_ns)} {name}")
        else:
            print(name)
    return 0


def run_stat(client: Client, args) -> int:
    dataset, path = split_dataset_path(args.target)
    e = client.stat(dataset, path)
    if args.json:
        print_json(entry_json(dataset, e))
        return 0
    print(f"  path: {dataset}/{e.path}")
    print(f"  type: {'directory' if e.is_dir else 'file'}")
    if e.is_dir:
        print(f"  entries: {e.children}")
    else:
        print(f"  size: {e.size}")
        print(f"  version: {e.version:x}" if e.version else f"  id: {e.id}")
        print(f"  crc32c: {e.crc32c:08x}")
    print(f"  mode: {e.permissions} ({e.mode & 0o7777:04o})")
    print(f"  mtime: {datetime.datetime.fromtimestamp(e.mtime_ns / 1e9).isoformat()}")
    return 0


def run_cat(client: Client, args) -> int:
    dataset, path = split_dataset_path(args.target)
    if not path:
        raise InvalidArgument(f"{args.target!r} names a dataset; give NAME/PATH of a sample")
    if client.dataset(dataset).info.kind == "space":  # its closed version, piece by piece
        space = client.space(dataset)
        entry = space.stat(path)
        for offset in range(0, entry.size, CAT_PIECE_BYTES):
            sys.stdout.buffer.write(space.read(path, offset, CAT_PIECE_BYTES, entry=entry))
    else:
        sys.stdout.buffer.write(client.get_batch([path], dataset=dataset)[0])
    sys.stdout.buffer.flush()
    return 0


CAT_PIECE_BYTES = 16 << 20  # what `dlfs cat` of a checkpoint file holds in memory at once


# --- status -----------------------------------------------------------------------------

def run_status(client: Client, args) -> int:
    """One daemon: its status.  A cluster: each member etcd lists (its lease is alive),
    then each one's status; exit 1 if a daemon is down or no member is listed."""
    members = {member.address: member for member in client.members()}
    results = client.statuses()
    failures = sum(isinstance(result, DlfsError) for result in results.values())
    if args.etcd and not members:
        failures += 1
    if args.json:
        print_json([_status_json(address, result, members.get(address))
                    for address, result in results.items()])
        return 1 if failures else 0
    for member in members.values():
        print(f"member {member.address}: {member.state}, dlfs {member.version}, data port "
              f"{member.data_port or 'none'}, {human_bytes(member.free_bytes)} free of "
              f"{human_bytes(member.capacity_bytes)} at start")
    if args.etcd and not members:
        print(f"no member of cluster {args.cluster!r} holds a lease in etcd {args.etcd}: "
              f"start the daemons with --etcd {args.etcd} --cluster {args.cluster}")
    for address, result in results.items():
        if isinstance(result, DlfsError):
            print(f"daemon {address}: DOWN ({type(result).__name__}: {result.message})")
        else:
            print_status(result)
    return 1 if failures else 0


def _status_json(address: str, result: DaemonStatus | DlfsError,
                 member: MemberRecord | None) -> dict:
    """A daemon's status for --json; `member`: its record in etcd (null for one daemon
    on its own)."""
    registered = dataclasses.asdict(member) if member is not None else None
    if isinstance(result, DlfsError):
        return {"address": address, "up": False, "member": registered,
                "error": {"type": type(result).__name__, "message": result.message}}
    return {**dataclasses.asdict(result), "address": address, "up": True,
            "member": registered, "metrics_url": f"http://{result.metrics_address}/metrics"
            if result.metrics_address else None}


def print_status(st: DaemonStatus) -> None:
    """A daemon's status for people: one topic per line, every line whole."""
    probed = st.cache_hit_ranges + st.cache_miss_ranges
    hit_rate = f"{100 * st.cache_hit_ranges / probed:.0f}%" if probed else "n/a"
    errors = ", ".join(f"{code} {n}" for code, n in sorted(st.errors.items())) or "none"
    print(f"daemon {st.address}: up {datetime.timedelta(seconds=int(st.uptime_s))}, "
          f"dlfs {st.version}")
    print(f"  data dir: {st.data_dir} (catalog {human_bytes(st.catalog_bytes)})")
    print(f"  datasets: {st.datasets}, {st.samples} samples, {human_bytes(st.bytes)}"
          f"{f', {st.ingests_running} ingest(s) running' if st.ingests_running else ''}")
    print(f"  served: {st.batches_served} reads, {st.samples_served} samples, "
          f"{human_bytes(st.bytes_served)}; page-cache hits {hit_rate} of probed ranges")
    print(f"  calls in flight: {st.rpcs_in_flight}; data connections: {st.data_connections}; "
          f"errors: {errors}")
    for w in st.data_workers:  # the figures above include theirs
        print(f"  data path worker {w.index}: {w.state}, pid {w.pid}, {w.connections} "
              f"connections, {w.requests} requests, {human_bytes(w.bytes_served)}, "
              f"{w.cpu_s:.1f} CPU-s{f', restarted {w.restarts}x' if w.restarts else ''}")
    sent = f"; {human_bytes(st.sendfile_bytes)} sent so far" if st.sendfile_bytes else ""
    print(f"  sendfile from the page cache: {st.sendfile}{sent}")
    if st.mapped_sends:
        sent = f"; {human_bytes(st.mapped_send_bytes)} sent so far" if st.mapped_send_bytes else ""
        print(f"  cached samples sent from mapped extents: {st.mapped_sends}{sent}")
    metrics = (f"http://{st.metrics_address}/metrics" if st.metrics_address
               else "not served (dlfs-server --metrics-listen [HOST:]PORT serves them)")
    print(f"  metrics: {metrics}")
