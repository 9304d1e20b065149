"""The one retry rule for calls to a daemon: Unavailable is waited out, within bounds.

A daemon that is restarting refuses connections for a moment; a read or
metadata call that fails with Unavailable is therefore tried again after a
pause (`limits.retry_backoff_s`, growing), as long as the next attempt
starts before the caller's give-up time and fewer than
`limits.call_attempts_max` attempts were made.  Every other failure, and
Unavailable past those bounds, is raised as it is.  Calls that change state
(ingest, delete, commit) are made with `timeout_s=0`: one attempt.

Transport-neutral: an attempt raises the typed errors of `dlfs.errors`
(the gRPC transport converts gRPC's failures inside its attempts,
`grpc_errors.from_rpc_error`; the data path raises them itself).

A daemon this process has never reached (calls name it with `address`) is
given at most `limits.first_contact_timeout_s`: nothing is restarting
there, most likely nothing runs there at all, and the caller learns it in
seconds, as the CLI does, not after the whole reconnect window.  Once a
call reached it (an answer, or an error the daemon sent), it is waited for
up to the caller's `timeout_s`.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

from dlfs import limits
from dlfs.errors import DlfsError, Unavailable

T = TypeVar("T")

# Addresses of the daemons that answered a call of this process: one entry per
# daemon it ever talked to (a handful), so never trimmed.
_reached: set[str] = set()


def reached(address: str) -> bool:
    """Whether a call of this process has reached the daemon at `address`."""
    return address in _reached


def call_with_retry(attempt: Callable[[], T], *, timeout_s: float, address: str = "",
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> T:
    """`attempt()`, repeated while it raises Unavailable and the bounds allow.

    Retries stop when the next pause would end later than `timeout_s` after
    the first attempt (`limits.first_contact_timeout_s` at most when
    `address`, the daemon called, has never been reached by this process),
    or after `limits.call_attempts_max` attempts; then the last Unavailable
    is raised.  Any other exception passes through at once.
    """
    if address and address not in _reached:
        timeout_s = min(timeout_s, limits.first_contact_timeout_s)
    give_up = clock() + timeout_s
    backoff = limits.retry_backoff_s
    for number in range(limits.call_attempts_max):
        try:
            result = attempt()
        except Unavailable:
            pause = backoff[min(number, len(backoff) - 1)]
            if number + 1 == limits.call_attempts_max or clock() + pause > give_up:
                raise
        except DlfsError:
            if address:
                _reached.add(address)  # the daemon answered, with an error
            raise
        else:
            if address:
                _reached.add(address)
            return result
        sleep(pause)
    raise AssertionError("unreachable: the last attempt raises")
