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
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

from dlfs import limits
from dlfs.errors import Unavailable

T = TypeVar("T")


def call_with_retry(attempt: Callable[[], T], *, timeout_s: float,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> T:
    """`attempt()`, repeated while it raises Unavailable and the bounds allow.

    Retries stop when the next pause would end later than `timeout_s` after
    the first attempt, or after `limits.call_attempts_max` attempts; then
    the last Unavailable is raised.  Any other exception passes through at
    once.
    """
    give_up = clock() + timeout_s
    backoff = limits.retry_backoff_s
    for number in range(limits.call_attempts_max):
        try:
            return attempt()
        except Unavailable:
            pause = backoff[min(number, len(backoff) - 1)]
            if number + 1 == limits.call_attempts_max or clock() + pause > give_up:
                raise
        sleep(pause)
    raise AssertionError("unreachable: the last attempt raises")
