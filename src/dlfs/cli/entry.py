"""`main`: parse the command line, run the command against the daemons, exit status.

Exit statuses: 0 done; 1 the command failed (one line on stderr: the error's
type, message and request id; for a daemon address nobody listens on, how to
name another); 2 a usage error; 130 interrupted (Ctrl-C).
Warnings of the client (a daemon of several is down, reads fail over) are
printed on stderr as ``dlfs: warning: ...``, once each.
"""

from __future__ import annotations

import logging
import sys

from dlfs import limits
from dlfs.cli.arguments import build_parser
from dlfs.cli.target import SERVER_ENV, client_target, resolve_target
from dlfs.cli.ingest_command import EXIT_INTERRUPTED
from dlfs.client import Client
from dlfs.errors import DlfsError, Unavailable


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # `ingest SRC --archives NAME`: positionals after an option
        if args.command != "ingest" or any(e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.paths += extra
    if args.json and not args.json_output:
        parser.error(f"--json: `dlfs {args.command}` has no JSON output (datasets, ls, stat "
                     "and status have)")
    resolve_target(parser, args)
    args.argv = argv  # for advice that repeats the command line
    warnings = _print_warnings()
    try:
        with Client(**client_target(args), reconnect_timeout_s=limits.cli_reconnect_timeout_s,
                    token=args.token, tls_ca=args.tls_ca) as client:
            return args.run(client, args)
    except DlfsError as exc:
        where = f" [request id {exc.request_id}]" if exc.request_id else ""
        print(f"dlfs: {type(exc).__name__}: {exc.message}{_how_to_name(exc, args)}{where}",
              file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("dlfs: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        logging.getLogger("dlfs").removeHandler(warnings)


def _how_to_name(exc: DlfsError, args) -> str:
    """For a refused connection to the one daemon the command went to (nothing listens
    at the address): how to name another; else nothing."""
    if isinstance(exc, Unavailable) and exc.refused and args.server:
        return f" (--server HOST:PORT or ${SERVER_ENV})"
    return ""


def _print_warnings() -> logging.Handler:
    """Send the client's warnings to stderr as `dlfs: warning: MESSAGE` (without a
    handler, Python prints bare messages) until the handler returned is removed."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("dlfs: warning: %(message)s"))
    handler.setLevel(logging.WARNING)
    logging.getLogger("dlfs").addHandler(handler)
    return handler
