"""Accepts that fail for want of room (descriptors, kernel memory): the episodes of
such failures that the log reports (once when one starts, once when it ends); which
errors mean what is `dlfs.sockio`'s.  Nothing here imports grpc."""

from __future__ import annotations

import errno
import logging
import resource
import threading
import time

from dlfs import limits

log = logging.getLogger(__name__)


class AcceptEpisodes:
    """Episodes of failed accepts (out of descriptors or memory), for the log: one line
    when an episode starts and one when accepts succeed again, however often a
    daemon at its limit flaps between the two.  Failures less than
    `limits.datapath_accept_episode_s` apart are one episode.  Thread-safe (the
    accept loops of both listeners share one)."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._last_failure: float | None = None
        self._since = 0.0
        self._failures = 0
        self._recovered = True
        # The last accept failed for want of room (read without the lock: a hint).
        self.short = False

    def failed(self, label: str, exc: OSError) -> None:
        now = self._clock()
        with self._lock:
            new = self._last_failure is None or \
                now - self._last_failure > limits.datapath_accept_episode_s
            self._last_failure = now
            if new:
                self._since, self._failures, self._recovered = now, 0, False
            self._failures += 1
            self.short = True
        if new:
            log.warning("cannot accept data path connections on the %s: %s (%s); telling "
                        "waiting clients to read through gRPC, and trying again (RLIMIT_NOFILE "
                        "%d: raise it, e.g. LimitNOFILE= in the systemd unit, if this recurs)",
                        label, exc.strerror, errno.errorcode.get(exc.errno, exc.errno),
                        resource.getrlimit(resource.RLIMIT_NOFILE)[0])

    def accepted(self, label: str) -> None:
        self.short = False
        if self._recovered:  # the common case (no episode, or its end said), without the lock
            return
        with self._lock:
            if self._recovered:
                return
            self._recovered = True
            failures, since = self._failures, self._since
        log.warning("accepting data path connections again (on the %s) after %d failed "
                    "accepts in %.1f s", label, failures, self._clock() - since)
