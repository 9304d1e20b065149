"""`dlfs`: the command-line client.

    dlfs [--server HOST:PORT | --etcd URL] ingest SOURCE [SOURCE...] NAME [--replace]
         [--replicas N] [--include-hidden] [--follow-symlinks] [--archives] [--readers N]
         [--resume] [--no-resumable] [--dry-run] [--progress auto|bar|log|none]
         [--via auto|datapath|grpc]
    dlfs [--server HOST:PORT] datasets
    dlfs [--server HOST:PORT] ls NAME[/DIR] [-l]
    dlfs [--server HOST:PORT] stat NAME/PATH
    dlfs [--server HOST:PORT] cat NAME/PATH
    dlfs [--server HOST:PORT] status
    dlfs [--server HOST:PORT] scrub NAME
    dlfs [--server HOST:PORT] rm NAME
    dlfs --etcd URL[,URL...] [--cluster NAME] rebalance NAME [--replicas N] [--members A,B]

`--server` (one daemon) defaults to $DLFS_SERVER, then 127.0.0.1:7010;
`--etcd` (a cluster of daemons, found in its etcd) to $DLFS_ETCD, and wins
when set.  Errors print one line on stderr and exit with status 1 (2 for
usage errors).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

from dlfs.client import Client
from dlfs.staging.duplicates import Duplicates
from dlfs.staging.progress import IngestStats, human_bytes
from dlfs.staging.read_pool import READERS_DEFAULT
from dlfs.staging.source_files import SKIP_KINDS
from dlfs.staging.source_set import SourceSet, open_sources
from dlfs.errors import DlfsError, InvalidArgument
from dlfs.paths import split_dataset_path

DEFAULT_SERVER = "127.0.0.1:7010"


def _mtime(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M")


def cmd_ingest(client: Client, args) -> int:
    if len(args.paths) < 2:
        raise InvalidArgument("give at least one SOURCE and the dataset NAME")
    *paths, name = args.paths
    sources = open_sources(paths, archives=args.archives, include_hidden=args.include_hidden,
                           follow_symlinks=args.follow_symlinks)
    if args.dry_run:
        return _dry_run(sources, name)
    stats = IngestStats()
    info = client.upload(sources, name, replace=args.replace, replicas=args.replicas,
                         readers=args.readers, resumable=not args.no_resumable,
                         resume=args.resume, progress=None if args.progress == "auto"
                         else args.progress, via=args.via, stats=stats)
    print(f"ingested {info.name}: {info.samples} samples, {info.bytes} bytes "
          f"({human_bytes(info.bytes)})")
    print(stats.rate_line())
    notes = sources.skipped().summary()
    if notes:
        print(f"skipped: {notes}")
    return 0


def _dry_run(sources: SourceSet, name: str) -> int:
    """List what an ingest of `sources` would take and skip, without a daemon."""
    sources.scan()
    duplicates = Duplicates() if sources.needs_duplicate_check else None
    files = total = 0
    out = sys.stdout
    for file in sources.entries():
        if duplicates is not None:
            duplicates.check(file)
        files += 1
        total += file.size
        out.write(f"take\t{file.path}\t{file.size}\n")
    skipped = sources.skipped()
    for entry in skipped.entries:
        detail = f"\t{entry.detail}" if entry.detail else ""
        out.write(f"skip\t{entry.kind}\t{entry.where}{detail}\n")
    listed = len(skipped.entries)
    hidden = sum(skipped.counts.values()) - listed
    if hidden > 0:
        out.write(f"skip\t...\t{hidden} more not listed\n")
    kinds = {"tree": 0, "tar": 0}
    for source in sources.sources:
        kinds[source.kind] += 1
    origin = ", ".join(f"{n} {'tree' if kind == 'tree' else 'archive'}{'s' if n != 1 else ''}"
                       for kind, n in kinds.items() if n)
    counts = ", ".join(f"{skipped.counts[kind]} {label}" for kind, label in SKIP_KINDS.items())
    print(f"would ingest {name}: {files} files, {total} bytes ({human_bytes(total)}) from "
          f"{origin}; skipped: {counts}")
    return 0


def cmd_datasets(client: Client, args) -> int:
    for info in client.dataset_infos():
        state = "" if info.sealed else _INGEST_STATES.get(info.ingest_state,
                                                          "  (ingest in progress)")
        if info.sealed:
            state = _warm_state(client, info.name)
        print(f"{info.name}\t{info.samples} samples\t{human_bytes(info.bytes)}{state}")
        if info.disagreement:
            print(f"  warning: {info.disagreement}")
    return 0


def _warm_state(client: Client, name: str) -> str:
    """"  (warm)", "  (warming 40%)", ... from the daemons' latest warm-up; "" if none."""
    try:
        infos = [i for i in client.warm_status(name) if i.state != "none"]
    except DlfsError:  # a daemon without warm-ups: nothing to show
        return ""
    if not infos:
        return ""
    warmed, total = sum(i.bytes_warmed for i in infos), sum(i.bytes_total for i in infos)
    states = sorted({i.state for i in infos})
    share = f" {100 * warmed // max(total, 1)}%" if states != ["warm"] else ""
    return f"  ({'/'.join(states)}{share})"


def cmd_warm(client: Client, args) -> int:
    if args.status:
        infos = client.warm_status(args.name)
    else:
        infos = client.warm(args.name, wait=not args.no_wait)
    for info in infos:
        where = f" on {info.address}" if len(infos) > 1 else ""
        print(f"{info.dataset}{where}: {info.state}, {human_bytes(info.bytes_warmed)} of "
              f"{human_bytes(info.bytes_total)} read into the page cache (budget "
              f"{human_bytes(info.budget_bytes)})")
        if info.message:
            print(f"  {info.message}")
    return 0 if all(info.state in ("warm", "queued", "warming", "none") for info in infos) \
        else 1
_INGEST_STATES = {
    "parked": "  (ingest broke off: `dlfs ingest --resume` continues it, `dlfs rm` discards it)",
    "prepared": "  (ingest prepared, waiting for its commit)",
}


def cmd_ls(client: Client, args) -> int:
    dataset, path = split_dataset_path(args.target)
    entry = client.stat(dataset, path)
    entries = [entry] if not entry.is_dir else client.listdir(dataset, path)
    for e in entries:
        name = e.name + ("/" if e.is_dir else "")
        if args.long:
            size = e.children if e.is_dir else e.size
            print(f"{e.permissions} {size:>12} {_mtime(e.mtime_ns)} {name}")
        else:
            print(name)
    return 0


def cmd_stat(client: Client, args) -> int:
    dataset, path = split_dataset_path(args.target)
    e = client.stat(dataset, path)
    print(f"  path: {dataset}/{e.path}")
    print(f"  type: {'directory' if e.is_dir else 'file'}")
    if e.is_dir:
        print(f"  entries: {e.children}")
    else:
        print(f"  size: {e.size}")
        print(f"  id: {e.id}")
        print(f"  crc32c: {e.crc32c:08x}")
    print(f"  mode: {e.permissions} ({e.mode & 0o7777:04o})")
    print(f"  mtime: {datetime.datetime.fromtimestamp(e.mtime_ns / 1e9).isoformat()}")
    return 0


def cmd_cat(client: Client, args) -> int:
    dataset, path = split_dataset_path(args.target)
    if not path:
        raise InvalidArgument(f"{args.target!r} names a dataset; give NAME/PATH of a sample")
    sample = client.get_batch([path], dataset=dataset)[0]
    sys.stdout.buffer.write(sample)
    sys.stdout.buffer.flush()
    return 0


def cmd_scrub(client: Client, args) -> int:
    report = client.scrub(args.name)
    for entry, reason in report.damaged:
        print(f"DAMAGED {args.name}/{entry.path}: {reason}")
    print(f"scrubbed {args.name}: {report.samples} samples, {human_bytes(report.bytes)}, "
          f"{len(report.damaged)} damaged")
    return 1 if report.damaged else 0


def cmd_status(client: Client, args) -> int:
    failures = 0
    members = client.members()
    for member in members:  # a cluster: who holds a lease in etcd
        print(f"member {member.address}: {member.state}, dlfs {member.version}, data port "
              f"{member.data_port or 'none'}, {human_bytes(member.free_bytes)} free of "
              f"{human_bytes(member.capacity_bytes)}")
    if client.options.get("etcd") and not members:
        print(f"no member holds a lease in {client.address}")
        failures += 1
    for address, result in client.statuses().items():
        if isinstance(result, DlfsError):
            print(f"daemon {address}: DOWN ({type(result).__name__}: {result.message})")
            failures += 1
        else:
            _print_status(result)
    return 1 if failures else 0


def _print_status(st) -> None:
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
    if st.sendfile:  # an older daemon does not say
        print(f"  sendfile from the page cache: {st.sendfile}"
              f"{f'; {human_bytes(st.sendfile_bytes)} sent so' if st.sendfile_bytes else ''}")
    print(f"  metrics: {'http://' + st.metrics_address + '/metrics' if st.metrics_address else 'not served (--metrics-listen)'}")


def cmd_rebalance(client: Client, args) -> int:
    members = [m.strip() for m in args.members.split(",") if m.strip()] if args.members else None
    report = client.rebalance(args.name, replicas=args.replicas, members=members,
                              source=args.source)
    print(f"rebalanced {report.dataset} onto {len(report.members)} daemons ({report.replicas}x): "
          f"{report.samples} samples; moved {report.copies_moved} copies "
          f"({human_bytes(report.bytes_moved)}), kept {report.copies_kept} in place")
    if report.removed_from:
        print(f"removed from {', '.join(report.removed_from)}")
    if report.not_removed:
        print(f"{', '.join(report.not_removed)} left the dataset but had not removed its copy "
              "yet: it does so when it reads etcd again", file=sys.stderr)
    return 0


def cmd_rm(client: Client, args) -> int:
    info = client.delete(args.name)
    print(f"removed {info.name}: {info.samples} samples, {human_bytes(info.bytes)} freed")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dlfs", description="DLFS command-line client")
    parser.add_argument("--server", default=None,
                        help="one daemon's address HOST:PORT (default: $DLFS_SERVER or "
                             f"{DEFAULT_SERVER})")
    parser.add_argument("--etcd", default=os.environ.get("DLFS_ETCD") or None,
                        metavar="URL[,URL...]",
                        help="a cluster of daemons: its etcd's client URLs, e.g. "
                             "http://10.0.0.1:2379 (default: $DLFS_ETCD); datasets are striped "
                             "over its live members")
    parser.add_argument("--cluster", default=os.environ.get("DLFS_CLUSTER") or "default",
                        help="the cluster's name in etcd (default: $DLFS_CLUSTER or "
                             "%(default)s)")
    parser.add_argument("--token", default=None,
                        help="token for a daemon started with --tokens-file (default: $DLFS_TOKEN)")
    parser.add_argument("--tls-ca", default=None, metavar="PEM",
                        help="CA of the daemon's TLS certificate; turns TLS on "
                             "(default: $DLFS_TLS_CA)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("ingest", help="upload directory trees or tar archives as a dataset",
                       description="Upload SOURCEs as dataset NAME.  A SOURCE is a directory "
                       "tree (its regular files become samples), a tar archive (plain, .gz, "
                       ".bz2, .xz; its members become samples, named by their paths in the "
                       "archive: WebDataset shards work as they are), or a glob of archives "
                       "in quotes ('shards/*.tar').  Several SOURCEs make one dataset.")
    p.add_argument("paths", nargs="+", metavar="SOURCE... NAME",
                   help="directories, archives or quoted globs, then the dataset name")
    p.add_argument("--replace", action="store_true", help="replace an existing dataset")
    p.add_argument("--archives", action="store_true",
                   help="a directory SOURCE holds archives (every *.tar, *.tar.gz, *.tgz, "
                        "*.tar.bz2, *.tar.xz in it, sorted) rather than being a tree")
    p.add_argument("--readers", type=int, default=READERS_DEFAULT,
                   help="files (or archives) read at once; raise it for sources with a high "
                        "latency per open, such as parallel file systems (default %(default)s)")
    p.add_argument("--resume", action="store_true",
                   help="continue an ingest of NAME that broke off, sending only what the "
                        "daemon does not hold durably yet (starts a new ingest if nothing is "
                        "parked); give the same SOURCEs and options")
    p.add_argument("--no-resumable", action="store_true",
                   help="if the ingest breaks off, discard what arrived at once instead of "
                        "keeping it for --resume")
    p.add_argument("--via", choices=("auto", "datapath", "grpc"), default="auto",
                   help="how the bytes travel to one daemon: its data path (Unix socket on the "
                        "same host, else TCP; far less CPU) when it has one, else gRPC "
                        "(default auto; striped ingests use gRPC)")
    p.add_argument("--dry-run", action="store_true",
                   help="list what would be taken and what skipped (with counts); send nothing")
    p.add_argument("--progress", choices=("auto", "bar", "log", "none"), default="auto",
                   help="bar: one live line; log: a line every 10 s (batch jobs); auto: a bar "
                        "on a terminal, else nothing (default)")
    p.add_argument("--include-hidden", action="store_true",
                   help="include files and directories whose name starts with '.'")
    p.add_argument("--follow-symlinks", action="store_true",
                   help="follow symbolic links to files and directories (loops are skipped)")
    p.add_argument("--replicas", type=int, default=1,
                   help="in a cluster (--etcd): copies of each sample on distinct members")
    p.set_defaults(run=cmd_ingest)
    p = sub.add_parser("datasets", help="list datasets")
    p.set_defaults(run=cmd_datasets)
    p = sub.add_parser("warm", help="read a dataset into the daemons' page cache in the "
                       "background (within --warm-memory-share); waits unless --no-wait; "
                       "exit 1 if it did not fit or failed")
    p.add_argument("name")
    p.add_argument("--no-wait", action="store_true", help="start it and return")
    p.add_argument("--status", action="store_true", help="show the latest warm-up only")
    p.set_defaults(run=cmd_warm)
    p = sub.add_parser("ls", help="list a directory of a dataset")
    p.add_argument("target", metavar="NAME[/DIR]")
    p.add_argument("-l", dest="long", action="store_true", help="long format")
    p.set_defaults(run=cmd_ls)
    p = sub.add_parser("stat", help="show a file's or directory's metadata")
    p.add_argument("target", metavar="NAME/PATH")
    p.set_defaults(run=cmd_stat)
    p = sub.add_parser("cat", help="write a sample's bytes to stdout")
    p.add_argument("target", metavar="NAME/PATH")
    p.set_defaults(run=cmd_cat)
    p = sub.add_parser("status", help="the daemon's health and counters")
    p.set_defaults(run=cmd_status)
    p = sub.add_parser("scrub", help="verify every sample's checksum; exit 1 if any is damaged")
    p.add_argument("name")
    p.set_defaults(run=cmd_scrub)
    p = sub.add_parser("rebalance", help="place a dataset on the cluster's live members (after "
                       "adding or removing one); only moved copies cross the network")
    p.add_argument("name")
    p.add_argument("--replicas", type=int, default=None,
                   help="copies of each sample (default: as it is now)")
    p.add_argument("--members", default="", metavar="A,B,...",
                   help="place it on these live members only (default: every live member); "
                        "a member left out deletes its copy")
    p.add_argument("--source", default=None, metavar="HOST:PORT",
                   help="stripe the one-daemon dataset NAME of this daemon over the cluster")
    p.set_defaults(run=cmd_rebalance)
    p = sub.add_parser("rm", help="remove a dataset (and a parked ingest of that name)")
    p.add_argument("name")
    p.set_defaults(run=cmd_rm)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # `ingest SRC --archives NAME`: positionals after an option
        if args.command != "ingest" or any(e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.paths += extra
    try:
        if args.etcd and args.server:
            parser.error("give --server (one daemon) or --etcd (a cluster), not both")
        where = dict(etcd=args.etcd, cluster=args.cluster) if args.etcd else \
            dict(address=args.server or os.environ.get("DLFS_SERVER") or DEFAULT_SERVER)
        with Client(**where, reconnect_timeout_s=2.0, token=args.token,
                    tls_ca=args.tls_ca) as client:
            return args.run(client, args)
    except DlfsError as exc:
        where = f" [request id {exc.request_id}]" if exc.request_id else ""
        print(f"dlfs: {type(exc).__name__}: {exc.message}{where}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
