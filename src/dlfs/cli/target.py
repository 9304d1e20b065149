"""Where a `dlfs` command goes: one daemon (`--server`) or a cluster (`--etcd`).

`--server` or `--etcd`, not both; with neither, $DLFS_ETCD when set, else
$DLFS_SERVER, else 127.0.0.1:7010.  A flag beats the environment.  Advice a
command prints names the same target (`target_options`), so it runs as
printed.
"""

from __future__ import annotations

import argparse
import os

from dlfs import limits
from dlfs.client import daemon_addresses
from dlfs.errors import InvalidArgument
from dlfs.coord.cluster_keys import CLUSTER_DEFAULT

DEFAULT_SERVER = f"127.0.0.1:{limits.daemon_port_default}"
SERVER_ENV = "DLFS_SERVER"
ETCD_ENV = "DLFS_ETCD"
CLUSTER_ENV = "DLFS_CLUSTER"


def resolve_target(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Settle where the command goes: `args.server` (one daemon) or `args.etcd` and
    `args.cluster` (a cluster), the other None.  A flag beats the environment
    (module docstring); both flags given, or a malformed address, is a usage error
    (exit 2)."""
    if args.server and args.etcd:
        parser.error("give --server (one daemon) or --etcd (a cluster), not both")
    if not args.server and not args.etcd:
        args.etcd = os.environ.get(ETCD_ENV) or None
        if not args.etcd:
            args.server = os.environ.get(SERVER_ENV) or DEFAULT_SERVER
    if args.server:
        try:
            daemon_addresses(args.server)
        except InvalidArgument as exc:
            parser.error(f"--server: {exc.message}")
    args.cluster = (args.cluster or os.environ.get(CLUSTER_ENV) or CLUSTER_DEFAULT) \
        if args.etcd else None


def client_target(args: argparse.Namespace) -> dict:
    """`Client` keyword arguments for the target `resolve_target` settled."""
    if args.etcd:
        return dict(etcd=args.etcd, cluster=args.cluster)
    return dict(address=args.server)


def target_options(args: argparse.Namespace) -> list[str]:
    """The options that name the same target in a printed command (advice):
    ["--server", ADDR] or ["--etcd", URLS, "--cluster", NAME]."""
    if args.etcd:
        return ["--etcd", args.etcd, "--cluster", args.cluster]
    return ["--server", args.server]
