"""`dlfs`: the command-line client.

    dlfs [--server HOST:PORT[,HOST:PORT...]] ingest SRC_DIR NAME [--replace] [--replicas N]
         [--include-hidden] [--follow-symlinks]
    dlfs [--server HOST:PORT] datasets
    dlfs [--server HOST:PORT] ls NAME[/DIR] [-l]
    dlfs [--server HOST:PORT] stat NAME/PATH
    dlfs [--server HOST:PORT] cat NAME/PATH
    dlfs [--server HOST:PORT] status
    dlfs [--server HOST:PORT] scrub NAME
    dlfs [--server HOST:PORT] rm NAME

`--server` defaults to $DLFS_SERVER, then 127.0.0.1:7010.  Errors print one
line on stderr and exit with status 1 (2 for usage errors).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

from dlfs.client import Client
from dlfs.client.ingest import walk_tree
from dlfs.errors import DlfsError, InvalidArgument
from dlfs.paths import split_dataset_path

DEFAULT_SERVER = "127.0.0.1:7010"


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _mtime(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M")


def cmd_ingest(client: Client, args) -> int:
    report = walk_tree(args.source, include_hidden=args.include_hidden,
                       follow_symlinks=args.follow_symlinks)
    info = client.upload(report, args.name, replace=args.replace, replicas=args.replicas)
    print(f"ingested {info.name}: {info.samples} samples, {info.bytes} bytes "
          f"({_human_bytes(info.bytes)})")
    skipped = [(report.skipped_hidden, "hidden"), (report.skipped_symlinks, "symlinks"),
               (report.skipped_special, "special files"), (report.skipped_loops, "symlink loops")]
    notes = ", ".join(f"{n} {what}" for n, what in skipped if n)
    if notes:
        print(f"skipped: {notes}")
    return 0


def cmd_datasets(client: Client, args) -> int:
    for info in client.dataset_infos():
        state = "" if info.sealed else "  (ingest in progress)"
        if info.sealed:
            state = _warm_state(client, info.name)
        print(f"{info.name}\t{info.samples} samples\t{_human_bytes(info.bytes)}{state}")
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
        infos = client.warm(args.name)
        if not args.no_wait:
            from dlfs.client import warm as warmups

            infos = warmups.wait(client.transport, args.name)
    for info in infos:
        where = f" on {info.address}" if len(infos) > 1 else ""
        print(f"{info.dataset}{where}: {info.state}, {_human_bytes(info.bytes_warmed)} of "
              f"{_human_bytes(info.bytes_total)} read into the page cache (budget "
              f"{_human_bytes(info.budget_bytes)})")
        if info.message:
            print(f"  {info.message}")
    return 0 if all(info.state in ("warm", "queued", "warming", "none") for info in infos) \
        else 1


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
    print(f"scrubbed {args.name}: {report.samples} samples, {_human_bytes(report.bytes)}, "
          f"{len(report.damaged)} damaged")
    return 1 if report.damaged else 0


def cmd_status(client: Client, args) -> int:
    failures = 0
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
    print(f"  data dir: {st.data_dir} (catalog {_human_bytes(st.catalog_bytes)})")
    print(f"  datasets: {st.datasets}, {st.samples} samples, {_human_bytes(st.bytes)}"
          f"{f', {st.ingests_running} ingest(s) running' if st.ingests_running else ''}")
    print(f"  served: {st.batches_served} reads, {st.samples_served} samples, "
          f"{_human_bytes(st.bytes_served)}; page-cache hits {hit_rate} of probed ranges")
    print(f"  calls in flight: {st.rpcs_in_flight}; data connections: {st.data_connections}; "
          f"errors: {errors}")
    print(f"  metrics: {'http://' + st.metrics_address + '/metrics' if st.metrics_address else 'not served (--metrics-listen)'}")


def cmd_rebalance(client: Client, args) -> int:
    report = client.rebalance(args.name, replicas=args.replicas)
    print(f"rebalanced {report.dataset} onto {len(report.members)} daemons ({report.replicas}x): "
          f"{report.samples} samples; moved {report.copies_moved} copies "
          f"({_human_bytes(report.bytes_moved)}), kept {report.copies_kept} in place")
    if report.removed_from:
        print(f"removed from {', '.join(report.removed_from)}")
    if report.not_removed:
        print(f"could not remove the old copy from {', '.join(report.not_removed)}: run "
              f"`dlfs --server ADDRESS rm {report.dataset}` there once it answers",
              file=sys.stderr)
        return 1
    return 0


def cmd_rm(client: Client, args) -> int:
    info = client.delete(args.name)
    print(f"removed {info.name}: {info.samples} samples, {_human_bytes(info.bytes)} freed")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dlfs", description="DLFS command-line client")
    parser.add_argument("--server", default=os.environ.get("DLFS_SERVER", DEFAULT_SERVER),
                        help="daemon address HOST:PORT, or several separated by ',' for a "
                             "dataset striped over them (default: $DLFS_SERVER or %(default)s)")
    parser.add_argument("--token", default=None,
                        help="token for a daemon started with --tokens-file (default: $DLFS_TOKEN)")
    parser.add_argument("--tls-ca", default=None, metavar="PEM",
                        help="CA of the daemon's TLS certificate; turns TLS on "
                             "(default: $DLFS_TLS_CA)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("ingest", help="upload a directory tree as a dataset")
    p.add_argument("source", help="directory whose regular files become samples")
    p.add_argument("name", help="dataset name")
    p.add_argument("--replace", action="store_true", help="replace an existing dataset")
    p.add_argument("--include-hidden", action="store_true",
                   help="include files and directories whose name starts with '.'")
    p.add_argument("--follow-symlinks", action="store_true",
                   help="follow symbolic links to files and directories (loops are skipped)")
    p.add_argument("--replicas", type=int, default=1,
                   help="with several daemons (--server A,B,C): copies of each sample")
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
    p = sub.add_parser("rebalance", help="place a dataset on the daemons of --server (after "
                       "adding or removing one); only moved copies cross the network")
    p.add_argument("name")
    p.add_argument("--replicas", type=int, default=None,
                   help="copies of each sample (default: as it is now)")
    p.set_defaults(run=cmd_rebalance)
    p = sub.add_parser("rm", help="remove a dataset")
    p.add_argument("name")
    p.set_defaults(run=cmd_rm)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with Client(args.server, reconnect_timeout_s=2.0, token=args.token,
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
