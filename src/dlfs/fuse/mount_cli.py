"""`dlfs-mount ADDR MOUNTPOINT`: mount a daemon's datasets (read-only) and its
checkpoint spaces (writable); `dlfs-mount --etcd URL MOUNTPOINT`: a cluster's
datasets, read-only; `--dataset NAME`: one dataset, read-only.

Without ``--foreground`` the command starts the file system in a background
process (this module again, with ``--foreground`` and a readiness pipe) and
returns 0 only once the mount answers, or 1 with the reason.  It re-executes
rather than forks because gRPC must not be initialised before a fork.  The
background process logs to ``--log-file``, by default `default_log_file()`
(``$XDG_STATE_HOME/dlfs/mount.log``): once detached it never writes into
the terminal that started it, as sshfs keeps quiet.

The mount point must be an empty directory: a mount over files hides them
until it is unmounted, so that needs ``--nonempty``.  ``--metrics-listen``
serves the mount's Prometheus metrics (`dlfs.fuse.mount_metrics`).

With ``--foreground`` (systemd, Slurm) it serves until the file system is
unmounted (``fusermount3 -u MOUNTPOINT``) or it gets SIGTERM, SIGINT or
SIGHUP; then it unmounts cleanly and exits 0.  SIGUSR1 logs how many
requests of each kind the kernel sent so far (also logged at exit).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import re
import resource
import select
import shlex
import signal
import stat
import subprocess
import sys
import time

import trio

from dlfs import errors, logs
from dlfs.coord.cluster_keys import CLUSTER_DEFAULT
from dlfs import limits as fuse_limits
from dlfs.fuse import lowlevel, splicereads
from dlfs.fuse.backend import Backend
from dlfs.fuse.attributes import DIR_MODE, dataset_attrs, dataset_key
from dlfs.fuse.extentreads import ExtentReaders, PagesRelease
from dlfs.fuse.fs import DlfsOperations
from dlfs.fuse.inodes import ROOT_KEY, Attrs
from dlfs.fuse.mount_metrics import serve_metrics
from dlfs.fuse.session import MountFailed, Session
from dlfs.fuse.space_files import SpaceFiles
from dlfs.fuse.splicereads import SpliceReads
from dlfs.version import __version__

log = logging.getLogger("dlfs.fuse")

READY = b"ready\n"
ERROR_PREFIX = b"error "


class MountError(Exception):
    """The mount cannot be set up; the message says why and what to do."""

    reported = False  # said once already (`_report`), to the parent or standard error


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="dlfs-mount",
        description="Mount the datasets of a DLFS daemon (read-only) and its checkpoint "
                    "spaces (writable: `mkdir MOUNTPOINT/NAME` makes one).",
        epilog="Unmount with `fusermount3 -u MOUNTPOINT` (or SIGTERM to a --foreground mount).")
    parser.add_argument("target", nargs="+", metavar="[ADDR] MOUNTPOINT",
                        help="the daemon's address HOST:PORT (not with --etcd), then an "
                             "existing empty directory (see --nonempty)")
    parser.add_argument("--etcd", default=None, metavar="URL[,URL...]",
                        help="mount a cluster's datasets: its etcd's client URLs (default "
                             "$DLFS_ETCD when no ADDR is given); reads go to live members and "
                             "fail over to replicas")
    parser.add_argument("--cluster", default=None, metavar="NAME",
                        help="with --etcd: the cluster's name there (default $DLFS_CLUSTER, "
                             "else 'default')")
    parser.add_argument("--version", action="version", version=f"dlfs-mount {__version__}",
                        help="print the version and exit")
    parser.add_argument("--nonempty", action="store_true",
                        help="mount over a directory that holds files (they are hidden until "
                             "the mount is gone)")
    parser.add_argument("--metrics-listen", metavar="[HOST:]PORT",
                        help="serve the mount's Prometheus metrics at http://HOST:PORT/metrics "
                             "(a PORT alone: on 127.0.0.1; 0 picks one, logged at start); "
                             "off unless given")
    parser.add_argument("--dataset", metavar="NAME",
                        help="mount only this dataset, its root at MOUNTPOINT (default: every "
                             "dataset as a directory of MOUNTPOINT)")
    parser.add_argument("-f", "--foreground", action="store_true",
                        help="serve in this process until unmounted (for systemd and Slurm)")
    parser.add_argument("--allow-other", action="store_true",
                        help="let other users access the mount (needs user_allow_other in "
                             "/etc/fuse.conf unless root)")
    parser.add_argument("--cache-timeout", type=float, metavar="S",
                        default=fuse_limits.mount_cache_timeout_s_default,
                        help="seconds the kernel caches names and attributes (default "
                             "%(default)s; datasets are immutable once sealed)")
    parser.add_argument("--reconnect-timeout", type=float, metavar="S",
                        default=fuse_limits.mount_reconnect_timeout_s_default,
                        help="seconds a request waits for an unreachable daemon before it "
                             "fails with EIO (default %(default)s)")
    parser.add_argument("--metadata-timeout", type=float, metavar="S",
                        default=fuse_limits.mount_metadata_timeout_s_default,
                        help="deadline of a stat or listing call (default %(default)s)")
    parser.add_argument("--read-timeout", type=float, metavar="S",
                        default=fuse_limits.mount_read_timeout_s_default,
                        help="deadline of one sample or window read (default %(default)s)")
    parser.add_argument("--log-file", metavar="PATH",
                        help="append log lines here (default: standard error with "
                             "--foreground, else $XDG_STATE_HOME/dlfs/mount.log, i.e. "
                             "~/.local/state/dlfs/mount.log)")
    parser.add_argument("--debug", action="store_true", help="log every request (slow)")
    parser.add_argument("--log-format", default="text", choices=logs.FORMATS,
                        help="text lines, or one JSON object per line")
    parser.add_argument("--ready-file", metavar="PATH",
                        help="once the mount answers, write the pid of the process serving it "
                             "to PATH (an old PATH is removed at start); for scripts and "
                             "supervisors that wait for the mount")
    parser.add_argument("--extent-reads", choices=("auto", "off"), default="auto",
                        help="auto (default): on the daemon's host, read files from the "
                             "daemon's extents (descriptors it passes over its Unix socket), "
                             "checked against their CRC32Cs, without a round trip; off: "
                             "always through the daemon (also turns --splice off)")
    parser.add_argument("--splice", choices=("auto", "off"), default="auto",
                        help="auto (default): with extent reads, answer reads of large "
                             "files from the daemon's extent pages by splice (needs pipes of "
                             "2 MiB: fs.pipe-max-size >= 2097152 or CAP_SYS_RESOURCE); off: "
                             "large files read from the extents and copied")
    parser.add_argument("--extent-pages-release", type=float, metavar="S",
                        default=fuse_limits.mount_extent_pages_release_s_default,
                        help="with extent reads, let go of the extent pages this process "
                             "mapped once it read none for S seconds, and every "
                             f"{fuse_limits.mount_extent_pages_release_busy_s:.0f} s while "
                             "it reads (default %(default)s; 0: never): they stay in the "
                             "page cache, and drop_caches evicts them, so a cold epoch "
                             "after it reads cold")
    parser.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # An ADDR given wins over $DLFS_ETCD; --etcd given with an ADDR is a mistake.  An
    # empty ADDR, or an empty --etcd (a systemd unit's unset variable), is none.
    if len(args.target) == 2 and not args.target[0]:
        args.target = args.target[1:]
    etcd = args.etcd or (os.environ.get("DLFS_ETCD") if len(args.target) == 1 else None)
    if len(args.target) == 2 and not args.etcd:
        (args.address, args.mountpoint), args.etcd = args.target, None
    elif len(args.target) == 1 and etcd:
        args.address, args.mountpoint, args.etcd = None, args.target[0], etcd
    else:
        parser.error("give ADDR MOUNTPOINT (one daemon), or --etcd URL MOUNTPOINT (a cluster)")
    args.cluster = args.cluster or os.environ.get("DLFS_CLUSTER") or CLUSTER_DEFAULT
    for name in ("cache_timeout", "reconnect_timeout", "metadata_timeout", "read_timeout"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if not args.extent_pages_release >= 0:
        parser.error("--extent-pages-release must be 0 (never) or positive")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    args.background_child = args.ready_fd is not None  # started by run_background
    if args.foreground:
        _setup_logging(args)
    try:
        check_mountpoint(args.mountpoint, nonempty=args.nonempty)
        check_ready_file(args.ready_file)
        if args.foreground:
            return run_foreground(args)
        return run_background(argv, args)
    except MountError as exc:
        _report(args, exc)
        if args.background_child:
            # Told the parent; nothing else to do.  Skip the interpreter's shutdown,
            # which joins library threads (gRPC's, the etcd watch): a failed child
            # once sat somewhere on its way out for the parent's whole 120 s.
            logging.shutdown()
            os._exit(1)
        return 1


def _report(args: argparse.Namespace, exc: MountError) -> None:
    """Say why the mount failed, once: to the waiting parent (which prints it), else on
    standard error."""
    if exc.reported:
        return
    exc.reported = True
    if args.ready_fd is not None:
        _send(args.ready_fd, ERROR_PREFIX + str(exc).encode())
        args.ready_fd = None  # closed: never written again (its number may be reused)
        if args.log_file:
            log.error("%s", exc)
    elif not args.background_child:
        print(f"dlfs-mount: {exc}", file=sys.stderr)


def check_mountpoint(path: str, nonempty: bool = False) -> None:
    """Raise MountError unless `path` is a directory that nothing is mounted on, and
    empty unless `nonempty`."""
    try:
        os.stat(path)
    except FileNotFoundError:
        raise MountError(f"mount point {path} does not exist; create it with mkdir") from None
    except OSError as exc:
        raise MountError(f"mount point {path} is unusable ({exc.strerror}); if a previous mount "
                         f"died, run `{shlex.join(['fusermount3', '-u', path])}`") from None
    if not os.path.isdir(path):
        raise MountError(f"mount point {path} is not a directory")
    if os.path.ismount(path):
        try:  # a mount whose process died answers stat from the kernel's cache, not this
            with os.scandir(path):
                pass
        except OSError as exc:
            raise MountError(f"mount point {path} is unusable ({exc.strerror}); if a previous "
                             f"mount died, run `{shlex.join(['fusermount3', '-u', path])}`"
                             ) from None
        raise MountError(f"{path} is already a mount point; unmount it first "
                         f"(`{shlex.join(['fusermount3', '-u', path])}`)")
    if not nonempty:
        with os.scandir(path) as entries:
            found = sorted(entry.name for entry, _ in zip(entries, range(3)))
        if found:
            raise MountError(f"mount point {path} is not empty (it holds {', '.join(found)}"
                             f"{', ...' if len(found) == 3 else ''}): the mount would hide "
                             "that; give an empty directory, or pass --nonempty to mount over it")
    if not os.path.exists("/dev/fuse"):
        raise MountError("/dev/fuse is missing: install fuse3 and load the fuse kernel module")


def check_ready_file(path: str | None) -> None:
    """Remove a stale --ready-file `path`; MountError if its directory is missing."""
    if path is None:
        return
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise MountError(f"--ready-file {path}: directory {directory} does not exist")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise MountError(f"--ready-file {path}: cannot remove the old file ({exc.strerror})")


# --- background: start the foreground process and wait for it ------------------------------

def default_log_file() -> str:
    """Where a background mount without --log-file logs: $XDG_STATE_HOME/dlfs/mount.log
    (~/.local/state/dlfs/mount.log), every mount of this user one after the other
    (each line names its process)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(state, "dlfs", "mount.log")


def run_background(argv: list[str], args: argparse.Namespace) -> int:
    """Start `--foreground` in a new session, logging to --log-file (`default_log_file`
    unless given, its standard error too: gRPC's own lines); 0 once it serves, 1 if it
    failed."""
    if not args.log_file:
        args.log_file = default_log_file()
        argv = [*argv, "--log-file", args.log_file]
    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.log_file)), exist_ok=True)
        stderr = open(args.log_file, "ab")
    except OSError as exc:
        raise MountError(f"--log-file {args.log_file}: cannot append to it "
                         f"({exc.strerror or exc})") from None
    read_end, write_end = os.pipe()
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "dlfs.fuse.mount_cli", *argv, "--foreground",
             "--ready-fd", str(write_end)],
            pass_fds=(write_end,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=stderr, start_new_session=True)
    finally:
        os.close(write_end)
        stderr.close()
    message = _receive(read_end, fuse_limits.mount_ready_timeout_s)
    os.close(read_end)
    if message == READY:
        return 0
    if message.startswith(ERROR_PREFIX):
        try:  # it exits once it said why; one that hangs on its way out is not waited for
            child.wait(fuse_limits.mount_failed_exit_wait_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        raise MountError(message[len(ERROR_PREFIX):].decode(errors="replace"))
    if message:
        raise AssertionError(f"unexpected readiness message {message!r}")
    status = child.poll()
    if status is None:
        child.terminate()
        child.wait()
        raise MountError(f"the mount did not become usable within "
                         f"{fuse_limits.mount_ready_timeout_s:.0f} s; stopped it (see "
                         f"{args.log_file})")
    raise MountError(f"the mount process exited with status {status} before the mount was "
                     f"usable (see {args.log_file})")


def _receive(fd: int, timeout_s: float) -> bytes:
    """Everything written to pipe `fd` until EOF, or what came before the timeout."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return data
        chunk = os.read(fd, 4096)
        if not chunk:
            return data
        data += chunk


def _send(fd: int, message: bytes) -> None:
    try:
        os.write(fd, message)
        os.close(fd)
    except OSError:
        pass  # the waiting parent is gone; nobody to tell


# --- foreground: serve ----------------------------------------------------------------------

def run_foreground(args: argparse.Namespace) -> int:
    _keep_freed_memory()
    _raise_open_files_limit()
    try:
        backend = Backend(args.address, etcd=args.etcd, cluster=args.cluster,
                          reconnect_timeout_s=args.reconnect_timeout,
                          metadata_timeout_s=args.metadata_timeout,
                          read_timeout_s=args.read_timeout)
    except errors.DlfsError as exc:
        raise MountError(str(exc)) from None
    try:
        writable = args.dataset is None and backend.writable
        root_key, root_attrs, what = _resolve_root(backend, args.dataset, writable)
        operations = DlfsOperations(backend, root_key, root_attrs, writable=writable,
                                    cache_timeout_s=args.cache_timeout)
        options = ["default_permissions", "subtype=dlfs",
                   "fsname=dlfs@" + re.sub(r"[^\w.:\-\[\]@]", "_",
                                           args.address or "etcd-" + args.cluster)]
        if not writable:
            options.append("ro")
        if args.allow_other:
            options.append("allow_other")
        try:
            session = Session(operations, args.mountpoint, options, debug=args.debug,
                              unanswered=operations.unanswered,
                              # O_TRUNC comes with OPEN: a file opened to be rewritten
                              # starts empty, not as a copy truncated afterwards.
                              want=lowlevel.CAP_READDIRPLUS | lowlevel.CAP_ASYNC_READ |
                              lowlevel.CAP_ATOMIC_O_TRUNC,
                              # Always READDIRPLUS: every listed name comes with its
                              # attributes, so a reader's stat or open needs no lookup.
                              unwant=lowlevel.CAP_READDIRPLUS_AUTO,
                              max_background=fuse_limits.mount_background_requests_max)
        except (MountFailed, lowlevel.LibfuseMissing) as exc:
            raise MountError(f"{exc}; see the libfuse message above") from None
        if args.extent_reads == "auto":
            operations.extents = ExtentReaders(backend.extent_reader)
            operations.splice = _splice_reads(args.splice, session, operations.extents)
        if args.metrics_listen:
            try:
                where = serve_metrics(args.metrics_listen, session, operations)
            except (OSError, ValueError) as exc:
                session.close()
                raise MountError(f"--metrics-listen {args.metrics_listen}: cannot serve there "
                                 f"({exc})") from None
            log.info("metrics at http://%s/metrics", where, extra={"metrics_address": where})
        try:
            trio.run(_serve, session, operations, args, what)
        finally:
            # Also after `fusermount3 -u` (then it is a no-op): never leave a
            # dead mount behind, whatever ended the loop.
            session.close()
            if operations.splice is not None:
                operations.splice.close()
            _log_counts(session, backend, operations.extents, operations.splice,
                        operations.spaces)
        log.info("unmounted %s", args.mountpoint)
        return 0
    except MountError as exc:
        _report(args, exc)  # now: closing the backend below may take a while
        raise
    finally:
        backend.close()


def _resolve_root(backend: Backend, dataset: str | None, writable: bool) -> tuple:
    """(root key, root attributes, description) of the mount; checks the daemon answers."""
    try:
        if dataset is not None:
            info = backend.dataset(dataset)
            if info.kind == "space":
                raise MountError(f"{dataset!r} is a checkpoint space: mount the whole daemon "
                                 "(no --dataset) to read and write it, at MOUNTPOINT/"
                                 f"{dataset}")
            return dataset_key(info), dataset_attrs(info), f"dataset {dataset!r}"
        count = len(backend.sealed_datasets())
    except errors.NotFound:
        options = backend.cli_options()
        datasets = shlex.join(["dlfs", "datasets", *options])
        where = (f"the DLFS daemon at {backend.address}" if options[0] == "--server"
                 else f"the DLFS cluster {backend.address}")
        raise MountError(f"{where} has no dataset {dataset!r}; `{datasets}` lists its "
                         "datasets") from None
    except errors.DlfsError as exc:
        raise MountError(f"cannot reach the DLFS daemon at {backend.address}: {exc}") from None
    # Writable: its owner may mkdir a space there.
    mode = stat.S_IFDIR | 0o755 if writable else DIR_MODE
    return ROOT_KEY, Attrs(True, 0, mode, time.time_ns()), f"{count} datasets and spaces"


async def _serve(session: Session, operations: DlfsOperations, args: argparse.Namespace,
                 what: str) -> None:
    async with trio.open_nursery() as nursery:
        operations.start(nursery, session)

        async def run_fuse() -> None:
            await session.serve(nursery, threads_max=fuse_limits.mount_fuse_threads_max)
            nursery.cancel_scope.cancel()  # unmounted: stop signal watch and read-ahead

        nursery.start_soon(run_fuse)
        nursery.start_soon(_stop_on_signal, session, nursery)
        nursery.start_soon(_counts_on_signal, session, operations.backend, operations.extents,
                           operations.splice, operations.spaces)
        nursery.start_soon(operations.follow_root_version)
        if operations.extents is not None and args.extent_pages_release:
            nursery.start_soon(_release_extent_pages, operations.extents,
                               args.extent_pages_release)
        try:
            # A stat of the root goes through this very loop: once it answers,
            # the mount is usable.
            root = await trio.to_thread.run_sync(os.stat, args.mountpoint,
                                                 abandon_on_cancel=True)
        except OSError as exc:
            log.error("the new mount at %s does not answer (%s); unmounting", args.mountpoint, exc)
            if args.ready_fd is not None:
                _send(args.ready_fd, ERROR_PREFIX + f"mount does not answer: {exc}".encode())
            session.exit()
            return
        _set_kernel_read_ahead(root.st_dev, fuse_limits.mount_kernel_read_ahead_bytes)
        if not session.capable & lowlevel.CAP_NO_OPEN_SUPPORT:
            log.warning("this kernel cannot skip OPEN for files (FUSE no-open support, Linux "
                        "4.18+): every open() costs a round trip to this process")
        if args.ready_file:
            _write_ready_file(args.ready_file)
        log.info("serving %s of the DLFS daemon at %s at %s (%s)", what,
                 operations.backend.address, args.mountpoint,
                 "checkpoint spaces writable" if operations.writable else "read-only")
        if args.ready_fd is not None:
            _send(args.ready_fd, READY)


def _set_kernel_read_ahead(device: int, read_ahead_bytes: int) -> None:
    """Set the kernel's read-ahead window for the files of the mount on `device`
    (its bdi's read_ahead_kb in sysfs).  Needs root (or a writable sysfs);
    without it the kernel's default stays and the mount says so once, at
    info level."""
    path = f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb"
    try:
        with open(path, "w") as f:
            f.write(str(read_ahead_bytes // 1024))
    except OSError as exc:
        log.info("kept the kernel's read-ahead window for this mount (%s: %s); large "
                 "sequential reads get fewer bytes in flight", path, exc.strerror or exc)


def _write_ready_file(path: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(tmp, path)  # waiters never see a half-written pid


async def _release_extent_pages(extents: ExtentReaders, idle_s: float) -> None:
    """Let go of the extent pages this process mapped when `PagesRelease` says so (in a
    thread: a `madvise` over many mapped pages takes milliseconds)."""
    busy_s = max(idle_s, fuse_limits.mount_extent_pages_release_busy_s)
    schedule = PagesRelease(idle_s, busy_s)
    while True:
        await trio.sleep(idle_s / 2)
        if not schedule.due(trio.current_time(), extents.uses):
            continue
        try:
            released = await trio.to_thread.run_sync(extents.release_mapped_pages)
        except (OSError, ValueError) as exc:  # madvise refused: the pages stay mapped
            log.warning("could not let go of mapped extent pages: %s", exc)
            continue
        log.debug("let go of the mapped pages of %d bytes of extents", released)


async def _stop_on_signal(session: Session, nursery: trio.Nursery) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for number in signals:
            log.info("%s: unmounting", signal.Signals(number).name)
            session.exit()
            # Requests waiting for the daemon get a grace period, then are abandoned.
            await trio.sleep(fuse_limits.mount_shutdown_grace_s)
            nursery.cancel_scope.cancel()
            return


async def _counts_on_signal(session: Session, backend: Backend,
                            extents: ExtentReaders | None = None,
                            splice: SpliceReads | None = None,
                            files: SpaceFiles | None = None) -> None:
    with trio.open_signal_receiver(signal.SIGUSR1) as signals:
        async for _ in signals:
            _log_counts(session, backend, extents, splice, files)


def _splice_reads(mode: str, session: Session, extents: ExtentReaders) -> SpliceReads | None:
    """The splice READ path (fuse/splicereads.py), or None (off, or pipes too small)."""
    if mode == "off":
        return None
    reason = splicereads.pipe_bytes_available() or splicereads.splice_refused()
    if reason:
        log.info("large files are read without splice: %s", reason)
        return None
    return SpliceReads(session, extents)


def _log_counts(session: Session, backend: Backend, extents: ExtentReaders | None = None,
                splice: SpliceReads | None = None, files: SpaceFiles | None = None) -> None:
    """Two lines: the requests the kernel sent and the calls made to the
    daemon, by kind (`dlfs.tools.launch.MountProcess.request_counts` parses them);
    one for the checkpoint files open and committed, one for the files read
    from the extents and one for the READs answered by splice."""
    log.info("daemon calls: %s", json.dumps(dict(sorted(backend.calls.items()))))
    log.info("requests: %s", json.dumps(dict(sorted(session.counts.items()))))
    if files is not None:
        log.info("space files: %s", json.dumps(files.open_counts()))
    if extents is not None:
        log.info("extent reads: %s", json.dumps(extents.counts()))
    if splice is not None:
        log.info("splice reads: %s", json.dumps({"reads": splice.reads, "bytes": splice.bytes,
                                                 "stored_bytes": splice.stored_bytes,
                                                 "off": splice.off_reason}))


def _raise_open_files_limit() -> None:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit: on the daemon's host
    the mount holds a descriptor per extent of every dataset it reads (1 GiB each by
    default), and the usual soft limit of 1024 would cap that at about a terabyte.
    A dataset that still needs more is read through the daemon (the log says why)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.debug("open-files limit stays at %d: %s", soft, exc)


def _keep_freed_memory() -> None:
    """Let glibc reuse freed multi-MiB buffers instead of unmapping them.

    Every received piece of a read (4 MiB) is a fresh allocation; by default
    glibc maps each one anew and the first touch of every page faults, which
    costs about a sixth of large-file read bandwidth here.  Raising the mmap
    and trim thresholds keeps freed pieces in the heap for the next ones.
    What the heap keeps is bounded by what the mount holds at once
    (`read_cache_bytes_max` plus pieces in flight).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # not glibc: nothing to tune
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    if not (libc.mallopt(m_mmap_threshold, fuse_limits.mount_malloc_mmap_threshold_bytes) and
            libc.mallopt(m_trim_threshold, fuse_limits.mount_malloc_trim_threshold_bytes)):
        log.debug("mallopt refused the thresholds; large reads allocate mapped memory")


def _setup_logging(args: argparse.Namespace) -> None:
    """Log to --log-file, else to standard error (a --foreground mount: systemd's
    journal, Slurm's job log)."""
    level = logging.DEBUG if args.debug else logging.INFO
    logs.configure(level, args.log_format, program="dlfs-mount", path=args.log_file)


if __name__ == "__main__":
    sys.exit(main())
