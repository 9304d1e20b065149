"""`ClusterView`: what a client knows of its cluster, kept current from etcd.

A `Client(etcd=...)` holds one: the live members (whose leases are alive),
each striped dataset's committed generation with its member list, and the
changes in flight.  A watch on the cluster's prefix re-reads that state
after every change (one Range of control keys), so a member whose lease
expired is known to be gone within milliseconds of etcd deleting its key,
and a dataset replaced elsewhere is known to be replaced before the next
read asks for it.  `listeners` are called after each new state (the router
drops placements of replaced datasets).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from dlfs import limits
from dlfs.coord import cluster_keys as keys
from dlfs.coord.etcd_grpc import EtcdClient
from dlfs.errors import DlfsError, Unavailable

log = logging.getLogger(__name__)


class ClusterView:
    """The cluster's state from etcd (`ClusterState`), and the etcd client to change it.

    Thread-safe.  `state` is the latest one read; `refresh()` reads it now.
    Raises Unavailable at construction when etcd does not answer.
    """

    def __init__(self, endpoints, cluster: str = keys.CLUSTER_DEFAULT):
        self.etcd = EtcdClient(endpoints)
        self.cluster = cluster
        self.prefix = keys.cluster_prefix(cluster)
        self.listeners: list[Callable[[keys.ClusterState], None]] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._state = self._read()
        self._watch = self.etcd.watch(self.prefix, self._on_change, self._on_broken)

    def __repr__(self) -> str:
        return f"ClusterView({','.join(self.etcd.endpoints)!r}, {self.cluster!r})"

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self.etcd.endpoints

    @property
    def state(self) -> keys.ClusterState:
        with self._lock:
            return self._state

    def close(self) -> None:
        self._watch.stop()
        self.etcd.close()

    def refresh(self) -> keys.ClusterState:
        """Read the state now (one Range); raises Unavailable when etcd does not answer."""
        state = self._read()
        self._publish(state)
        return state

    def members(self) -> list[str]:
        """Addresses of the live members, sorted."""
        return sorted(self.state.members)

    def wait_for(self, predicate: Callable[[keys.ClusterState], bool], timeout_s: float) -> bool:
        """Whether `predicate(state)` held within `timeout_s` (woken by each change)."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self._state), timeout_s)

    def _read(self) -> keys.ClusterState:
        kvs, revision = self.etcd.get_prefix(self.prefix)
        state = keys.ClusterState.parse(self.prefix, kvs, revision)
        if not state.cluster_id and not state.members:
            raise Unavailable(
                f"no DLFS cluster {self.cluster!r} in etcd at {','.join(self.endpoints)}: start "
                f"the daemons with --etcd {','.join(self.endpoints)} --cluster {self.cluster}")
        return state

    def _publish(self, state: keys.ClusterState) -> None:
        with self._changed:
            if state.revision < self._state.revision:
                return  # an older read finished late
            self._state = state
            self._changed.notify_all()
        for listener in list(self.listeners):
            listener(state)

    def _on_change(self, _revision: int) -> None:
        try:
            self._publish(self._read())
        except DlfsError as exc:
            log.debug("cannot re-read the cluster's state: %s", exc)

    def _on_broken(self, error: Exception) -> None:
        log.debug("the watch on etcd broke (%s); reopening it in %.1f s", error,
                  limits.etcd_reconnect_pause_s)
