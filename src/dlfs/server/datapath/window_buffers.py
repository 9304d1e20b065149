"""The data path's window buffers: a fixed pool a reply reads its windows into.

No allocation per request: a buffer is created on first need and reused
forever, at most `bytes_max // window_bytes` of them, and no peer holds more
than its share at once (`limits.datapath_peer_share` of them by default), so
a client that stops reading its replies cannot starve the others.  Nothing
here imports grpc.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import Iterator

import numpy as np

from dlfs import limits
from dlfs.errors import Overloaded
from dlfs.server.config import peer_share


class WindowBuffers:
    """A fixed pool of window buffers, created on first need, reused forever.  Thread-safe.

    At most `bytes_max // window_bytes` exist (at least one), and one peer holds
    at most `per_peer_max` of them at once (default: `limits.datapath_peer_share`
    of them).  A reply takes one per window it reads and gives it back as soon
    as the window went out or its client stopped taking bytes (`replies`), so a
    client that stopped reading holds none.  A take that finds none it may have
    waits, up to `limits.budget_wait_s_max` or its deadline, and is refused with
    Overloaded.
    """

    def __init__(self, window_bytes: int, bytes_max: int, per_peer_max: int = 0):
        self.window_bytes = window_bytes
        self.count_max = max(1, bytes_max // window_bytes)
        self.per_peer_max = peer_share(self.count_max, per_peer_max)
        self._free: list[np.ndarray] = []
        self._created = 0
        self._held: collections.Counter = collections.Counter()  # peer -> buffers held
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def take(self, peer: str = "", deadline: float | None = None) -> Iterator[np.ndarray]:
        """A buffer for `peer` for the block.  Raises Overloaded."""
        buffer = self._take(peer, deadline)
        try:
            yield buffer
        finally:
            with self._cond:
                self._free.append(buffer)
                self._held[peer] -= 1
                if not self._held[peer]:
                    del self._held[peer]
                self._cond.notify_all()  # waiters differ in whose share they wait for

    def held(self, peer: str) -> int:
        with self._cond:
            return self._held[peer]

    def _take(self, peer: str, deadline: float | None) -> np.ndarray:
        give_up = time.monotonic() + limits.budget_wait_s_max
        if deadline is not None:
            give_up = min(give_up, deadline)
        with self._cond:
            while (self._held[peer] >= self.per_peer_max
                   or (not self._free and self._created >= self.count_max)):
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    raise self._refusal(peer)
                self._cond.wait(remaining)
            self._held[peer] += 1
            if self._free:
                return self._free.pop()
            self._created += 1
        return np.empty(self.window_bytes, dtype=np.uint8)

    def _refusal(self, peer: str) -> Overloaded:
        if self._held[peer] >= self.per_peer_max:
            return Overloaded(
                f"{peer} holds {self._held[peer]} of the data path's {self.count_max} window "
                "buffers, its share, in replies it does not read; read them, or retry later")
        return Overloaded(
            f"every data path window buffer is in use ({self.count_max} of "
            f"{self.window_bytes} bytes, --datapath-buffer-bytes-max); retry later")
