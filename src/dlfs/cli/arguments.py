"""The `dlfs` command line: global options accepted anywhere, one subparser per command.

Global options (`--server`, `--etcd`, `--cluster`, `--token`, `--tls-ca`,
`--json`, `--version`) may stand before or after the command (`dlfs --server
A ls x` and `dlfs ls x --server A` mean the same): the main parser holds
their defaults, and every command's parser repeats them with no default of
its own, so a value given after the command replaces the main parser's and
nothing else does.
"""

from __future__ import annotations

import argparse
import os
from typing import Callable

from dlfs.cli import admin_commands, ingest_command, listing_commands
from dlfs.cli.target import CLUSTER_ENV, DEFAULT_SERVER, ETCD_ENV, SERVER_ENV
from dlfs.coord.cluster_keys import CLUSTER_DEFAULT
from dlfs.version import __version__


USAGE_EPILOG = (
    "Global options may also follow the command (dlfs ls demo --server HOST:PORT).  "
    "Errors print one line on stderr and exit 1; usage errors exit 2; Ctrl-C exits 130.")


def _add_global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The options every command takes.  Without `defaults` (a command's own parser)
    an option that is not given sets nothing, so the main parser's value stands."""
    def default(value):
        return value if defaults else argparse.SUPPRESS

    from_env = os.environ.get(SERVER_ENV)
    parser.add_argument("--server", metavar="HOST[:PORT]", default=default(None),
                        help="one daemon (port 7010 when none is given); default: "
                             + (f"${SERVER_ENV}, now {from_env}" if from_env else
                                f"${SERVER_ENV}, else {DEFAULT_SERVER}")
                             + f", unless ${ETCD_ENV} is set")
    etcd_env = os.environ.get(ETCD_ENV)
    parser.add_argument("--etcd", metavar="URL[,URL...]", default=default(None),
                        help="a cluster of daemons: its etcd's client URLs, e.g. "
                             "http://10.0.0.1:2379; datasets are striped over its live "
                             f"members (default: ${ETCD_ENV}"
                             + (f", now {etcd_env})" if etcd_env else ")"))
    parser.add_argument("--cluster", metavar="NAME", default=default(None),
                        help=f"with --etcd: the cluster's name there (default: ${CLUSTER_ENV}, "
                             f"else {CLUSTER_DEFAULT})")
    parser.add_argument("--token", default=default(None),
                        help="token for a daemon started with --tokens-file (default: "
                             "$DLFS_TOKEN)")
    parser.add_argument("--tls-ca", metavar="PEM", default=default(None),
                        help="CA of the daemon's TLS certificate; turns TLS on (default: "
                             "$DLFS_TLS_CA)")
    parser.add_argument("--json", action="store_true", default=default(False),
                        help="print one JSON document instead of text (datasets, ls, stat, "
                             "status)")
    parser.add_argument("--version", action="version", version=f"dlfs {__version__}",
                        help="print the version and exit")


Command = Callable[..., argparse.ArgumentParser]


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; each command's parser has `run(client, args)` as a default,
    and `json_output` True where it has a JSON form."""
    parser = argparse.ArgumentParser(prog="dlfs", description="DLFS command-line client: "
                                     "ingest, list, read and manage the datasets of DLFS "
                                     "daemons.", epilog=USAGE_EPILOG)
    _add_global_options(parser, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    _add_global_options(common, defaults=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, run, *, description: str = "",
                json_output: bool = False) -> argparse.ArgumentParser:
        """Add command `name`: `summary` in the command list, `description` (default:
        the summary) atop its own --help."""
        p = sub.add_parser(name, help=summary, parents=[common], epilog=USAGE_EPILOG,
                           description=description or summary[0].upper() + summary[1:] + ".")
        p.set_defaults(run=run, json_output=json_output)
        return p

    ingest_command.add_commands(command)
    listing_commands.add_commands(command)
    admin_commands.add_commands(command)
    return parser

