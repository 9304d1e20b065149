"""The Store's ingests: every state change of an ingest, one-phase and two-phase.

A part of `Store` (store.py), as the class it inherits from: the methods
below run under the Store's lock and use what `Store.__init__` set up (the
catalog, the extents, the directory, the ingest registry, the read leases,
the metrics).  The states live in ingest_registry.py; only the methods here
move them, and they perform what each move means on disk: BEGIN, PREPARE,
SEAL and DELETE records, publishing, removing extents.

Two-phase ingests of striped datasets: the PREPARE record keeps a prepared
ingest across restarts; the first member's SEAL is the decision; any other
member left prepared asks the first one (`decisions`, set by the daemon)
and follows it; only the first member aborts on a timeout.  See
docs/cluster.md.  Nothing here imports grpc.
"""

from __future__ import annotations

import logging
import time

from dlfs.errors import AlreadyExists, DlfsError, NotFound, Overloaded
from dlfs.paths import check_dataset_name
from dlfs.server.core import faults, catalog_records as records
from dlfs.server.core.directory import Cluster, DatasetIndex, generation_of
from dlfs.server.core.extents import ExtentWriter
from dlfs.server.ingest.ingest_session import IngestSession, RecoveredIngest
from dlfs.server.ingest.ingest_registry import IngestState
from dlfs.types import DatasetInfo

log = logging.getLogger(__name__)


class StoreIngests:
    """The ingest half of `Store`; see the module docstring."""

    def begin_ingest(self, name: str, replace: bool = False,
                     cluster: Cluster | None = None, resumable: bool = False) -> IngestSession:
        """Start an ingest of dataset `name` (RECEIVING): a BEGIN record, an extent directory;
        `resumable`: and a first CHECKPOINT (checkpoints.py).

        Raises AlreadyExists (name taken without `replace`, being ingested,
        or a parked ingest of that name), Overloaded (too many ingests),
        Unavailable (shutting down), InvalidArgument (bad name).
        """
        check_dataset_name(name)
        with self._mutex:
            self._check_open()
            found = self._ingests.find(name)
            if found is not None and found[1] is IngestState.PARKED:
                raise AlreadyExists(
                    f"an ingest of dataset {name!r} broke off and is parked with "
                    f"{found[0].samples} files durable: continue it with `dlfs ingest --resume` "
                    f"(same sources and options), or discard it with `dlfs rm {name}`")
            if found is not None:
                raise AlreadyExists(f"dataset {name!r} is being ingested by another client")
            if not replace and self.directory.find(name) is not None:
                raise AlreadyExists(
                    f"dataset {name!r} exists; pass --replace (replace=True) to replace it, or "
                    "choose another name"
                )
            self._check_ingest_slots()
            dataset_id = self._next_dataset_id
            self._next_dataset_id += 1
            created_ns = time.time_ns()
            writer = ExtentWriter(self.extents, dataset_id, created_ns,
                                  self.config.extent_bytes_max, label=f"dataset {name!r}")
            for record_type, payload in records.start_records(dataset_id, created_ns, name,
                                                              cluster):
                self._catalog.append(record_type, payload)
            session = IngestSession(name, dataset_id, created_ns, self._catalog, writer,
                                    replace, cluster, resumable=resumable,
                                    checkpoint_bytes=self.config.ingest_checkpoint_bytes,
                                    checkpoint_interval_s=self.config.ingest_checkpoint_interval_s)
            self._ingests.add(session)
        if resumable:
            try:
                session.take_checkpoint()
            except BaseException as exc:
                self.abort_ingest(session, f"{type(exc).__name__}: {exc}")
                raise
        return session

    def _check_ingest_slots(self) -> None:
        """Raise Overloaded when ingests_concurrent_max streams run (caller holds `_mutex`)."""
        running = self._ingests.active_count()
        if running >= self.config.ingests_concurrent_max:
            raise Overloaded(
                f"{running} ingests are running, the limit (--ingests-concurrent-max) is "
                f"{self.config.ingests_concurrent_max}; retry later")

    def commit_ingest(self, session: IngestSession) -> DatasetInfo:
        """Finish a RECEIVING ingest, then seal and publish it (one-phase commit).

        Durable when it returns: extents fsync'ed, SEAL appended, catalog
        fsync'ed.  A replaced dataset's extents are freed after its last
        read.  Raises InvalidArgument (unfinished file, duplicate path,
        file/directory conflict), AlreadyExists (the name was published
        meanwhile and `replace` is off), StorageFull, Unavailable (shutting
        down); the ingest is aborted then.  FailedPrecondition or NotFound
        when the session is not receiving (prepared, or already ended).
        """
        index = self._finish(session)
        return self._seal(session, IngestState.RECEIVING, index)

    def prepare_ingest(self, session: IngestSession) -> DatasetInfo:
        """Finish a RECEIVING ingest without publishing it (PREPARED; phase one of two).

        The dataset is durable and checked (a PREPARE record: a restart
        keeps it prepared); it waits for `commit_prepared` or
        `abort_prepared`.  Who decides when nobody does (see `_expire`):
        a striped dataset's first member, or a dataset of one daemon, aborts
        it after `config.prepared_ingest_timeout_s`; the other members ask
        the first one for its outcome (`decisions`).  Returns its (unsealed)
        summary.  Raises as `commit_ingest` (but for AlreadyExists, checked
        at commit).
        """
        index = self._finish(session)
        try:
            with self._mutex:
                self._expect(session, IngestState.RECEIVING)  # only a shutdown ends it meanwhile
                # Durable before it answers: a restart finds it prepared, not discarded.
                self._catalog.append(records.RecordType.PREPARE,
                                     records.encode_prepare(session.dataset_id, session.replace),
                                     sync=True)
                self._ingests.move(session, IngestState.PREPARED, index,
                                   self._prepared_timeout_s(session))
        except BaseException as exc:
            self.abort_ingest(session, f"prepare failed: {type(exc).__name__}: {exc}")
            raise
        return session.summary()

    def commit_prepared(self, name: str, generation: int = 0) -> DatasetInfo:
        """Seal and publish the prepared ingest of `name` (CommitIngest).

        With a `generation`, only that version is committed, and if it is
        already published the call answers with its summary (a retried
        commit that had succeeded).  Raises NotFound (none prepared),
        InvalidArgument (bad name), and AlreadyExists, StorageFull,
        Unavailable as `commit_ingest`; a failed commit aborts the ingest (see `_seal`).
        """
        check_dataset_name(name)
        with self._mutex:
            self._check_open()
            published = self.directory.find(name)
            if generation and published is not None and published.generation == generation:
                return published.summary()
            session, index = self._ingests.require_prepared(name)
            if generation and index.generation != generation:
                raise NotFound(f"dataset {name!r} is prepared in generation {index.generation}, "
                               f"not {generation}")
        return self._seal(session, IngestState.PREPARED, index)

    def ingest_outcome(self, name: str, generation: int) -> str:
        """What became of `generation` of dataset `name` here: "committed"
        (published now), "pending" (receiving or prepared), or "aborted"
        (anything else: never prepared, aborted, or replaced since); "pending"
        too while the catalog has failed (the restart tells).  The answer a
        striped dataset's first member gives the others."""
        check_dataset_name(name)
        with self._mutex:
            if self._catalog.failed:
                return "pending"  # what the disk holds is known after the restart only
            published = self.directory.find(name)
            if published is not None and published.generation == generation:
                return "committed"
            for session in self._ingests.sessions():
                if session.name == name and generation_of(session.cluster,
                                                              session.dataset_id) == generation:
                    return "pending"
        return "aborted"

    def abort_prepared(self, name: str) -> DatasetInfo:
        """Discard the prepared ingest of `name` (AbortIngest); return its summary.

        Raises NotFound (none prepared), InvalidArgument, Unavailable.
        """
        check_dataset_name(name)
        with self._mutex:
            self._check_open()
            session, _index = self._ingests.require_prepared(name)
            self._ingests.move(session, IngestState.ABORTED)
        self._discard(session, "aborted by the client")
        return session.summary()

    def abort_ingest(self, session: IngestSession, reason: str) -> None:
        """Discard a running ingest: a DELETE record, its extents removed, `reason` logged.

        Idempotent: an ingest already sealed or aborted is left alone.
        Never raises.
        """
        with self._mutex:
            if self._ingests.state(session) is None:
                return
            self._ingests.move(session, IngestState.ABORTED)
        self._discard(session, reason)

    def ingest_state(self, session: IngestSession) -> IngestState | None:
        """RECEIVING, PREPARED or PARKED while the ingest runs; None once sealed or
        aborted."""
        with self._mutex:
            return self._ingests.state(session)

    def check_invariants(self) -> None:
        """Assert the ingests and the directory agree.  O(datasets + ingests); for tests."""
        with self._mutex:
            self._ingests.check_invariants()
            running = {s.dataset_id for s in self._ingests.sessions()}
            published = {d.dataset_id for d in self.directory.all()}
            assert not running & published, "a running ingest's dataset is published"
            assert all(i < self._next_dataset_id for i in running | published)

    def _finish(self, session: IngestSession) -> DatasetIndex:
        """`session.finish()` of a RECEIVING ingest; aborts the ingest when it fails."""
        with self._mutex:
            self._expect(session, IngestState.RECEIVING)
        try:
            return session.finish()
        except BaseException as exc:
            self.abort_ingest(session, f"{type(exc).__name__}: {exc}")
            raise

    def _seal(self, session: IngestSession, expected: IngestState,
              index: DatasetIndex) -> DatasetInfo:
        """Durably seal and publish `index` if `session` is still `expected` (-> SEALED).

        A failure aborts the ingest, except for a prepared ingest whose first
        member decides (another member of a striped dataset), or when the
        catalog failed: that one stays prepared, as two-phase commit requires
        of a member that voted yes.
        """
        try:
            with self._mutex:
                self._expect(session, expected)
                previous = self.directory.find(session.name)
                if previous is not None and not session.replace:
                    raise AlreadyExists(f"dataset {session.name!r} appeared during the ingest")
                replaces = previous.dataset_id if previous is not None else 0
                faults.point("seal", session.name)
                self._catalog.append(records.RecordType.SEAL,
                                     records.encode_seal(session.dataset_id, replaces), sync=True)
                self.directory.publish(index)
                self._ingests.move(session, IngestState.SEALED)
        except BaseException as exc:
            decider = decider_of(session)
            if expected is IngestState.PREPARED and (decider is not None
                                                     or self._catalog.failed):
                # Not ours to abort: the first member may have committed, or (a
                # failed catalog) our own SEAL may be on disk.  Stay prepared:
                # commit when asked again, or let the restart's replay decide.
                log.warning("commit of dataset %r failed (%s: %s); it stays prepared until %s",
                            session.name, type(exc).__name__, exc,
                            f"{decider}'s decision is applied again" if decider
                            else "the daemon restarts")
                raise
            self.abort_ingest(session, f"commit failed: {type(exc).__name__}: {exc}")
            raise
        if previous is not None:
            self._leases.retire(previous.dataset_id)
        self.metrics.ingested_samples.inc(len(index))
        self.metrics.ingested_bytes.inc(index.total_bytes)
        log.info("sealed dataset %r: %d samples, %d bytes%s", index.name, len(index),
                 index.total_bytes, " (replaced the previous one)" if previous else "")
        return index.summary()

    def _recover_prepared(self, prepared: list[tuple[DatasetIndex, bool]]) -> None:
        """Register the prepared ingests replay found ((index, replaces) pairs) as
        PREPARED again, each waiting for its decision as before the restart."""
        with self._mutex:
            for index, replace in prepared:
                session = RecoveredIngest(index, replace, self._catalog, self.extents)
                self._ingests.add(session)
                self._ingests.move(session, IngestState.PREPARED, index,
                                   self._prepared_timeout_s(session))

    def _prepared_timeout_s(self, session) -> float:
        """How long a prepared ingest waits before `_expire` looks at it."""
        if decider_of(session) is None:
            return self.config.prepared_ingest_timeout_s
        return self.config.in_doubt_poll_s

    def _expire(self, session) -> None:
        """Timer thread: a prepared ingest waited its timeout (see `prepare_ingest`), or
        a parked one was not resumed in time (discarded)."""
        with self._mutex:
            state = self._ingests.state(session)
            if state is IngestState.PARKED:
                self._ingests.move(session, IngestState.ABORTED)
        if state is IngestState.PARKED:
            self._discard(session, "not resumed within "
                                   f"{self.config.resumable_ingest_timeout_s:.0f} s "
                                   "(--resumable-ingest-timeout-s)")
            return
        with self._mutex:
            if self._ingests.state(session) is not IngestState.PREPARED:
                return  # committed or aborted meanwhile
            decider = decider_of(session)
            if decider is None:  # this daemon decides: nobody committed in time
                self._ingests.move(session, IngestState.ABORTED)
        if decider is None:
            self._discard(session, "not committed within "
                                   f"{self.config.prepared_ingest_timeout_s:.0f} s "
                                   "(--prepared-ingest-timeout-s)")
            return
        self._learn_outcome(session, decider)

    def _learn_outcome(self, session, decider: str) -> None:
        """Ask the first member what it decided; follow it, or ask again later."""
        generation = generation_of(session.cluster, session.dataset_id)
        outcome = self.decisions(session.name, generation, decider) if self.decisions else None
        try:
            if outcome == "committed":
                log.info("dataset %r generation %d: %s committed it; committing here",
                         session.name, generation, decider)
                self.commit_prepared(session.name, generation)
                return
            if outcome == "aborted":
                self.abort_ingest(session, f"{decider} decided to abort generation {generation}")
                return
        except (DlfsError, OSError) as exc:
            log.warning("could not apply %s's decision on dataset %r: %s", decider,
                        session.name, exc)
        with self._mutex:
            if self._ingests.state(session) is IngestState.PREPARED:
                self._ingests.rearm(session, self.config.in_doubt_poll_s)

    def _discard(self, session: IngestSession, reason: str) -> None:
        """What ABORTED means on disk (after the move, outside `_mutex`)."""
        log.warning("ingest of dataset %r aborted: %s", session.name, reason)
        session.discard()

    def _expect(self, session: IngestSession, state: IngestState) -> None:
        """Raise unless `session` is in `state` (caller holds `_mutex`)."""
        self._check_open()  # closing aborts every ingest: Unavailable says why
        self._ingests.require(session, state)


def decider_of(session) -> str | None:
    """The address of the member whose commit decides a striped ingest, or None
    when this daemon decides (one daemon's dataset, or this is the first member)."""
    cluster = session.cluster
    if cluster is None or cluster.member_index == 0 or not cluster.generation:
        return None
    return cluster.members[0]
