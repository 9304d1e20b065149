"""`dlfs ingest`: upload sources as a dataset; what a dry run would take; Ctrl-C.

Ctrl-C (SIGINT) during an ingest closes the connection, waits up to
`limits.cli_park_wait_s` for the daemon to park what it holds durably, and
prints one line: what was kept and the exact command that continues it
(the same command line with --resume).  Exit status 130, as for any
command a shell's Ctrl-C ended.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from dlfs import limits
from dlfs.cli.target import client_target
from dlfs.client import Client
from dlfs.errors import DlfsError, InvalidArgument
from dlfs.staging.duplicates import Duplicates
from dlfs.staging.pace import check_rate
from dlfs.staging.progress import IngestStats, bytes_text, human_bytes
from dlfs.staging.read_pool import READERS_DEFAULT
from dlfs.staging.source_files import SKIP_KINDS, skipped_text
from dlfs.staging.source_set import SourceSet, open_sources
from dlfs.paths import check_dataset_name
from dlfs.staging.tar_archive import ARCHIVE_SUFFIXES, is_archive_name
from dlfs.units import counted, parse_size

# The exit status of a command ended by SIGINT (128 + 2), as shells report it.
EXIT_INTERRUPTED = 130


def add_commands(command) -> None:
    p = command(
        "ingest", "upload directory trees or tar archives as a dataset", run_ingest,
        description="Upload SOURCEs as dataset NAME.  A SOURCE is a directory tree (its "
        "regular files become samples), a tar archive (plain, .gz, .bz2, .xz; its members "
        "become samples, named by their paths in the archive: WebDataset shards work as they "
        "are), a glob of archives in quotes ('shards/*.tar'), or any other file (one "
        "sample named by its base name: one big HDF5, Parquet or NPZ file).  Several "
        "SOURCEs make one "
        "dataset, named by the last word (one SOURCE alone: its base name, without an "
        "archive's suffix).  Ctrl-C stops it: what the daemon holds durably stays parked, "
        "and the command to continue it is printed.")
    p.usage = "dlfs ingest [options] SOURCE... [NAME]"
    p.add_argument("paths", nargs="+", metavar="SOURCE",
                   help="directories, archives or quoted globs, then the dataset NAME")
    p.add_argument("--replace", action="store_true", help="replace an existing dataset")
    p.add_argument("--archives", action="store_true",
                   help="a directory SOURCE holds archives (every *.tar, *.tar.gz, *.tgz, "
                        "*.tar.bz2, *.tar.xz in it, sorted) rather than being a tree")
    p.add_argument("--readers", type=int, default=READERS_DEFAULT,
                   help="files (or archives) read at once; raise it for sources with a high "
                        "latency per open, such as parallel file systems (default: "
                        "%(default)s)")
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
                        "(default: auto; striped ingests use gRPC)")
    p.add_argument("--dry-run", action="store_true",
                   help="list what would be taken and what skipped (with counts); send nothing")
    p.add_argument("--progress", choices=("auto", "bar", "log", "none"), default="auto",
                   help="bar: one live line; log: a line every 10 s (batch jobs); auto: a bar "
                        "on a terminal, else nothing (default: auto)")
    p.add_argument("--include-hidden", action="store_true",
                   help="include files and directories whose name starts with '.'")
    p.add_argument("--follow-symlinks", action="store_true",
                   help="follow symbolic links to files and directories (loops are skipped)")
    p.add_argument("--skip-unreadable", action="store_true",
                   help="leave out files and directories of trees that cannot be read (their "
                        "permissions), counted in the 'skipped:' line; without it, one stops "
                        "the ingest, parked for --resume with what was sent before it")
    p.add_argument("--max-rate", type=_rate, metavar="SIZE",
                   help="send at most SIZE bytes a second (e.g. 200MiB), so that training "
                        "jobs reading from the same daemons keep their disk and network "
                        "bandwidth (default: no cap)")
    p.add_argument("--replicas", type=int, default=1,
                   help="in a cluster (--etcd): copies of each sample, on distinct members "
                        "(default: 1)")


def run_ingest(client: Client, args) -> int:
    paths, name = source_paths_and_name(args.paths)
    sources = open_sources(paths, archives=args.archives, include_hidden=args.include_hidden,
                           follow_symlinks=args.follow_symlinks,
                           skip_unreadable=args.skip_unreadable)
    hint = "" if args.archives else archives_hint(paths, args.argv)
    if args.dry_run:
        code = _dry_run(sources, name)
        if hint:
            print(hint, file=sys.stderr)
        return code
    stats = IngestStats()
    try:
        info = client.upload(sources, name, replace=args.replace, replicas=args.replicas,
                             readers=args.readers, resumable=not args.no_resumable,
                             resume=args.resume, progress=None if args.progress == "auto"
                             else args.progress, via=args.via, stats=stats,
                             max_rate=args.max_rate)
    except KeyboardInterrupt:
        print(f"dlfs: {interrupted(client, args, name)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"ingested {info.name}: {counted(info.samples, 'sample')}, {bytes_text(info.bytes)}")
    print(stats.rate_line())
    notes = sources.skipped().summary()
    if notes:
        print(f"skipped: {notes}")
    warning = empty_warning(sources, info.name)
    if warning:
        print(warning, file=sys.stderr)
    if hint:
        print(hint, file=sys.stderr)
    return 0


def source_paths_and_name(words: list[str]) -> tuple[list[str], str]:
    """(SOURCEs, NAME) of the command line's words: the last word names the dataset,
    unless there is one word, whose base name (without an archive's suffix) does."""
    if len(words) > 1:
        return words[:-1], words[-1]
    source = words[0]
    base = os.path.basename(os.path.normpath(source))
    for suffix in ARCHIVE_SUFFIXES:
        if base.endswith(suffix) and base != suffix:
            base = base[:-len(suffix)]
            break
    try:
        check_dataset_name(base)
    except InvalidArgument as exc:
        raise InvalidArgument(f"name the dataset: dlfs ingest {shlex.quote(source)} NAME "
                              f"({source!r} gives no dataset name: {exc.message})") from None
    return [source], base


def empty_warning(sources: SourceSet, name: str) -> str:
    """The warning for trees that gave the dataset no file (an empty or wholly skipped
    source: an empty dataset, which a training job finds only when it starts); ""
    otherwise, and for archives (not known before they are read)."""
    if sources.known_files != 0:
        return ""
    skipped = sources.skipped().summary()
    why = f" (skipped: {skipped})" if skipped else ""
    return (f"dlfs: warning: {name} has no file: "
            f"{', '.join(s.root for s in sources.sources)} held none to ingest{why}")


def _rate(text: str) -> int:
    """--max-rate's SIZE, bytes a second ("200MiB", "1.5G", "65536")."""
    try:
        rate = parse_size(text.removesuffix("/s"))
        check_rate(rate)
    except (ValueError, InvalidArgument) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return rate


def command_line(argv: list[str], *added: str) -> str:
    """The `dlfs` command line `argv` with the options `added` that it lacks, quoted for a
    POSIX shell: advice a user can paste as it is."""
    return shlex.join(["dlfs", *argv, *(option for option in added if option not in argv)])


def archives_hint(paths: list[str], argv: list[str]) -> str:
    """A note for directory SOURCEs that hold tar archives and nothing else (they become
    one sample per archive unless --archives), with the command that stores the
    archives' members instead; "" otherwise.  Cost: one scandir per directory SOURCE."""
    full = []
    for path in paths:
        if not os.path.isdir(path):
            continue
        try:
            with os.scandir(path) as entries:
                names = [(entry.name, entry.is_file()) for entry in entries
                         if not entry.name.startswith(".")]
        except OSError:  # the walk says why (and --skip-unreadable leaves it out)
            continue
        if names and all(is_file and is_archive_name(name) for name, is_file in names):
            full.append(path)
    if not full:
        return ""
    return (f"note: {', '.join(full)} holds only tar archives, stored as one sample each; "
            f"to store their members instead: {command_line(argv, '--archives', '--replace')}")


def interrupted(client: Client, args, name: str) -> str:
    """After Ctrl-C: close the connection, then say what the daemon kept of `name` and how
    to continue.  Waits up to `limits.cli_park_wait_s` for the daemon to park it."""
    client.close()  # the daemon sees the stream end now and parks what it holds durably
    if args.no_resumable:
        return f"interrupted: nothing of {name!r} is kept (--no-resumable)"
    resume = command_line(args.argv, "--resume")
    deadline = time.monotonic() + limits.cli_park_wait_s
    try:
        with Client(**client_target(args), reconnect_timeout_s=limits.cli_reconnect_timeout_s,
                    token=args.token, tls_ca=args.tls_ca) as again:
            while True:
                info = next((i for i in again.dataset_infos() if i.name == name), None)
                if info is not None and info.sealed and info.generation and not args.replace:
                    return (f"interrupted after the last file: {name!r} is ingested "
                            f"({counted(info.samples, 'sample')})")
                if info is not None and info.ingest_state == "parked":
                    keeps = (f"{len(info.members)} members keep" if args.etcd
                             else "the daemon keeps")
                    return (f"interrupted: {keeps} {counted(info.samples, 'file')} "
                            f"({human_bytes(info.bytes)}) of {name!r}, parked; continue with: "
                            f"{resume}")
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
    except (DlfsError, KeyboardInterrupt):
        pass  # a second Ctrl-C, or no answer: say what is known
    return (f"interrupted: the daemon keeps what it holds durably of {name!r} once it notices "
            f"the end of the stream; continue with: {resume}")


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
    counts = ", ".join(skipped_text(kind, skipped.counts[kind]) for kind in SKIP_KINDS)
    print(f"would ingest {name}: {counted(files, 'file')}, {bytes_text(total)} from "
          f"{origin}; skipped: {counts}")
    return 0
