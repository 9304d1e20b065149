"""The Store's resumable ingests: parking a broken-off one, resuming it, its progress.

A part of `Store` (store.py), as a class it inherits from, like
store_ingests.py: the methods run under the Store's lock and move ingest
states only through the registry.  What a checkpoint is, and what replay
makes of it, is in checkpoints.py.

A resumable ingest whose stream breaks off while it RECEIVEs is PARKED: its
last checkpoint is durable, the dataset stays invisible, and a resume
(IngestStart.resume) continues it after the files the checkpoint holds.  A
PREPARED ingest is never resumed, resumable or not: it voted yes in a
two-phase commit and only that commit's decision ends it (a resuming client
finds it prepared and commits it).  Nothing here imports grpc.
"""

from __future__ import annotations

import logging
import time

from dlfs.errors import NotFound, ResumeConflict
from dlfs.paths import check_dataset_name
from dlfs.server.core.directory import Cluster
from dlfs.server.core.extents import ExtentWriter
from dlfs.server.ingest.ingest_session import IngestSession
from dlfs.server.ingest.ingest_registry import IngestState
from dlfs.server.core.checkpoints import ParkedIngest, ProgressInfo

log = logging.getLogger(__name__)


class StoreResumes:
    """The resumable-ingest part of `Store`; see the module docstring."""

    def resume_ingest(self, name: str, resume_from: int, replace: bool = False,
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
            self._check_open()
            found = self._ingests.find(name)
            if found is None or not found[0].resumable:
                raise NotFound(f"no ingest of dataset {name!r} to resume (never started, sealed, "
                               "removed, or not resumed within --resumable-ingest-timeout-s)")
            session, state = found
            if state is IngestState.RECEIVING:
                raise ResumeConflict(f"the ingest of dataset {name!r} is still receiving from "
                                     "another client; resume it once that stream has ended")
            if state is IngestState.PREPARED:
                raise ResumeConflict(
                    f"the ingest of dataset {name!r} is prepared (it holds all its files) and "
                    "waits for its commit; `dlfs ingest --resume` with every member in "
                    "--server commits it")
            if resume_from != session.samples:
                raise ResumeConflict(
                    f"the ingest of dataset {name!r} holds {session.samples} files durably, the "
                    f"resume assumed {resume_from}; ask again (GetIngestProgress)")
            if replace != session.replace or cluster != session.cluster:
                raise ResumeConflict(
                    f"the ingest of dataset {name!r} was started with other options (replace "
                    f"{session.replace}, striping {session.cluster}); resume it with the same")
            self._check_ingest_slots()
            position = session.checkpoint
            self._ingests.move(session, IngestState.RECEIVING)
        try:
            writer = ExtentWriter(self.extents, session.dataset_id, session.created_ns,
                                  self.config.extent_bytes_max, label=f"dataset {name!r}",
                                  resume_after=(position.extent_no, position.extent_end))
            session.resume(writer)
        except BaseException as exc:
            self.break_off(session, f"the resume failed: {type(exc).__name__}: {exc}")
            raise
        log.info("resuming the ingest of dataset %r after %d files", name, resume_from)
        return session

    def break_off(self, session: IngestSession, reason: str) -> None:
        """The ingest's stream failed: park a resumable RECEIVING ingest (checkpoint,
        then PARKED), abort any other.  Never raises."""
        with self._mutex:
            state = self._ingests.state(session)
            if state is None:
                return
            park = session.resumable and state is IngestState.RECEIVING and not self._closed
        if not park:
            self.abort_ingest(session, reason)
            return
        try:
            checkpoint = session.park()
        except Exception as exc:  # noqa: BLE001 - then nothing can be trusted: discard
            self.abort_ingest(session, f"{reason}; parking it failed too: {exc}")
            return
        with self._mutex:
            if self._ingests.state(session) is not IngestState.RECEIVING:
                return
            self._ingests.move(session, IngestState.PARKED)
        log.warning("ingest of dataset %r broke off (%s); parked with %d files durable, kept "
                    "%.0f s for a resume", session.name, reason, checkpoint.samples,
                    self.config.resumable_ingest_timeout_s)

    def ingest_progress(self, name: str) -> ProgressInfo:
        """What the unsealed ingest of `name` holds durably (GetIngestProgress).

        Raises NotFound (no unsealed ingest of that name), InvalidArgument.
        """
        check_dataset_name(name)
        with self._mutex:
            found = self._ingests.find(name)
            if found is None:
                raise NotFound(f"no unsealed ingest of dataset {name!r} (never started, sealed, "
                               "removed, or not resumed within --resumable-ingest-timeout-s)")
            session, state = found
            parked_ns, expires_in_s = self._ingests.parked_times(session)
            checkpoint = None if state is IngestState.PREPARED else session.checkpoint
        if state is IngestState.PREPARED:  # holds all its files: the commit is what remains
            summary = session.summary()
            samples, size, digest = summary.samples, summary.bytes, b""
            last_path = getattr(session, "last_path", "")  # a RecoveredIngest has none
        elif checkpoint is None:  # not resumable: nothing of it survives a break
            samples, size, digest, last_path = 0, 0, b"", ""
        else:
            samples, size, digest = checkpoint.samples, checkpoint.bytes, checkpoint.digest
            last_path = session.last_path if samples == session.samples else ""
        return ProgressInfo(name, state.value, samples, size, digest, last_path, session.replace,
                            session.cluster, parked_ns, expires_in_s)

    def _recover_parked(self, parked: list[ParkedIngest]) -> None:
        """Register the resumable ingests replay found broken off as PARKED, each
        expiring --resumable-ingest-timeout-s after its last checkpoint."""
        with self._mutex:
            for entry in parked:
                session = IngestSession.restored(entry.name, entry.dataset_id, entry.created_ns,
                                                 self._catalog, entry.blocks, entry.checkpoint,
                                                 entry.cluster, self.extents)
                session.checkpoint_bytes = self.config.ingest_checkpoint_bytes
                session.checkpoint_interval_s = self.config.ingest_checkpoint_interval_s
                waited_s = max(0.0, (time.time_ns() - entry.checkpoint.time_ns) / 1e9)
                self._ingests.add_parked(session, entry.checkpoint.time_ns,
                                         self.config.resumable_ingest_timeout_s - waited_s)
                log.warning("ingest of dataset %r is parked with %d files durable (it broke off "
                            "when the daemon stopped); `dlfs ingest --resume` continues it",
                            entry.name, entry.checkpoint.samples)
