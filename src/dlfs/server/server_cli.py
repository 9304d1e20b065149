"""`dlfs-server`: the storage daemon's command line.

    dlfs-server --data-dir DIR [--listen HOST:PORT] [--address-file FILE] [--demo]

SIGTERM and SIGINT stop it cleanly: running calls get a grace period,
running ingests are discarded, the catalog is flushed.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import time

from dlfs import limits, logs
from dlfs.errors import DlfsError
from dlfs.server.config import SETTINGS_HELP, ServerConfig

log = logging.getLogger("dlfs.server")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dlfs-server",
        description="DLFS storage daemon: serves datasets packed in extent files over gRPC.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--data-dir", required=True,
                        help="directory for extents and the catalog (created with mode 0700)")
    parser.add_argument("--listen", default=ServerConfig.listen,
                        help="HOST:PORT to serve on; PORT 0 picks a free port. Loopback by "
                             "default: exposing the daemon on other interfaces is a choice")
    parser.add_argument("--address-file",
                        help="write the bound HOST:PORT here once the daemon is serving")
    parser.add_argument("--etcd", default=os.environ.get("DLFS_ETCD", ""), metavar="URL[,URL...]",
                        help="join the cluster whose control plane is this etcd (client URLs, "
                             "e.g. http://10.0.0.1:2379; default $DLFS_ETCD): the daemon "
                             "registers as a member and commits striped datasets as etcd "
                             "decides. Without it the daemon runs on its own")
    parser.add_argument("--cluster", default=os.environ.get("DLFS_CLUSTER", "default"),
                        help="the cluster's name in etcd (several clusters may share one etcd; "
                             "default $DLFS_CLUSTER or %(default)s)")
    parser.add_argument("--advertise", default="", metavar="HOST:PORT",
                        help="with --etcd: the gRPC address other hosts reach this daemon at "
                             "(default: the bound --listen address)")
    parser.add_argument("--demo", action="store_true",
                        help="create the small generated dataset 'demo' if it is missing")
    parser.add_argument("--verify", choices=("request", "always", "never"),
                        default=ServerConfig.verify,
                        help="CRC32C checks on read: per request (default on), always, never")
    parser.add_argument("--salvage-catalog", action="store_true",
                        help="start even if the catalog is damaged mid-log, keeping only the "
                             "records before the damage")
    parser.add_argument("--metrics-listen", default="", metavar="[HOST:]PORT",
                        help="serve Prometheus metrics at http://HOST:PORT/metrics (PORT 0 "
                             "picks one; `dlfs status` shows it); a PORT alone listens on "
                             "127.0.0.1; off by default")
    parser.add_argument("--insecure", action="store_true",
                        help="allow a --listen address other hosts can reach without both TLS "
                             "and --tokens-file (anyone who reaches it may then read, and "
                             "without tokens also ingest and delete)")
    parser.add_argument("--tls-cert", default="", metavar="PEM",
                        help="serve TLS with this certificate (chain); needs --tls-key")
    parser.add_argument("--tls-key", default="", metavar="PEM", help="private key of --tls-cert")
    parser.add_argument("--tls-client-ca", default="", metavar="PEM",
                        help="require client certificates signed by this CA (mutual TLS)")
    parser.add_argument("--tokens-file", default="", metavar="FILE",
                        help="require tokens: lines 'read TOKEN' or 'admin TOKEN'; read tokens "
                             "may read, admin tokens may also ingest and delete")
    parser.add_argument("--log-level", default="INFO",
                        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="DEBUG also logs every finished RPC with its duration")
    parser.add_argument("--log-format", default="text", choices=logs.FORMATS,
                        help="text lines, or one JSON object per line; both carry the "
                             "request id of the RPC being served")
    parser.add_argument("--data-socket", default="", metavar="PATH|@NAME",
                        help="Unix socket of the data path for clients on this host: a path, "
                             "@NAME in the abstract namespace, or 'none' (default: @dlfs-PORT "
                             "with the gRPC port)")
    parser.add_argument("--warm-on-first-read", choices=("on", "off"), default="on",
                        help="read a dataset's extents into the page cache in the background "
                             "when it is first read (within --warm-memory-share)")
    parser.add_argument("--io-uring", choices=("on", "off"), default="on",
                        help="read the cached pieces of a window with one io_uring "
                             "submission instead of one preadv each (where the kernel "
                             "allows io_uring)")
    parser.add_argument("--sendfile", choices=("on", "off"), default="on",
                        help="on the data path, send windows of large cached samples with "
                             "sendfile from the page cache instead of reading them into a "
                             "buffer first")
    defaults = ServerConfig(data_dir=".")
    for field, help_text in SETTINGS_HELP.items():
        default = getattr(defaults, field)
        parser.add_argument("--" + field.replace("_", "-"), type=type(default),
                            default=default, help=help_text)
    return parser


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(ServerConfig)
              if hasattr(args, f.name)}
    values["warm_on_first_read"] = getattr(args, "warm_on_first_read", "on") == "on"
    values["io_uring"] = getattr(args, "io_uring", "on") == "on"
    values["sendfile"] = getattr(args, "sendfile", "on") == "on"
    return ServerConfig(**values)


def ingest_demo(store) -> None:
    """Create the demo dataset through the same ingest path clients use."""
    from dlfs.server.demo_dataset import DEMO_DATASET, demo_files

    if store.directory.find(DEMO_DATASET) is not None:
        return
    session = store.ingests.begin(DEMO_DATASET)
    try:
        for path, data in demo_files():
            session.start_file(path, len(data), 0o100644, session.created_ns)
            session.write(data)
    except BaseException as exc:
        store.ingests.abort(session, str(exc))
        raise
    summary = store.ingests.commit(session)  # aborts the ingest itself when it fails
    log.info("created dataset %r: %d samples, %d bytes", summary.name, summary.samples,
             summary.bytes)


def write_address_file(path: str, address: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(address + "\n")
    os.replace(tmp, path)  # readers never see a half-written address


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level, args.log_format, program="dlfs-server")
    from dlfs.server.core import faults
    from dlfs.server.daemon import Daemon
    from dlfs.server.store import Store

    try:
        faults.install_from_env()  # a test hook: DLFS_FAULT=OP:N:ACTION (faults.py)
        config = config_from_args(args)
        store = Store.open(config)
    except (ValueError, RuntimeError, DlfsError, OSError) as exc:
        print(f"dlfs-server: {exc}", file=sys.stderr)
        return 2
    try:
        daemon = Daemon(store)
        if args.demo:
            ingest_demo(store)
        address = daemon.start()
    except BaseException as exc:
        store.close()
        print(f"dlfs-server: {exc}", file=sys.stderr)
        return 2
    # The handler only records the signal: a handler that takes a lock
    # (Event.set) can deadlock when a second signal arrives while the first
    # holds it, which Slurm's step signals do.
    stop_signals: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, _frame: stop_signals.append(signum))
    faults.serving()
    if args.address_file:
        write_address_file(args.address_file, address)
    log.info("serving on %s (data dir %s, %d reader threads)", address,
             os.path.abspath(config.data_dir), config.reader_threads)
    print(f"dlfs-server listening on {address}", flush=True)
    while not stop_signals:
        time.sleep(limits.shutdown_poll_s)
    log.info("shutting down (signal %d)", stop_signals[0])
    daemon.stop()
    log.info("stopped; catalog flushed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
