"""`dlfs-server`: the storage daemon's command line.

    dlfs-server --data-dir DIR [--listen HOST:PORT] [--address-file FILE] [--demo]
    dlfs-server --config /etc/dlfs/server.toml [--FLAG VALUE ...]
    dlfs-server --data-dir DIR --listen 0.0.0.0:7010 --etcd http://10.0.0.1:2379 ...
    dlfs-server [--config FILE] [flags] --print-config

Settings come from flags, else from the TOML file of --config (see
`dlfs.server.config_file`), else the environment ($DLFS_ETCD, $DLFS_CLUSTER),
else their defaults; --print-config prints the
effective settings as such a file and exits.  SIGTERM and SIGINT stop the
daemon cleanly: running calls get a grace period, running ingests are
discarded, the catalog is flushed.  Exit status 2: the settings are wrong or
the daemon cannot start (one line on stderr says why).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time

from dlfs import limits, logs
from dlfs.errors import DlfsError
from dlfs.server import config_file
from dlfs.server.config import SETTINGS_HELP, ServerConfig
from dlfs.units import parse_size, size_text
from dlfs.version import __version__

log = logging.getLogger("dlfs.server")

ON_OFF = ("on", "off")
# Settings given as on/off on the command line (booleans in a --config file).
ON_OFF_SETTINGS = ("warm_on_first_read", "io_uring", "sendfile", "mapped_sends")


def _default_text(key: str) -> str:
    """" (default: X)" for help, X as a person reads it; "" where there is nothing to show."""
    value = config_file.DEFAULTS[key]
    if key in ON_OFF_SETTINGS:
        return f" (default: {'on' if value else 'off'})"
    if isinstance(value, bool) or value == "" or key == "reader_threads":
        return ""  # flags, empty settings, and reader_threads (its help says)
    if config_file.is_size(key) and isinstance(value, int):
        return f" (default: {size_text(value).replace(' ', '')})"  # as a flag takes it
    return f" (default: {value:g})" if isinstance(value, float) else f" (default: {value})"


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The command line.  No option has a default here: what is not given is absent from
    the namespace, so a --config file's value stands (`config_file.effective`)."""
    parser = argparse.ArgumentParser(
        prog="dlfs-server", argument_default=argparse.SUPPRESS,
        description="DLFS storage daemon: serves datasets packed in extent files over gRPC.",
        epilog="Every setting may also be given in the TOML file of --config, named like "
               "its flag with '_' for '-' (data_dir = \"/var/lib/dlfs\"); flags override "
               "the file.  Sizes take binary units: 64MiB, 1GiB.")

    def option(flag: str, help_text: str, **kwargs) -> None:
        key = flag[2:].replace("-", "_")
        parser.add_argument(flag, help=help_text + _default_text(key), **kwargs)

    parser.add_argument("--version", action="version", version=f"dlfs-server {__version__}",
                        help="print the version and exit")
    parser.add_argument("--config", metavar="FILE",
                        help="read settings from this TOML file (flags override it)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the effective settings (flags over --config over defaults) "
                             "as a --config file, and exit")
    parser.add_argument("--data-dir", metavar="DIR",
                        help="directory for extents and the catalog (created with mode 0700); "
                             "required, here or in --config")
    option("--listen", "HOST:PORT to serve on; PORT 0 picks a free port. Loopback by "
                       "default: exposing the daemon on other interfaces is a choice",
           metavar="HOST:PORT")
    option("--address-file", "write the bound HOST:PORT here once the daemon is serving",
           metavar="FILE")
    option("--demo", "create the small generated dataset 'demo' if it is missing",
           action="store_true")
    option("--etcd", "join the cluster whose control plane is this etcd (client URLs, e.g. "
                     "http://10.0.0.1:2379; default $DLFS_ETCD): the daemon registers as a "
                     "member and commits striped datasets as etcd decides.  Without it the "
                     "daemon runs on its own", metavar="URL[,URL...]")
    option("--cluster", "with --etcd: the cluster's name there (several clusters may share "
                        "one etcd); $DLFS_CLUSTER when set", metavar="NAME")
    option("--advertise", "with --etcd: the gRPC HOST:PORT other hosts reach this daemon at "
                          "(default: the bound --listen address; this host's name for "
                          "0.0.0.0 or [::])", metavar="HOST:PORT")
    option("--verify", "CRC32C checks on read: per request (on unless the call opts out), "
                       "always, never", choices=("request", "always", "never"))
    option("--salvage-catalog", "start even if the catalog is damaged mid-log, keeping only "
                                "the records before the damage", action="store_true")
    option("--metrics-listen", "serve Prometheus metrics at http://HOST:PORT/metrics (PORT 0 "
                               "picks one; `dlfs status` shows it); a PORT alone listens on "
                               "127.0.0.1; off unless given", metavar="[HOST:]PORT")
    option("--insecure", "allow a --listen address other hosts can reach without both TLS "
                         "and --tokens-file (anyone who reaches it may then read, and "
                         "without tokens also ingest and delete)", action="store_true")
    option("--tls-cert", "serve TLS with this certificate (chain); needs --tls-key",
           metavar="PEM")
    option("--tls-key", "private key of --tls-cert", metavar="PEM")
    option("--tls-client-ca", "require client certificates signed by this CA (mutual TLS)",
           metavar="PEM")
    option("--tokens-file", "require tokens: lines 'read TOKEN' or 'admin TOKEN'; read tokens "
                            "may read, admin tokens may also ingest and delete", metavar="FILE")
    option("--log-level", "DEBUG also logs every finished RPC with its duration",
           choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    option("--log-format", "text lines, or one JSON object per line; both carry the "
                           "request id of the RPC being served", choices=logs.FORMATS)
    option("--data-socket", "Unix socket of the data path for clients on this host: a path, "
                            "@NAME in the abstract namespace, or 'none' (default: @dlfs-PORT "
                            "with the gRPC port)", metavar="PATH|@NAME")
    option("--warm-on-first-read", "read a dataset's extents into the page cache in the "
                                   "background when it is first read (within "
                                   "--warm-memory-share)", choices=ON_OFF)
    option("--io-uring", "read the cached pieces of a window with one io_uring submission "
                         "instead of one preadv each (where the kernel allows io_uring)",
           choices=ON_OFF)
    option("--sendfile", "on the data path, send windows of large cached samples with "
                         "sendfile from the page cache instead of reading them into a buffer "
                         "first", choices=ON_OFF)
    option("--mapped-sends", "on the data path, send windows of small samples whose pages "
                             "the page cache holds (of any size, to a client on this "
                             "host over TCP) from read-only mappings of the extents "
                             "instead of reading them into a buffer first",
           choices=ON_OFF)
    for key, help_text in SETTINGS_HELP.items():
        kind = type(config_file.DEFAULTS[key])
        if config_file.is_size(key):
            option("--" + key.replace("_", "-"), help_text, type=_size, metavar="SIZE")
        else:
            option("--" + key.replace("_", "-"), help_text, type=kind,
                   metavar="S" if key.endswith("_s") else "N" if kind is int else "X")
    return parser


def settings_from(args: argparse.Namespace) -> dict[str, object]:
    """The effective settings: the flags given, over --config's file, over defaults.
    Raises ValueError (a bad file)."""
    given = dict(vars(args))
    path = given.pop("config", None)
    given.pop("print_config", None)
    for key in ON_OFF_SETTINGS:
        if key in given:
            given[key] = given[key] == "on"
    from_file = config_file.read_config_file(path) if path else {}
    return config_file.effective(from_file, given, os.environ)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The ServerConfig the command line (and its --config file) describes.  Raises
    ValueError."""
    settings = settings_from(args)
    if "data_dir" not in settings:
        raise ValueError("give --data-dir DIR, or data_dir in the --config file")
    return config_file.server_config(settings)


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


def _cannot_start(exc: BaseException, json_log: bool) -> int:
    """Say why the daemon cannot start (a JSON log line with --log-format json, so the
    stream stays JSON; else one plain line); exit status 2."""
    if json_log:
        log.critical("cannot start: %s", exc)
    else:
        print(f"dlfs-server: {exc}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from(args)
        config_file.server_config({"data_dir": ".", **settings})  # every value checked
    except ValueError as exc:
        print(f"dlfs-server: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "print_config", False):
        sys.stdout.write(config_file.to_toml(settings))
        return 0
    logs.configure(settings["log_level"], settings["log_format"], program="dlfs-server")
    json_log = settings["log_format"] == "json"
    from dlfs.server.core import faults
    from dlfs.server.daemon import Daemon
    from dlfs.server.store import Store

    try:
        faults.install_from_env()  # a test hook: DLFS_FAULT=OP:N:ACTION (faults.py)
        if "data_dir" not in settings:
            raise ValueError("give --data-dir DIR, or data_dir in the --config file")
        config = config_file.server_config(settings)
        store = Store.open(config)
    except (ValueError, RuntimeError, DlfsError, OSError) as exc:
        return _cannot_start(exc, json_log)
    try:
        daemon = Daemon(store, log_format=settings["log_format"])
        if settings["demo"]:
            ingest_demo(store)
        address = daemon.start()
    except BaseException as exc:
        store.close()
        return _cannot_start(exc, json_log)
    # The handler only records the signal: a handler that takes a lock
    # (Event.set) can deadlock when a second signal arrives while the first
    # holds it, which Slurm's step signals do.
    stop_signals: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, _frame: stop_signals.append(signum))
    faults.serving()
    if settings["address_file"]:
        write_address_file(str(settings["address_file"]), address)
    # A log line, not a print: in --log-format json every line of the output is JSON.
    log.info("dlfs-server %s serving on %s (data dir %s, %d reader threads)", __version__,
                address, os.path.abspath(config.data_dir), config.reader_threads,
                extra={"address": address})
    while not stop_signals:
        time.sleep(limits.shutdown_poll_s)
    log.info("shutting down (signal %d)", stop_signals[0])
    daemon.stop()
    log.info("stopped; catalog flushed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
