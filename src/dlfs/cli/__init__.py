"""`dlfs`: the command-line client.

    dlfs [GLOBAL OPTIONS] COMMAND [OPTIONS] [GLOBAL OPTIONS]

    dlfs ingest SOURCE [SOURCE...] NAME [--replace] [--replicas N] [--archives] [--resume] ...
    dlfs datasets | ls NAME[/DIR] [-l] | stat NAME/PATH | cat NAME/PATH | status
    dlfs warm NAME | scrub NAME | rm NAME [NAME...] | discard NAME [NAME...]
    dlfs --etcd URL rebalance NAME [--replicas N] [--members A,B] [--source ADDR]

Global options, before or after the command: `--server HOST[:PORT]` (one
daemon; port 7010 when none is given) or `--etcd URL[,URL...]` with
`--cluster NAME` (a cluster of daemons, found in its etcd); with neither,
$DLFS_ETCD, else $DLFS_SERVER, else 127.0.0.1:7010 (`target`).  Also
`--token`, `--tls-ca`, `--json` (datasets, ls, stat, status), `--version`.
Errors print one line on stderr and exit with status 1 (2 for usage errors,
130 after Ctrl-C).

Modules: `arguments` (the parser), `target` (one daemon or a cluster),
`entry` (`main`: runs a command, turns errors into exit statuses),
`ingest_command`, `listing_commands` (datasets, ls, stat, cat, status),
`admin_commands` (warm, scrub, rebalance, rm, discard).
"""

from dlfs.cli.entry import main

__all__ = ["main"]
