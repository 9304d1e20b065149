"""The ingest state machine's transitions, and the publishing and deleting of datasets.

Over 400 lines on purpose: every transition of an ingest is here, in one
object (the house rule: one state machine, one place that changes it), and
each transition is a few lines of what it means on disk.  The states and
their timers live in ingest_registry.py, whose `move` only this object
calls; an `IngestSession` receives the bytes and knows nothing of this.

What each transition means (durability order as in catalog.py):

- begin: BEGIN (and HOLDERS) records and an extent directory; a resumable
  ingest also its first CHECKPOINT (checkpoints.py);
- commit (one phase): the session's `finish` (extents fsync'ed, entries
  written), then SEAL synced, then the dataset is published; a replaced
  dataset's extents are freed after its last read (read_leases.py);
- prepare (phase one of two): `finish`, then PREPARE synced: a restart
  finds the ingest prepared again (`recover`); commit_prepared: SEAL
  synced, then published, as above;
- abort, expire, a failed commit: a DELETE record (synced for a resumable
  ingest), then the extents (recovered_ingest.discard_dataset);
- break_off: a resumable RECEIVING ingest that holds files durably is
  checkpointed (or goes back to its last checkpoint when the disk fails)
  and PARKED, any other aborted; resume: a fresh extent after the
  checkpoint, RECEIVING; discard_parked: a PARKED ingest aborted;
- delete: DELETE synced, then the dataset is unpublished (nothing else: a
  parked ingest of the name stays).

Every failure that ends an ingest says how in its error (`with_outcome`):
parked with so many files and bytes of the data dir, and the commands
that continue or end it; or discarded.  The paths that clean up (`abort`,
`break_off`, `_discard`) never raise: the error they follow must still
reach the client.

Two-phase ingests of striped datasets: the PREPARE record keeps a prepared
ingest across restarts; the decision is one transaction in etcd, which the
daemon's cluster member (server/cluster_member.py) watches and applies with
`commit_prepared` or `abort_prepared`; nothing here times a prepared ingest
out (the coordinator's lease in etcd does).  Before it votes yes, a prepare
asks `prepare_gate` (set by the cluster member; None: this daemon takes no
two-phase ingests) whether etcd still holds the change's intent.  A
PREPARED ingest is never resumed: it voted yes, and only etcd's decision
ends it.  See docs/cluster.md.  Nothing here imports grpc or the daemon's
config.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Callable, TypeVar

from dlfs import limits
from dlfs.errors import (AlreadyExists, DataCorruption, DlfsError, FailedPrecondition, NotFound,
                         Overloaded, ResumeConflict, Unavailable)
from dlfs.paths import check_dataset_name
from dlfs.server.core import catalog as cat
from dlfs.server.core import catalog_records as records
from dlfs.server.core import faults
from dlfs.server.core.checkpoints import ParkedIngest, ProgressInfo
from dlfs.server.core.directory import Cluster, DatasetIndex, generation_of
from dlfs.server.core.extents import DISK_ERRORS, ExtentStore, ExtentWriter
from dlfs.server.core.read_leases import ReadLeases
from dlfs.server.core.sealed_datasets import SampleDirectory
from dlfs.server.ingest.ingest_registry import IngestRegistry, IngestState
from dlfs.server.ingest.ingest_session import IngestSession
from dlfs.server.ingest.recovered_ingest import RecoveredIngest, discard_dataset
from dlfs.types import DatasetInfo

log = logging.getLogger(__name__)
T = TypeVar("T")

# (name, generation) -> None, or raises: may this daemon vote yes (see `prepare`)?
PrepareGate = Callable[[str, int], None]


class IngestMachine:
    """Every ingest of the daemon, from BEGIN to SEAL or DELETE.  Thread-safe.

    `_mutex` guards the registry, the next dataset id, the closed flag, and
    each publish or delete together with its catalog record.  Lock order:
    `_mutex` before the catalog's and the directory's own locks.  The read
    leases (`leases`) have their own lock, and no code holds `_mutex` while
    taking it (`retire` runs after); sessions finish, checkpoint, park and
    discard outside `_mutex`, so their write lock never nests with it.

    `catalog`, `extents` and `directory` are the Store's; `leases` frees a
    replaced or deleted dataset's extents after its last read; `metrics`
    counts ingested samples and bytes.  `next_dataset_id` is the first id
    replay left free.  The keyword bounds are the daemon's settings of the
    same names (see ServerConfig).  `prepare_gate` and `on_prepared` (set by
    the daemon's cluster member; None without --etcd) are asked before a
    prepare votes yes and told after it did; `change_gate(name, change)` (set
    by it too) before a one-daemon ingest replaces, or a delete removes,
    dataset `name` (it raises when etcd places a striped version of `name`
    here: only etcd's decisions change those).
    """

    def __init__(self, catalog: cat.Catalog, extents: ExtentStore, directory: SampleDirectory,
                 leases: ReadLeases, metrics, *, next_dataset_id: int,
                 extent_bytes_max: int = limits.extent_bytes_max_default,
                 ingests_concurrent_max: int = limits.ingests_concurrent_max_default,
                 resumable_ingest_timeout_s: float = limits.resumable_ingest_timeout_s_default,
                 checkpoint_bytes: int = limits.ingest_checkpoint_bytes,
                 checkpoint_interval_s: float = limits.ingest_checkpoint_interval_s):
        self._catalog = catalog
        self._extents = extents
        self._directory = directory
        self._leases = leases
        self._metrics = metrics
        self._extent_bytes_max = extent_bytes_max
        self._ingests_concurrent_max = ingests_concurrent_max
        self._resumable_ingest_timeout_s = resumable_ingest_timeout_s
        self._checkpoint_bytes = checkpoint_bytes
        self._checkpoint_interval_s = checkpoint_interval_s
        self._mutex = threading.Lock()
        self._next_dataset_id = next_dataset_id
        self._registry = IngestRegistry(expire=self._expire,
                                        parked_timeout_s=resumable_ingest_timeout_s)
        self._closed = False
        self.prepare_gate: PrepareGate | None = None
        self.on_prepared: Callable[[str, int], None] | None = None
        self.change_gate: Callable[[str, str], None] | None = None
        # Set by the space machine: raises AlreadyExists when a checkpoint space has
        # the name (asked under `_mutex`, which `reserve_name` holds for a new space).
        self.name_gate: Callable[[str], None] | None = None

    # --- open and closed -------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        """Raise Unavailable once `close` began (the daemon is shutting down)."""
        if self._closed:
            raise Unavailable("the daemon is shutting down; retry once it is back")

    def recover(self, prepared: list[tuple[DatasetIndex, bool]],
                parked: list[ParkedIngest]) -> None:
        """Register what replay found: prepared ingests ((index, replaces) pairs) as
        PREPARED, each waiting for etcd's decision as before the restart, and broken-off
        resumable ones as PARKED, each expiring --resumable-ingest-timeout-s after
        its last checkpoint.  Called once, before any other call."""
        with self._mutex:
            for index, replace in prepared:
                session = RecoveredIngest(index, replace, self._catalog, self._extents)
                self._registry.add(session)
                self._registry.move(session, IngestState.PREPARED, index)
            for entry in parked:
                session = IngestSession.restored(entry.name, entry.dataset_id, entry.created_ns,
                                                 self._catalog, entry.blocks, entry.checkpoint,
                                                 entry.cluster, self._extents)
                session.checkpoint_bytes = self._checkpoint_bytes
                session.checkpoint_interval_s = self._checkpoint_interval_s
                waited_s = max(0.0, (time.time_ns() - entry.checkpoint.time_ns) / 1e9)
                self._registry.add_parked(session, entry.checkpoint.time_ns,
                                          self._resumable_ingest_timeout_s - waited_s)
                log.warning("ingest of dataset %r is parked with %d files durable (%d bytes of "
                            "the data dir); `dlfs ingest --resume` continues it, `dlfs discard "
                            "%s` ends it", entry.name, entry.checkpoint.samples,
                            session.disk_bytes(), entry.name)

    def close(self) -> bool:
        """Abort the receiving ingests and stop every timer; later calls raise
        Unavailable.  Prepared ingests stay prepared on disk, resumable ones as
        their last checkpoint recorded them: the next start finds them.
        Idempotent: False when an earlier call closed it."""
        with self._mutex:
            if self._closed:
                return False
            self._closed = True
            sessions = [s for s in self._registry.sessions()
                        if self._registry.state(s) is IngestState.RECEIVING]
            for session in sessions:
                self._registry.move(session, IngestState.ABORTED)
            self._registry.stop_timers()
        for session in sessions:
            if session.resumable:
                session.close_writer()
            else:
                self._discard(session, "the daemon is shutting down")
        return True

    # --- one phase ---------------------------------------------------------------------

    def begin(self, name: str, replace: bool = False, cluster: Cluster | None = None,
              resumable: bool = False) -> IngestSession:
        """Start an ingest of dataset `name` (RECEIVING).

        Raises AlreadyExists (name taken without `replace`, being ingested,
        or a parked ingest of that name), Overloaded (too many ingests),
        Unavailable (shutting down), InvalidArgument (bad name).
        """
        check_dataset_name(name)
        if cluster is None and replace:
            self._check_change(name, "replaced")
        with self._mutex:
            self.check_open()
            found = self._registry.find(name)
            if found is not None and found[1] is IngestState.PARKED:
                raise AlreadyExists(
                    f"an ingest of dataset {name!r} broke off and is parked with "
                    f"{found[0].samples:,} files durable: run the same `dlfs ingest` command "
                    f"with --resume to continue it, or `dlfs discard {name}` to end it")
            if found is not None:
                raise AlreadyExists(f"dataset {name!r} is being ingested by another client")
            if self.name_gate is not None:
                self.name_gate(name)
            if not replace and self._directory.find(name) is not None:
                raise AlreadyExists(
                    f"dataset {name!r} exists; pass --replace (replace=True) to replace it, or "
                    "choose another name")
            self._check_slots()
            dataset_id = self._next_dataset_id
            self._next_dataset_id += 1
            created_ns = time.time_ns()
            writer = ExtentWriter(self._extents, dataset_id, created_ns, self._extent_bytes_max,
                                  label=f"dataset {name!r}")
            try:
                for record_type, payload in records.start_records(dataset_id, created_ns, name,
                                                                  cluster):
                    self._catalog.append(record_type, payload)
            except BaseException:  # a full disk or a failed catalog: take the directory back
                discard_dataset(self._catalog, writer.discard, name, dataset_id)
                raise
            session = IngestSession(name, dataset_id, created_ns, self._catalog, writer,
                                    replace, cluster, resumable=resumable,
                                    checkpoint_bytes=self._checkpoint_bytes,
                                    checkpoint_interval_s=self._checkpoint_interval_s)
            self._registry.add(session)
        if resumable:
            try:
                session.take_checkpoint()
            except BaseException as exc:
                aborted = self.abort(session, f"{type(exc).__name__}: {exc}")
                raise with_outcome(exc, self._discarded_note() if aborted else None)
        return session

    def allocate_id(self) -> int:
        """A dataset id no dataset, space or file version has had (for the space
        machine: every extent directory is named by one)."""
        with self._mutex:
            allocated = self._next_dataset_id
            self._next_dataset_id += 1
            return allocated

    def reserve_name(self, name: str, claim: Callable[[int], T]) -> T:
        """Run `claim(id)` (which makes `name` a checkpoint space's, with a new id) under
        `_mutex` once no dataset or ingest has `name`, so no ingest can take it
        meanwhile; raises AlreadyExists naming what has it, Unavailable."""
        check_dataset_name(name)
        with self._mutex:
            self.check_open()
            if self._directory.find(name) is not None:
                raise AlreadyExists(f"a dataset named {name!r} exists; a checkpoint space "
                                    "needs a name of its own")
            if self._registry.find(name) is not None:
                raise AlreadyExists(f"dataset {name!r} is being ingested (or parked); a "
                                    "checkpoint space needs a name of its own")
            allocated = self._next_dataset_id
            self._next_dataset_id += 1
            return claim(allocated)

    def commit(self, session: IngestSession) -> DatasetInfo:
        """Finish a RECEIVING ingest, then seal and publish it (one-phase commit).

        Durable when it returns: extents fsync'ed, SEAL appended, catalog
        fsync'ed.  Raises InvalidArgument (unfinished file, duplicate path,
        file/directory conflict), AlreadyExists (the name was published
        meanwhile and `replace` is off), StorageFull, StorageFailed,
        Unavailable (shutting down); the ingest is aborted then, or parked
        when it is resumable, holds files and the disk failed (the error's
        message ends saying which, see `with_outcome`).  FailedPrecondition or
        NotFound when the session is not receiving (prepared, or already ended).
        """
        index = self._finish(session)
        return self._seal(session, IngestState.RECEIVING, index)

    def abort(self, session: IngestSession, reason: str) -> bool:
        """Discard a running ingest: a DELETE record, its extents removed, `reason` logged.
        Idempotent: an ingest already sealed or aborted is left alone (False).
        Never raises."""
        with self._mutex:
            if self._registry.state(session) is None:
                return False
            self._registry.move(session, IngestState.ABORTED)
        self._discard(session, reason)
        return True

    def discard_parked(self, name: str) -> DatasetInfo:
        """End the parked ingest of `name` (DiscardIngest): a DELETE record, synced,
        then its extents removed; returns what it held.  A sealed dataset of the
        same name is never touched (that is `delete`), nor a receiving or
        prepared ingest.  Raises InvalidArgument, NotFound (no unsealed ingest of
        that name), FailedPrecondition (it is receiving or prepared: the message
        says what ends those), Unavailable (shutting down)."""
        check_dataset_name(name)
        with self._mutex:
            self.check_open()
            found = self._registry.find(name)
            if found is None:
                sealed = self._directory.find(name) is not None
                raise NotFound(
                    f"no parked ingest of dataset {name!r} (never started, sealed, discarded, "
                    "or not resumed within --resumable-ingest-timeout-s)"
                    + (f"; the sealed dataset {name!r} stays (`dlfs rm {name}` removes it)"
                       if sealed else ""))
            session, state = found
            if state is IngestState.RECEIVING:
                raise FailedPrecondition(
                    f"the ingest of dataset {name!r} is still receiving, not parked: stop the "
                    "client sending it (it parks when its stream breaks off), then discard it")
            if state is IngestState.PREPARED:
                raise FailedPrecondition(
                    f"the ingest of dataset {name!r} is prepared (it holds all its files and "
                    "waits for the decision in etcd), not parked: its coordinator's commit, or "
                    "its lease running out, ends it")
            self._registry.move(session, IngestState.ABORTED)
        summary = session.summary()
        self._discard(session, "discarded by DiscardIngest")
        log.info("discarded the parked ingest of dataset %r (%d files)", name, summary.samples)
        return summary

    # --- two phases --------------------------------------------------------------------

    def prepare(self, session: IngestSession) -> DatasetInfo:
        """Finish a RECEIVING ingest without publishing it (PREPARED; phase one of two).

        The dataset is durable and checked (a PREPARE record: a restart
        keeps it prepared); it waits for etcd's decision, which the
        cluster member applies (`commit_prepared` or `abort_prepared`).
        Before the PREPARE record, `prepare_gate(name, generation)` must
        pass: a daemon cut off from etcd, or whose coordinator's intent is
        gone, votes no.  After it, `on_prepared(name, generation)` is told
        (the member looks at etcd again: the decision may already be
        there).  Returns its (unsealed) summary.  Raises as `commit` (but
        for AlreadyExists, checked at commit), FailedPrecondition without a
        cluster member (no --etcd), and what `prepare_gate` raises.
        """
        gate = self.prepare_gate
        generation = generation_of(session.cluster, session.dataset_id)
        if gate is None:
            self.abort(session, "a two-phase ingest needs --etcd")
            raise FailedPrecondition(
                f"dataset {session.name!r}: a striped (two-phase) ingest is decided in etcd, "
                "and this daemon was started without --etcd; start it with --etcd URL")
        try:
            gate(session.name, generation)
        except BaseException as exc:
            self.abort(session, f"not prepared: {exc}")
            raise
        index = self._finish(session)
        try:
            with self._mutex:
                self._expect(session, IngestState.RECEIVING)  # only a shutdown ends it meanwhile
                # Durable before it answers: a restart finds it prepared, not discarded.
                self._catalog.append(records.RecordType.PREPARE,
                                     records.encode_prepare(session.dataset_id, session.replace),
                                     sync=True)
                self._registry.move(session, IngestState.PREPARED, index)
        except BaseException as exc:
            aborted = self.abort(session, f"prepare failed: {type(exc).__name__}: {exc}")
            raise with_outcome(exc, self._discarded_note() if aborted else None)
        if self.on_prepared is not None:
            self.on_prepared(session.name, generation)
        return session.summary()

    def commit_prepared(self, name: str, generation: int = 0) -> DatasetInfo:
        """Seal and publish the prepared ingest of `name` (etcd committed it).

        With a `generation`, only that version is committed, and if it is
        already published the call answers with its summary (a retried
        commit that had succeeded).  Raises NotFound (none prepared),
        InvalidArgument (bad name), and AlreadyExists, StorageFull,
        Unavailable as `commit`; a failed commit aborts the ingest (see `_seal`).
        """
        check_dataset_name(name)
        with self._mutex:
            self.check_open()
            published = self._directory.find(name)
            if generation and published is not None and published.generation == generation:
                return published.summary()
            session, index = self._registry.require_prepared(name)
            if generation and index.generation != generation:
                raise NotFound(f"dataset {name!r} is prepared in generation {index.generation}, "
                               f"not {generation}")
        return self._seal(session, IngestState.PREPARED, index)

    def abort_prepared(self, name: str, generation: int = 0) -> DatasetInfo:
        """Discard the prepared ingest of `name` (of `generation`, unless 0); its summary.
        Raises NotFound (none prepared, or another generation), InvalidArgument,
        Unavailable."""
        check_dataset_name(name)
        with self._mutex:
            self.check_open()
            session, index = self._registry.require_prepared(name)
            if generation and index.generation != generation:
                raise NotFound(f"dataset {name!r} is prepared in generation {index.generation}, "
                               f"not {generation}")
            self._registry.move(session, IngestState.ABORTED)
        self._discard(session, f"etcd decided against generation {index.generation}"
                      if generation else "aborted")
        return session.summary()

    def prepared(self) -> list[tuple[str, int]]:
        """(name, generation) of every PREPARED ingest, in name order.  O(ingests)."""
        with self._mutex:
            return [(s.name, generation_of(s.cluster, s.dataset_id))
                    for s in self._registry.sessions()
                    if self._registry.state(s) is IngestState.PREPARED]

    # --- resumable ingests: break off, park, resume --------------------------------------

    def break_off(self, session: IngestSession, reason: str) -> str | None:
        """The ingest's stream failed: park a resumable RECEIVING ingest that holds
        files durably (checkpoint, or back to the last one when the disk fails:
        IngestSession.park; then PARKED), abort any other.

        Returns what became of the ingest, as the end of the sentence the
        client reads (see `with_outcome`): parked with so many files, taking so
        many bytes of the data dir, and the commands that continue or end it;
        or discarded.  None when the ingest had ended already (sealed, or
        ended by the call that failed, whose error says so).  Never raises.
        """
        with self._mutex:
            state = self._registry.state(session)
            if state is None:
                return None
            park = session.resumable and state is IngestState.RECEIVING and not self._closed
        if not park:
            return self._discarded_note() if self.abort(session, reason) else None
        try:
            checkpoint = session.park()
        except Exception as exc:  # noqa: BLE001 - then nothing can be trusted: discard
            aborted = self.abort(session, f"{reason}; parking it failed too: {exc}")
            return self._discarded_note() if aborted else None
        if checkpoint.samples == 0:  # nothing to resume from: keep no space for it
            aborted = self.abort(session, f"{reason}; it held no file durably")
            return self._discarded_note() if aborted else None
        with self._mutex:
            if self._registry.state(session) is not IngestState.RECEIVING:
                return None
            self._registry.move(session, IngestState.PARKED)
        held = session.disk_bytes()
        log.warning("ingest of dataset %r broke off (%s); parked with %d files durable (%d bytes "
                    "of the data dir), kept %.0f s for a resume", session.name, reason,
                    checkpoint.samples, held, self._resumable_ingest_timeout_s)
        return self._parked_note(session, checkpoint.samples, checkpoint.bytes, held)

    def resume(self, name: str, resume_from: int, replace: bool = False,
               cluster: Cluster | None = None) -> IngestSession:
        """Continue the parked resumable ingest of `name` (-> RECEIVING).

        `resume_from` is the number of files the client skips: it must be
        what the daemon holds, and `replace` and `cluster` must be the
        ingest's own.  The extent the last checkpoint ends in is cut there
        and new data goes to a new extent.  Raises NotFound (nothing to
        resume), ResumeConflict, Overloaded, Unavailable, StorageFull.
        """
        check_dataset_name(name)
        with self._mutex:
            self.check_open()
            found = self._registry.find(name)
            if found is not None and found[1] is IngestState.PREPARED:
                # Before `resumable`: a prepared ingest found at restart has no stream.
                raise ResumeConflict(
                    f"the ingest of dataset {name!r} is prepared (it holds all its files) and "
                    "waits for its commit: the decision in etcd (its coordinator's commit, or "
                    "its lease running out) ends it")
            if found is None or not found[0].resumable:
                raise NotFound(f"no ingest of dataset {name!r} to resume (never started, sealed, "
                               "removed, or not resumed within --resumable-ingest-timeout-s)")
            session, state = found
            if state is IngestState.RECEIVING:
                raise ResumeConflict(f"the ingest of dataset {name!r} is still receiving from "
                                     "another client; resume it once that stream has ended")
            if resume_from != session.samples:
                raise ResumeConflict(
                    f"the ingest of dataset {name!r} holds {session.samples} files durably, the "
                    f"resume assumed {resume_from}; ask again (GetIngestProgress)")
            if replace != session.replace or cluster != session.cluster:
                raise ResumeConflict(
                    f"the ingest of dataset {name!r} was started with other options (replace "
                    f"{session.replace}, striping {session.cluster}); resume it with the same")
            self._check_slots()
            position = session.checkpoint
            self._registry.move(session, IngestState.RECEIVING)
        try:
            writer = ExtentWriter(self._extents, session.dataset_id, session.created_ns,
                                  self._extent_bytes_max, label=f"dataset {name!r}",
                                  resume_after=(position.extent_no, position.extent_end))
            session.resume(writer)
        except BaseException as exc:
            note = self.break_off(session, f"the resume failed: {type(exc).__name__}: {exc}")
            if isinstance(exc, DataCorruption) and self.state(session) is IngestState.PARKED:
                note = (f"the ingest stays parked but cannot be resumed: `dlfs discard {name}` "
                        "ends it, then ingest again")
            raise with_outcome(exc, note)
        log.info("resuming the ingest of dataset %r after %d files", name, resume_from)
        return session

    def progress(self, name: str) -> ProgressInfo:
        """What the unsealed ingest of `name` holds durably (GetIngestProgress).
        Raises NotFound (no unsealed ingest of that name), InvalidArgument."""
        check_dataset_name(name)
        with self._mutex:
            found = self._registry.find(name)
            if found is None:
                raise NotFound(f"no unsealed ingest of dataset {name!r} (never started, sealed, "
                               "removed, or not resumed within --resumable-ingest-timeout-s)")
            session, state = found
            parked_ns, expires_in_s = self._registry.parked_times(session)
            checkpoint = None if state is IngestState.PREPARED else session.checkpoint
        if state is IngestState.PREPARED:  # holds all its files: the commit is what remains
            summary = session.summary()
            samples, size, digest = summary.samples, summary.bytes, b""
            last_path = session.last_path
        elif checkpoint is None:  # not resumable: nothing of it survives a break
            samples, size, digest, last_path = 0, 0, b"", ""
        else:
            samples, size, digest = checkpoint.samples, checkpoint.bytes, checkpoint.digest
            last_path = session.last_path if samples == session.samples else ""
        return ProgressInfo(name, state.value, samples, size, digest, last_path, session.replace,
                            session.cluster, parked_ns, expires_in_s)

    # --- datasets: what the Store asks of the ingests -------------------------------------

    def delete(self, name: str) -> DatasetInfo:
        """Remove the sealed dataset `name` durably, then free its extents (after its
        last read).  Nothing else: an unsealed ingest of the same name (parked,
        say) stays as it is (`discard_parked` ends a parked one).

        Raises InvalidArgument, NotFound (no sealed dataset; the message names
        an unsealed ingest of that name and what ends it), Unavailable
        (shutting down), StorageFull, StorageFailed and CatalogFailed (the
        dataset stays then).
        """
        check_dataset_name(name)
        self._check_change(name, "deleted")
        with self._mutex:
            self.check_open()
            dataset = self._directory.find(name)
            if dataset is None:
                found = self._registry.find(name)
                if found is None:
                    self._directory.get(name)  # raises NotFound, saying how to list them
                raise NotFound(f"no dataset named {name!r}" + self._unsealed_hint(*found))
            # Durable first, then gone from listings: a failed append (disk full,
            # a failed catalog) leaves the dataset listed and whole.
            self._catalog.append(records.RecordType.DELETE,
                                 records.encode_delete(dataset.dataset_id), sync=True)
            self._directory.remove(name)
        self._leases.retire(dataset.dataset_id)
        log.info("deleted dataset %r (%d samples)", name, len(dataset))
        return dataset.summary()

    def _check_change(self, name: str, change: str) -> None:
        """Ask `change_gate` (outside `_mutex`: it may ask etcd) whether `name` may be
        `change`d here."""
        gate = self.change_gate
        if gate is not None:
            gate(name, change)

    def _unsealed_hint(self, session, state: IngestState) -> str:
        """What a delete of a name that only an unsealed ingest has says about it."""
        if state is IngestState.PARKED:
            return (f" (an ingest of it broke off and is parked with {session.samples:,} files: "
                    f"`dlfs discard {session.name}` ends it)")
        if state is IngestState.PREPARED:
            return (" (an ingest of it is prepared and waits for the decision in etcd: its "
                    "coordinator's commit, or its lease running out)")
        return " (it is being ingested; it exists once that ingest is sealed)"

    def state(self, session: IngestSession) -> IngestState | None:
        """RECEIVING, PREPARED or PARKED while the ingest runs; None once sealed or aborted."""
        with self._mutex:
            return self._registry.state(session)

    def find(self, name: str) -> tuple[IngestSession, IngestState] | None:
        """The unsealed ingest of `name` and its state, or None.  O(1)."""
        with self._mutex:
            return self._registry.find(name)

    def ingesting_generation(self, name: str) -> int:
        """The generation an unsealed ingest of `name` would publish, 0 if none runs."""
        found = self.find(name)
        return 0 if found is None else generation_of(found[0].cluster, found[0].dataset_id)

    def summaries(self) -> list[DatasetInfo]:
        """The unsealed ingests' summaries with their states, in name order."""
        with self._mutex:
            return [dataclasses.replace(s.summary(), ingest_state=self._registry.state(s).value)
                    for s in self._registry.sessions()]

    def active_count(self) -> int:
        """Ingests holding a stream or a prepared index (parked ones not counted)."""
        with self._mutex:
            return self._registry.active_count()

    def check_invariants(self) -> None:
        """Assert the ingests and the directory agree.  O(datasets + ingests); for tests."""
        with self._mutex:
            self._registry.check_invariants()
            running = {s.dataset_id for s in self._registry.sessions()}
            published = {d.dataset_id for d in self._directory.all()}
            assert not running & published, "a running ingest's dataset is published"
            assert all(i < self._next_dataset_id for i in running | published)

    # --- inside the transitions -------------------------------------------------------

    def _check_slots(self) -> None:
        """Raise Overloaded when ingests_concurrent_max streams run (caller holds `_mutex`)."""
        running = self._registry.active_count()
        if running >= self._ingests_concurrent_max:
            raise Overloaded(
                f"{running} ingests are running, the limit (--ingests-concurrent-max) is "
                f"{self._ingests_concurrent_max}; retry later")

    def _finish(self, session: IngestSession) -> DatasetIndex:
        """`session.finish()` of a RECEIVING ingest; aborts the ingest when it fails."""
        with self._mutex:
            self._expect(session, IngestState.RECEIVING)
        try:
            return session.finish()
        except BaseException as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, DISK_ERRORS):  # a resumable one keeps its durable files
                note = self.break_off(session, reason)
            else:  # what was sent cannot be sealed: a resume would not change that
                note = self._discarded_note() if self.abort(session, reason) else None
            raise with_outcome(exc, note)

    def _seal(self, session: IngestSession, expected: IngestState,
              index: DatasetIndex) -> DatasetInfo:
        """Durably seal and publish `index` if `session` is still `expected` (-> SEALED).

        A failure aborts the ingest, except for a prepared ingest whose first
        member decides (another member of a striped dataset), or when the
        catalog failed: that one stays prepared, as two-phase commit requires
        of a member that voted yes.
        """
        try:
            # Before the SEAL: a failure here (no memory for the index the data path's
            # workers share) leaves nothing durable to undo.
            self._directory.prepare(index)
            with self._mutex:
                self._expect(session, expected)
                previous = self._directory.find(session.name)
                if previous is not None and not session.replace:
                    raise AlreadyExists(f"dataset {session.name!r} appeared during the ingest")
                replaces = previous.dataset_id if previous is not None else 0
                faults.point("seal", session.name)
                self._catalog.append(records.RecordType.SEAL,
                                     records.encode_seal(session.dataset_id, replaces), sync=True)
                self._directory.publish(index)
                self._registry.move(session, IngestState.SEALED)
        except BaseException as exc:
            if expected is IngestState.PREPARED:
                # Not ours to abort: etcd decided commit (or, a failed catalog, our
                # own SEAL may be on disk).  Stay prepared: the cluster member
                # applies etcd's decision again, or the restart's replay decides.
                log.warning("commit of dataset %r failed (%s: %s); it stays prepared until "
                            "etcd's decision is applied again", session.name,
                            type(exc).__name__, exc)
                raise
            aborted = self.abort(session, f"commit failed: {type(exc).__name__}: {exc}")
            raise with_outcome(exc, self._discarded_note() if aborted else None)
        if previous is not None:
            self._leases.retire(previous.dataset_id)
        self._metrics.ingested_samples.inc(len(index))
        self._metrics.ingested_bytes.inc(index.total_bytes)
        log.info("sealed dataset %r: %d samples, %d bytes%s", index.name, len(index),
                 index.total_bytes, " (replaced the previous one)" if previous else "")
        return index.summary()

    def _expire(self, session) -> None:
        """Timer thread: a parked ingest was not resumed in time: discard it."""
        with self._mutex:
            if self._registry.state(session) is not IngestState.PARKED:
                return  # resumed or removed meanwhile
            self._registry.move(session, IngestState.ABORTED)
        self._discard(session, "not resumed within "
                               f"{self._resumable_ingest_timeout_s:.0f} s "
                               "(--resumable-ingest-timeout-s)")

    def _discard(self, session: IngestSession, reason: str) -> None:
        """What ABORTED means on disk (after the move, outside `_mutex`).  Never raises:
        it runs on the error paths of every front door, whose reply must still go
        out; what it could not remove, the next start removes (replay)."""
        log.warning("ingest of dataset %r aborted: %s", session.name, reason)
        try:
            session.discard()
        except Exception:  # noqa: BLE001 - logged with its traceback; replay cleans up
            log.exception("discarding the ingest of dataset %r failed; the next start "
                          "removes what it left", session.name)

    def _discarded_note(self) -> str:
        """The end of an error message whose ingest was aborted."""
        if self._catalog.failed:
            return "the ingest was discarded (its extents go when the daemon restarts)"
        return "the ingest was discarded: nothing of it takes space on the data dir"

    def _parked_note(self, session, samples: int, size: int, held: int) -> str:
        """The end of an error message whose ingest was parked."""
        return (f"the ingest is parked with {samples:,} files ({size:,} bytes) durable, which "
                f"take {held:,} bytes of the data dir for up to "
                f"{_duration(self._resumable_ingest_timeout_s)} (--resumable-ingest-timeout-s): "
                "run the same `dlfs ingest` command with --resume to continue it, or "
                f"`dlfs discard {session.name}` to end it and free that space")

    def _expect(self, session: IngestSession, state: IngestState) -> None:
        """Raise unless `session` is in `state` (caller holds `_mutex`)."""
        self.check_open()  # closing aborts every ingest: Unavailable says why
        self._registry.require(session, state)


def _duration(seconds: float) -> str:
    """'24 h', '90 min', '45 s': a timeout as an operator set it."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:.0f} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def with_outcome(exc: BaseException, note: str | None) -> BaseException:
    """`exc` with `note` (what became of the ingest) added to its message: a new error
    of the same DlfsError class; any other exception, or no note, unchanged."""
    if note is None or not isinstance(exc, DlfsError) or note in exc.message:
        return exc
    noted = type(exc)(f"{exc.message}; {note}")
    noted.request_id = exc.request_id
    noted.__cause__ = exc  # the traceback the daemon logs goes back to the disk's error
    return noted

