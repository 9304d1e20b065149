"""The running ingests and their states: one state machine, one place that moves it.

    RECEIVING -> PREPARED -> SEALED      two-phase commit (striped datasets)
    RECEIVING -> SEALED                  one-phase commit
    RECEIVING or PREPARED -> ABORTED     error, client abort, timeout, shutdown
    RECEIVING -> PARKED                  a resumable ingest's stream broke off
    PARKED -> RECEIVING                  resumed (IngestStart.resume)
    PARKED -> ABORTED                    not resumed in time, DeleteDataset

RECEIVING: files arrive on the Ingest stream.  PREPARED (two-phase ingests
of striped datasets): everything is durable and checked (a restart finds it
prepared again), the dataset waits for etcd's decision, which the daemon's
cluster member applies; it has no timer (the coordinator's lease in etcd is
the timeout).  A prepared ingest, resumable or not, is the two-phase
commit's to decide and is never resumed.
PARKED (resumable ingests, checkpoints.py): what arrived is durable up to a
checkpoint, the dataset stays invisible and waits for a resume, at most
the daemon's --resumable-ingest-timeout-s.  SEALED (published) and ABORTED
(discarded) are final: the registry then forgets the session, so its name
is free for the next ingest.

`IngestRegistry.move` is the only code that changes a state.  The
`IngestMachine` (ingest_machine.py) calls it under its lock and performs
what a transition means (catalog records, publishing, removing extents);
the registry only keeps the states, the index a prepared ingest built,
and the timer that expires it.
Nothing here imports grpc.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
import time
from typing import Callable

from dlfs import limits
from dlfs.errors import FailedPrecondition, NotFound
from dlfs.server.core.directory import DatasetIndex
from dlfs.server.ingest.ingest_session import IngestSession


class IngestState(enum.Enum):
    RECEIVING = "receiving"
    PREPARED = "prepared"
    PARKED = "parked"
    SEALED = "sealed"
    ABORTED = "aborted"


_ALLOWED = {
    IngestState.RECEIVING: frozenset({IngestState.PREPARED, IngestState.SEALED,
                                      IngestState.ABORTED, IngestState.PARKED}),
    IngestState.PREPARED: frozenset({IngestState.SEALED, IngestState.ABORTED}),
    IngestState.PARKED: frozenset({IngestState.RECEIVING, IngestState.ABORTED}),
    IngestState.SEALED: frozenset(),
    IngestState.ABORTED: frozenset(),
}
FINAL = frozenset({IngestState.SEALED, IngestState.ABORTED})


@dataclasses.dataclass
class _Entry:
    session: IngestSession
    state: IngestState
    index: DatasetIndex | None = None  # built when the ingest was prepared
    timer: threading.Timer | None = None  # expires a parked ingest
    parked_ns: int = 0  # wall clock when it was parked
    expires_at: float = 0.0  # time.monotonic() when its timer fires


class IngestRegistry:
    """Running ingests (RECEIVING or PREPARED) by dataset name.

    Not thread-safe: the IngestMachine calls every method under its lock.
    `expire(session)` is called on a timer thread when a parked ingest has
    waited `parked_timeout_s`; it must take that lock and check the state
    again (a resume may have won the race).
    """

    def __init__(self, expire: Callable[[IngestSession], None],
                 parked_timeout_s: float = limits.resumable_ingest_timeout_s_default):
        self._expire = expire
        self._parked_timeout_s = parked_timeout_s
        self._by_name: dict[str, _Entry] = {}

    def __len__(self) -> int:
        return len(self._by_name)

    def active_count(self) -> int:
        """Ingests that hold an open stream or a prepared index (not the parked ones)."""
        return sum(entry.state is not IngestState.PARKED for entry in self._by_name.values())

    def find(self, name: str) -> tuple[IngestSession, IngestState] | None:
        """The running, prepared or parked ingest of `name` and its state."""
        entry = self._by_name.get(name)
        return None if entry is None else (entry.session, entry.state)

    def parked_times(self, session: IngestSession) -> tuple[int, float]:
        """(wall clock ns when parked, seconds left before it expires); (0, 0) unless parked."""
        entry = self._by_name.get(session.name)
        if entry is None or entry.session is not session or entry.state is not IngestState.PARKED:
            return 0, 0.0
        return entry.parked_ns, max(0.0, entry.expires_at - time.monotonic())

    def add_parked(self, session: IngestSession, parked_ns: int, timeout_s: float) -> None:
        """Register a session restored at start as PARKED, expiring in `timeout_s`."""
        assert session.name not in self._by_name, "replay keeps one ingest per name"
        entry = self._by_name[session.name] = _Entry(session, IngestState.PARKED)
        self._start_timer(entry, max(0.0, timeout_s))
        entry.parked_ns = parked_ns

    def is_running(self, name: str) -> bool:
        return name in self._by_name

    def sessions(self) -> list[IngestSession]:
        """The running sessions, in name order."""
        return [self._by_name[name].session for name in sorted(self._by_name)]

    def add(self, session: IngestSession) -> None:
        """Register a new session as RECEIVING (its name must be free)."""
        assert session.name not in self._by_name, "the IngestMachine checks the name first"
        self._by_name[session.name] = _Entry(session, IngestState.RECEIVING)

    def state(self, session: IngestSession) -> IngestState | None:
        """The session's state, or None once it is sealed or aborted (forgotten)."""
        entry = self._by_name.get(session.name)
        return entry.state if entry is not None and entry.session is session else None

    def require(self, session: IngestSession, state: IngestState) -> None:
        """Raise unless `session` is in `state`: NotFound once it is sealed or
        aborted, FailedPrecondition in another running state."""
        current = self.state(session)
        if current is None:
            raise NotFound(f"the ingest of dataset {session.name!r} has already been sealed or "
                           "aborted")
        if current is not state:
            raise FailedPrecondition(f"the ingest of dataset {session.name!r} is "
                                     f"{current.value}, not {state.value}")

    def require_prepared(self, name: str) -> tuple[IngestSession, DatasetIndex]:
        """The prepared ingest of `name` and the index it built.  Raises NotFound."""
        entry = self._by_name.get(name)
        if entry is None or entry.state is not IngestState.PREPARED:
            raise NotFound(f"no prepared ingest of dataset {name!r} (never prepared, already "
                           "finished, or discarded: timed out or aborted)")
        return entry.session, entry.index

    def move(self, session: IngestSession, to: IngestState,
             index: DatasetIndex | None = None) -> None:
        """Change the state of a running session to `to` (with its `index` for PREPARED).

        Entering PARKED starts the expiry timer, leaving it cancels the
        timer; a final state forgets the session.  Asserts the transition is
        allowed.  O(1).
        """
        entry = self._by_name[session.name]
        assert entry.session is session, "a stale session of the same name"
        assert to in _ALLOWED[entry.state], f"{entry.state.name} -> {to.name}"
        assert (index is not None) == (to is IngestState.PREPARED)
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        entry.state = to
        entry.index = index
        if to is IngestState.PARKED:
            self._start_timer(entry, self._parked_timeout_s)
            entry.parked_ns = time.time_ns()
        elif to in FINAL:
            del self._by_name[session.name]

    def stop_timers(self) -> None:
        """Cancel every expiry timer (the daemon is closing; prepared and parked ingests
        stay on disk)."""
        for entry in self._by_name.values():
            if entry.timer is not None:
                entry.timer.cancel()

    def _start_timer(self, entry: _Entry, seconds: float) -> None:
        entry.timer = threading.Timer(seconds, self._expire, (entry.session,))
        entry.timer.daemon = True
        entry.expires_at = time.monotonic() + seconds
        entry.timer.start()

    def check_invariants(self) -> None:
        """Assert every entry is consistent.  O(running ingests); for tests."""
        ids = set()
        for name, entry in self._by_name.items():
            assert entry.session.name == name
            assert entry.state not in FINAL, "final states are forgotten"
            prepared = entry.state is IngestState.PREPARED
            assert (entry.index is not None) == prepared
            assert (entry.timer is not None) == (entry.state is IngestState.PARKED)
            assert entry.state is not IngestState.PARKED or entry.session.resumable
            assert not prepared or entry.index.dataset_id == entry.session.dataset_id
            ids.add(entry.session.dataset_id)
        assert len(ids) == len(self._by_name), "two running ingests share a dataset id"
