"""An ingest's sending pace: at most so many bytes a second, on average.

Staging a dataset onto a burst-buffer node that is already feeding a
training job competes with that job for the node's disks and network; an
operator caps the ingest (`dlfs ingest --max-rate 200MiB`) and the reads
keep their share.  `Pace` is the virtual clock behind it: every chunk
moves the time the next byte may leave by len/rate; a sender that is ahead
sleeps, one that fell behind (a slow source) may catch up by at most
`limits.ingest_rate_burst_s` worth of bytes, not more.
"""

from __future__ import annotations

import time
from typing import Callable

from dlfs import limits
from dlfs.errors import InvalidArgument
from dlfs.units import size_text


class Pace:
    """Bytes spent at most `bytes_per_s` on average (`spend` sleeps to keep it so)."""

    def __init__(self, bytes_per_s: int, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        check_rate(bytes_per_s)
        self.bytes_per_s = bytes_per_s
        self._clock, self._sleep = clock, sleep
        # When the next byte may leave; a sender may be up to one burst early.
        self._next = clock() - limits.ingest_rate_burst_s

    def spend(self, nbytes: int) -> None:
        """Account for `nbytes` about to be sent; first sleep while ahead of the pace."""
        now = self._clock()
        self._next = max(self._next, now - limits.ingest_rate_burst_s)
        self._next += nbytes / self.bytes_per_s
        ahead = self._next - now
        if ahead > 0:
            self._sleep(ahead)


def check_rate(bytes_per_s: int) -> None:
    """Raises InvalidArgument for a rate below `limits.ingest_rate_min`."""
    if bytes_per_s < limits.ingest_rate_min:
        raise InvalidArgument(f"an ingest rate of {bytes_per_s} bytes/s is below the least "
                              f"allowed, {size_text(limits.ingest_rate_min)}/s: give a larger "
                              "--max-rate (e.g. 100MiB), or none for no cap")


def pace_for(bytes_per_s: int | None) -> Pace | None:
    """A `Pace` for a cap of `bytes_per_s`; None (no cap) for None."""
    return None if bytes_per_s is None else Pace(bytes_per_s)
