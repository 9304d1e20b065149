"""The commands that change or check what daemons hold: `warm`, `scrub`, `rebalance`,
`mkspace` (checkpoint spaces), `rm` (sealed datasets and spaces) and `discard` (parked
ingests)."""

from __future__ import annotations

import shlex
import sys

from dlfs.cli.listing_commands import cached_text
from dlfs.cli.target import target_options
from dlfs.client import Client
from dlfs.errors import DlfsError
from dlfs.staging.progress import human_bytes
from dlfs.units import counted


def add_commands(command) -> None:
    p = command("warm", "read a dataset into the daemons' page cache", run_warm,
                description="Read dataset NAME into the daemons' page cache in the background "
                "(within their --warm-memory-share); waits until done unless --no-wait; exit 1 "
                "if it did not fit or failed.")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--no-wait", action="store_true", help="start it and return")
    p.add_argument("--status", action="store_true", help="show the latest warm-up only")
    p = command("scrub", "verify every sample's checksum", run_scrub,
                description="Read every sample of NAME on the daemons and check its CRC32C; "
                "list the damaged ones and exit 1 if there are any.")
    p.add_argument("name", metavar="NAME")
    p = command("rebalance", "place a dataset on the cluster's live members", run_rebalance,
                description="Place dataset NAME on the live members of the cluster of --etcd "
                "(after adding or before removing one); only copies that move cross the "
                "network.  A member left out deletes its copy when it reads etcd.")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--replicas", type=int, default=None,
                   help="copies of each sample (default: as it is now)")
    p.add_argument("--members", default=None, metavar="HOST:PORT,...",
                   help="place it on these live members only (default: every live member)")
    p.add_argument("--source", default=None, metavar="HOST:PORT",
                   help="stripe the one-daemon dataset NAME of this daemon over the cluster")
    p = command("mkspace", "create checkpoint spaces", run_mkspace,
                description="Create each checkpoint space NAME: a tree of files that programs "
                "write (through `dlfs-mount`, `Client.space`, or torch.distributed.checkpoint), "
                "beside the read-only datasets; the others are still created when one fails "
                "(exit 1).")
    p.add_argument("names", nargs="+", metavar="NAME")
    p = command("rm", "remove datasets and checkpoint spaces", run_rm,
                description="Remove each sealed dataset NAME (or checkpoint space NAME, with "
                "every file in it) and free its space, and nothing else: a parked ingest of "
                "that name stays (`dlfs discard` ends it); the others are still removed when "
                "one fails (exit 1).")
    p.add_argument("names", nargs="+", metavar="NAME")
    p = command("discard", "end parked ingests", run_discard,
                description="End the parked (broken-off, resumable) ingest of each NAME and "
                "free its space, and nothing else: a sealed dataset NAME stays as it is; the "
                "others are still ended when one fails (exit 1).")
    p.add_argument("names", nargs="+", metavar="NAME")


def run_warm(client: Client, args) -> int:
    if args.status:
        infos = client.warm_status(args.name)
    else:
        infos = client.warm(args.name, wait=not args.no_wait)
    for info in infos:
        where = f" on {info.address}" if len(infos) > 1 else ""
        cached = cached_text(info.bytes_resident, info.bytes_total)
        print(f"{info.dataset}{where}: {info.state}, {human_bytes(info.bytes_warmed)} of "
              f"{human_bytes(info.bytes_total)} read into the page cache (budget "
              f"{human_bytes(info.budget_bytes)}); {cached}")
        if info.message:
            print(f"  {info.message}")
    return 0 if all(info.state in ("warm", "queued", "warming", "none") for info in infos) \
        else 1


def run_scrub(client: Client, args) -> int:
    report = client.scrub(args.name)
    for entry, reason in report.damaged:
        print(f"DAMAGED {args.name}/{entry.path}: {reason}")
    print(f"scrubbed {args.name}: {report.samples} samples, {human_bytes(report.bytes)}, "
          f"{len(report.damaged)} damaged")
    return 1 if report.damaged else 0


def run_rebalance(client: Client, args) -> int:
    members = [m.strip() for m in args.members.split(",") if m.strip()] \
        if args.members is not None else None
    report = client.rebalance(args.name, replicas=args.replicas, members=members,
                              source=args.source)
    print(f"rebalanced {report.dataset} onto {len(report.members)} daemons ({report.replicas}x): "
          f"{report.samples} samples; moved {report.copies_moved} copies "
          f"({human_bytes(report.bytes_moved)}), kept {report.copies_kept} in place")
    if report.removed_from:
        print(f"removed from {', '.join(report.removed_from)}")
    if report.not_removed:
        print(f"{', '.join(report.not_removed)} left the dataset but had not removed its copy "
              "yet: each does so when it reads etcd again (at its start, if it is down)",
              file=sys.stderr)
    return 0


def run_mkspace(client: Client, args) -> int:
    failed = 0
    for name in args.names:
        try:
            client.create_space(name)
        except DlfsError as exc:
            failed += 1
            _print_error(exc)
            continue
        print(f"created checkpoint space {name}")
    return 1 if failed else 0


def run_rm(client: Client, args) -> int:
    failed = 0
    for name in args.names:
        try:
            info = client.delete(name)
        except DlfsError as exc:
            failed += 1
            _print_error(exc)
            continue
        what = "file" if info.kind == "space" else "sample"
        print(f"removed {info.name}: {counted(info.samples, what)}, "
              f"{human_bytes(info.bytes)} freed")
        left = _listed(client, name)
        if left is not None and left.ingest_state == "parked":  # rm never touches it
            discard = shlex.join(["dlfs", *target_options(args), "discard", name])
            print(f"an ingest of {name} is still parked ({counted(left.samples, 'file')}, "
                  f"{human_bytes(left.bytes)}): `{discard}` ends it")
    return 1 if failed else 0


def run_discard(client: Client, args) -> int:
    failed = 0
    for name in args.names:
        try:
            info = client.discard_ingest(name)
        except DlfsError as exc:
            failed += 1
            _print_error(exc)
            continue
        print(f"discarded the parked ingest of {info.name}: {counted(info.samples, 'file')}, "
              f"{human_bytes(info.bytes)} freed")
        left = _listed(client, name)
        if left is not None and left.sealed:  # discard never touches it
            print(f"dataset {name} is untouched: {counted(left.samples, 'sample')}, "
                  f"{human_bytes(left.bytes)}")
    return 1 if failed else 0


def _listed(client: Client, name: str):
    """The listing's entry for `name` (a sealed dataset before an unsealed ingest of the
    same name), or None; None too when the daemons cannot say (it is only a note)."""
    try:
        return next((info for info in client.dataset_infos() if info.name == name), None)
    except DlfsError:
        return None


def _print_error(exc: DlfsError) -> None:
    where = f" [request id {exc.request_id}]" if exc.request_id else ""
    print(f"dlfs: {type(exc).__name__}: {exc.message}{where}", file=sys.stderr)
