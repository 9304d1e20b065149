"""The running ingests and their states: one state machine, one place that moves it.

    RECEIVING -> PREPARED -> SEALED      two-phase commit (striped datasets)
    RECEIVING -> SEALED                  one-phase commit
    RECEIVING or PREPARED -> ABORTED     error, client abort, timeout, shutdown

RECEIVING: files arrive on the Ingest stream.  PREPARED (two-phase ingests
of striped datasets): everything is durable and checked (a restart finds it
prepared again), the dataset waits for CommitIngest or AbortIngest, or, when
its timer fires, for what the Store decides (store.py, `_expire`).
SEALED (published) and ABORTED (discarded) are final: the registry then
forgets the session, so its name is free for the next ingest.

`IngestRegistry.move` is the only code that changes a state.  The Store
calls it under its own lock and performs what a transition means (catalog
records, publishing, removing extents); the registry only keeps the states,
the index a prepared ingest built, and the timer that expires it.
Nothing here imports grpc.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from typing import Callable

from dlfs import limits
from dlfs.errors import FailedPrecondition, NotFound
from dlfs.server.directory import DatasetIndex
from dlfs.server.ingest import IngestSession


class IngestState(enum.Enum):
    RECEIVING = "receiving"
    PREPARED = "prepared"
    SEALED = "sealed"
    ABORTED = "aborted"


_ALLOWED = {
    IngestState.RECEIVING: frozenset({IngestState.PREPARED, IngestState.SEALED,
                                      IngestState.ABORTED}),
    IngestState.PREPARED: frozenset({IngestState.SEALED, IngestState.ABORTED}),
    IngestState.SEALED: frozenset(),
    IngestState.ABORTED: frozenset(),
}
FINAL = frozenset({IngestState.SEALED, IngestState.ABORTED})


@dataclasses.dataclass
class _Entry:
    session: IngestSession
    state: IngestState
    index: DatasetIndex | None = None  # built when the ingest was prepared
    timer: threading.Timer | None = None  # expires a prepared ingest


class IngestRegistry:
    """Running ingests (RECEIVING or PREPARED) by dataset name.

    Not thread-safe: the Store calls every method under its lock.
    `expire(session)` is called on a timer thread when a prepared ingest
    has waited its timeout (`move`, `rearm`); it must take that lock
    and check the state again (a commit may have won the race).
    """

    def __init__(self, expire: Callable[[IngestSession], None]):
        self._expire = expire
        self._by_name: dict[str, _Entry] = {}

    def __len__(self) -> int:
        return len(self._by_name)

    def is_running(self, name: str) -> bool:
        return name in self._by_name

    def sessions(self) -> list[IngestSession]:
        """The running sessions, in name order."""
        return [self._by_name[name].session for name in sorted(self._by_name)]

    def add(self, session: IngestSession) -> None:
        """Register a new session as RECEIVING (its name must be free)."""
        assert session.name not in self._by_name, "the Store checks the name first"
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
             index: DatasetIndex | None = None,
             timeout_s: float = limits.prepared_ingest_timeout_s) -> None:
        """Change the state of a running session to `to` (with its `index` for PREPARED).

        Entering PREPARED starts the expiry timer (`timeout_s`), leaving it
        cancels the timer; a final state forgets the session.  Asserts the
        transition is allowed.  O(1).
        """
        entry = self._by_name[session.name]
        assert entry.session is session, "a stale session of the same name"
        assert to in _ALLOWED[entry.state], f"{entry.state.name} -> {to.name}"
        assert (index is not None) == (to is IngestState.PREPARED)
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        entry.state = to
        if to is IngestState.PREPARED:
            entry.index = index
            self._start_timer(entry, timeout_s)
        elif to in FINAL:
            del self._by_name[session.name]

    def rearm(self, session: IngestSession, timeout_s: float) -> None:
        """Call `expire(session)` again in `timeout_s` (a PREPARED session still waiting)."""
        entry = self._by_name[session.name]
        assert entry.session is session and entry.state is IngestState.PREPARED
        if entry.timer is not None:
            entry.timer.cancel()
        self._start_timer(entry, timeout_s)

    def stop_timers(self) -> None:
        """Cancel every expiry timer (the Store is closing; prepared ingests stay on disk)."""
        for entry in self._by_name.values():
            if entry.timer is not None:
                entry.timer.cancel()

    def _start_timer(self, entry: _Entry, timeout_s: float) -> None:
        entry.timer = threading.Timer(timeout_s, self._expire, (entry.session,))
        entry.timer.daemon = True
        entry.timer.start()

    def check_invariants(self) -> None:
        """Assert every entry is consistent.  O(running ingests); for tests."""
        ids = set()
        for name, entry in self._by_name.items():
            assert entry.session.name == name
            assert entry.state not in FINAL, "final states are forgotten"
            prepared = entry.state is IngestState.PREPARED
            assert (entry.index is not None) == prepared
            assert (entry.timer is not None) == prepared
            assert not prepared or entry.index.dataset_id == entry.session.dataset_id
            ids.add(entry.session.dataset_id)
        assert len(ids) == len(self._by_name), "two running ingests share a dataset id"
