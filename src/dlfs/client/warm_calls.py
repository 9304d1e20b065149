"""Dataset warm-ups from the client: start them, ask how far they got, wait for them.

A warm-up runs on each daemon that stores part of the dataset (see the Warm
RPC in dlfs.proto and dlfs.server.read.warmup): every member is asked.
"""

from __future__ import annotations

import time

from dlfs import limits
from dlfs.client.transport.contract import Transport
from dlfs.errors import DlfsError
from dlfs.types import WarmInfo


def warm(transport: Transport, name: str, *, status_only: bool = False) -> list[WarmInfo]:
    """Start warming dataset `name` on every member (or, with `status_only`, report the
    latest warm-ups); one call per member.  Raises the first member's error when
    none answered."""
    results = transport.each(lambda member: member.control.warm(name, status_only=status_only))
    infos = [info for info in results.values() if not isinstance(info, DlfsError)]
    if not infos:
        raise next(iter(results.values()))
    return infos


def wait(transport: Transport, name: str, *, timeout_s: float | None = None, progress=None
         ) -> list[WarmInfo]:
    """Poll the warm-ups of `name` until all are done (or `timeout_s` passed);
    `progress(infos)` is called after each poll.  Returns the last statuses."""
    give_up = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        infos = warm(transport, name, status_only=True)
        if progress is not None:
            progress(infos)
        if all(info.done for info in infos) or \
                (give_up is not None and time.monotonic() >= give_up):
            return infos
        time.sleep(limits.warm_poll_s)
