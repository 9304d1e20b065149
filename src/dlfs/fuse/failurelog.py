"""Failures logged at most once per interval per kind: a dead daemon gives a
few log lines, not one per failed read."""

from __future__ import annotations

import logging
import time

from dlfs import limits as fuse_limits

log = logging.getLogger("dlfs.fuse.fs")


class FailureLog:
    """Logs failures at most once per `interval_s` per kind, with a count of
    the ones held back, so a dead daemon gives a few lines, not one per read."""

    def __init__(self, interval_s: float = fuse_limits.mount_error_log_interval_s):
        self.interval_s = interval_s
        self._last: dict[str, tuple[float, int]] = {}

    def __call__(self, level: int, kind: str, message: str) -> None:
        now = time.monotonic()
        last, held = self._last.get(kind, (-self.interval_s, 0))
        if now - last < self.interval_s:
            self._last[kind] = (last, held + 1)
            return
        self._last[kind] = (now, 0)
        suffix = f" ({held} more like it in the last {now - last:.0f} s)" if held else ""
        log.log(level, "%s%s", message, suffix)
