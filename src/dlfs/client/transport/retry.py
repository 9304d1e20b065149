"""The one retry rule for calls to a daemon: UNAVAILABLE is waited out, within bounds.

A daemon that is restarting refuses connections for a moment; a read or
metadata call that fails with UNAVAILABLE is therefore tried again after a
pause (`limits.retry_backoff_s`, growing), as long as the next attempt
starts before the caller's give-up time and fewer than
`limits.call_attempts_max` attempts were made.  Every other failure, and
UNAVAILABLE past those bounds, raises the typed error of `dlfs.errors`
naming the daemon.  Calls that change state (ingest, delete, commit) are
made with `timeout_s=0`: one attempt.

A daemon this process has never reached is given at most
`limits.first_contact_timeout_s`: nothing is restarting there, most likely
nothing runs there at all, and the caller learns it in seconds, not after
the whole reconnect window.  Once any call reached it (an answer, or an
error the daemon sent), it is waited for up to the caller's `timeout_s`.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

import grpc

from dlfs import limits
from dlfs.client.transport.grpc_errors import from_rpc_error
from dlfs.errors import DlfsError, Unavailable

T = TypeVar("T")

# Addresses of the daemons that answered a call of this process: one entry per
# daemon it ever talked to (a handful), so never trimmed.
_reached: set[str] = set()


def reached(address: str) -> bool:
    """Whether a call of this process has reached the daemon at `address`."""
    return address in _reached


def call_with_retry(attempt: Callable[[], T], *, address: str, timeout_s: float,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> T:
    """`attempt()`, repeated while it fails with UNAVAILABLE and the bounds allow.

    `attempt` makes one call and raises `grpc.RpcError` (a gRPC call) or a
    DlfsError (the data path) when it fails; other exceptions pass through
    untouched.  Retries stop when the next pause would end later than
    `timeout_s` after the first attempt (`limits.first_contact_timeout_s` at
    most for a daemon not reached before), or after `limits.call_attempts_max`
    attempts.  Raises the DlfsError of the last failure (gRPC failures are
    translated by `dlfs.client.transport.grpc_errors.from_rpc_error`).
    """
    if address not in _reached:
        timeout_s = min(timeout_s, limits.first_contact_timeout_s)
    give_up = clock() + timeout_s
    backoff = limits.retry_backoff_s
    for number in range(limits.call_attempts_max):
        try:
            result = attempt()
        except grpc.RpcError as exc:
            error: DlfsError = from_rpc_error(exc, address)
        except Unavailable as exc:
            error = exc
        else:
            _reached.add(address)
            return result
        if not isinstance(error, Unavailable):
            _reached.add(address)  # the daemon answered, with an error
        pause = backoff[min(number, len(backoff) - 1)]
        if (not isinstance(error, Unavailable) or number + 1 == limits.call_attempts_max
                or clock() + pause > give_up):
            raise error
        sleep(pause)
    raise AssertionError("unreachable: the last attempt raises")
