"""Scrubbing a dataset from the client: every daemon verifies its samples, one report.

Each daemon that stores part of the dataset checks every sample it holds
against its CRC32C (the Scrub stream, `DaemonControl.scrub`); the client
sums up their reports and shows one daemon's progress on a terminal.
"""

from __future__ import annotations

import dataclasses
import sys

from dlfs.client.transport.contract import DaemonTransport
from dlfs.errors import Unavailable
from dlfs.types import Entry


@dataclasses.dataclass(frozen=True)
class ScrubReport:
    samples: int
    bytes: int
    damaged: list  # (Entry, reason) of each sample that failed its checksum


def scrub_member(member: DaemonTransport, name: str, show: bool) -> ScrubReport:
    """One daemon's scrub of its samples of `name`, with a progress bar if `show`.
    Raises the daemon's errors; Unavailable when its stream ends before it is done."""
    bar = None
    damaged: list[tuple[Entry, str]] = []
    try:
        for update in member.control.scrub(name):
            if show and bar is None:
                from tqdm import tqdm

                bar = tqdm(total=update.bytes_checked if update.done else None, unit="B",
                           unit_scale=True, unit_divisor=1024, desc=f"scrub {name}",
                           file=sys.stderr)
            if bar is not None:
                bar.update(update.bytes_checked - bar.n)
            damaged.extend(zip(update.damaged, update.reasons))
            if update.done:
                return ScrubReport(update.samples_checked, update.bytes_checked, damaged)
    finally:
        if bar is not None:
            bar.close()
    raise Unavailable(f"the scrub of {name!r} on {member.address} ended early")


def summed(reports: list[ScrubReport]) -> ScrubReport:
    """The reports of several daemons as one."""
    return ScrubReport(sum(r.samples for r in reports), sum(r.bytes for r in reports),
                       [d for r in reports for d in r.damaged])
