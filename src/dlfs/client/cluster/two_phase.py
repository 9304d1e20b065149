"""Two-phase ingest over several daemons: all members prepare, then the first commits.

`run_two_phase` opens one Ingest stream per member (`_MemberStream`, fed
through a bounded queue by a producer: striped ingest
(`dlfs.client.cluster.striped_ingest`) or a rebalance
(`dlfs.client.cluster.rebalance`)).  Each stream ends with the member's part
durable but unpublished (prepared).  Only when every member prepared is the
first member told to commit: its SEAL is the decision; then the others
commit (see `_commit`).  Any failure before that aborts every member
(unless the ingest is resumable: then the members park what they hold).
The protocol is spoken through each member's `control` calls
(`contract.DaemonControl`: ingest, commit_ingest, abort_ingest,
ingest_outcome).
"""

from __future__ import annotations

import logging
import queue
import secrets
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from dlfs import limits
from dlfs.client.transport.ingest_requests import IngestStart
from dlfs.client.transport.control_replies import ABORTED, COMMITTED
from dlfs.errors import Cancelled, DlfsError, InvalidArgument, Unavailable
from dlfs.types import DatasetInfo

log = logging.getLogger(__name__)
_END = object()
_ABORT = object()


class _Aborted(Exception):
    """Raised inside a member's request stream to cancel its Ingest call."""


class MemberFailed(Exception):
    """A member's stream failed while the producer was still reading files
    (`check_streams` raises it; `run_two_phase` reports the member's own error)."""

    def __init__(self, stream):
        super().__init__(stream.member.address)
        self.stream = stream


def run_two_phase(router, name: str, members: list[str], replicas: int, *,
                  replace: bool, produce, total_bytes: int, progress: bool | None,
                  desc: str, generation: int | None = None, start_fields=None,
                  keep_on_failure: bool = False) -> DatasetInfo:
    """One prepared Ingest stream per member, fed by `produce(streams, bar)`, then commit.

    `produce` puts pieces on each member's stream (`stream.put`) and calls
    `check_streams(streams)` between samples; `bar` (None or a tqdm bar of
    `total_bytes`) is its to update.  If it raises, or any member fails,
    every member aborts and nothing is kept; OSError from the producer
    becomes InvalidArgument (the source could not be read).  Returns the
    first member's DatasetInfo after all committed.  `generation`: the
    version to name (a resume repeats the broken-off ingest's); default a new
    one.  `start_fields`: per member, more IngestStart fields (resuming).
    `keep_on_failure`: a failure aborts no prepared member (resumable
    ingests: they are parked and can be resumed).
    """
    # The new version's number, the same on every member (above the dataset ids
    # daemons hand out), so readers can tell it from the one it replaces.
    if generation is None:
        generation = limits.cluster_generation_min | secrets.randbits(62)
    streams = [_MemberStream(router.member(address), name, replace, members, replicas, index,
                             generation, **(start_fields[index] if start_fields else {}))
               for index, address in enumerate(members)]
    bar = None
    if progress if progress is not None else sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                   file=sys.stderr)
    threads = [threading.Thread(target=s.run, name=f"dlfs-ingest-{s.index}", daemon=True)
               for s in streams]
    for thread in threads:
        thread.start()
    try:
        produce(streams, bar)
    except BaseException as exc:
        for stream in streams:
            stream.put(_ABORT)  # the member's call is cancelled: it keeps nothing
        for thread in threads:
            thread.join()
        if not keep_on_failure:
            _finish_all(streams, commit=False)
        if isinstance(exc, OSError):
            raise InvalidArgument(f"cannot read the source: {exc}") from None
        if not isinstance(exc, MemberFailed):
            raise
    else:
        for stream in streams:
            stream.put(_END)
        for thread in threads:
            thread.join()
    finally:
        if bar is not None:
            bar.close()
    failures = [(s.member.address, s.error) for s in streams if s.error is not None]
    # The member that failed first, not those the client then cancelled.
    failures.sort(key=lambda failure: isinstance(failure[1], (Cancelled, _Aborted)))
    if failures:
        if not keep_on_failure:
            _finish_all(streams, commit=False)
        address, error = failures[0]
        if isinstance(error, DlfsError):
            kept = "" if keep_on_failure else ", nothing was kept"  # else the caller says
            raise type(error)(f"ingest into {address} failed{kept}: {error.message}")
        raise error
    return _commit(streams, name)


def _commit(streams, name: str) -> DatasetInfo:
    """Commit on the first member, whose SEAL is the decision, then on the others.

    A member the commit does not reach (down, restarted) stays prepared and
    learns the decision from the first member by itself (GetIngestOutcome,
    server/grpc/decisions.py), so once the first member committed, the dataset
    is committed: the others' failures are logged, not raised.  If the
    first member's commit fails, its outcome is asked: aborted, every
    member aborts; committed, the others commit; otherwise (no answer, or
    its catalog failed) the outcome is not known yet and the members follow
    whatever it turns out to be.
    """
    first, rest = streams[0], streams[1:]
    [(address, result)] = _finish_all([first], commit=True)
    if isinstance(result, Exception):
        # An error need not mean "not committed" (its SEAL may be on disk): the
        # first member's own answer decides whether the others may abort.
        outcome = _outcome(first)
        if outcome == ABORTED:
            _finish_all(rest, commit=False)
            raise type(result)(f"dataset {name!r} was not committed: its first member "
                               f"{address} refused ({result.message}); nothing was kept")
        if outcome != COMMITTED:
            raise Unavailable(
                f"the commit of dataset {name!r} on its first member {address} did not "
                f"finish ({result.message}); the other members follow its decision once it "
                "has one: `dlfs datasets` shows the dataset once it is published")
        result = first.member.control.get_dataset(name)
    for address, other in _finish_all(rest, commit=True):
        if isinstance(other, Exception):
            log.warning("dataset %r is committed, but %s did not confirm (%s); it commits by "
                        "itself once it reaches %s", name, address, other, first.member.address)
    return result


def check_streams(streams) -> None:
    """Raise (ending the producer) once any member's stream has failed."""
    failed = next((s for s in streams if s.error is not None), None)
    if failed is not None:  # stop every member: a striped ingest is all or nothing
        raise MemberFailed(failed)


def _outcome(stream) -> str | None:
    """The outcome of the stream's generation on its member (`control_replies.COMMITTED`, ...);
    None if it does not answer."""
    try:
        return stream.member.control.ingest_outcome(stream.name, stream.start.generation)
    except DlfsError:
        return None


def _finish_all(streams, commit: bool) -> list[tuple[str, object]]:
    """CommitIngest (or AbortIngest) on every prepared member, all at once.

    In parallel so that the window in which some members published and
    others not yet is one round trip, not one per member.  Returns, in
    member order, (address, DatasetInfo or the DlfsError it raised).
    """
    prepared = [stream for stream in streams if stream.prepared]
    for stream in prepared:
        stream.prepared = False

    def finish(stream):
        control = stream.member.control
        try:
            decide = control.commit_ingest if commit else control.abort_ingest
            return stream.member.address, decide(stream.name, stream.start.generation)
        except DlfsError as exc:
            return stream.member.address, exc

    if not prepared:
        return []
    with ThreadPoolExecutor(max_workers=min(len(prepared), limits.cluster_calls_in_flight_max),
                            thread_name_prefix="dlfs-commit") as pool:
        return list(pool.map(finish, prepared))


class _MemberStream:
    """One member's Ingest call, fed piece by piece through a bounded queue."""

    def __init__(self, member, name: str, replace: bool, members: list[str], replicas: int,
                 index: int, generation: int, prepared_already: bool = False, **start_fields):
        """`prepared_already`: the member holds its part prepared (a resumed ingest that
        broke off before its commit): no stream, it joins the commit."""
        self.member = member
        self.prepared_already = prepared_already
        self.name = name
        self.index = index
        self.start = IngestStart(dataset=name, replace=replace, members=tuple(members),
                                 replicas=replicas, member_index=index, prepare_only=True,
                                 generation=generation, **start_fields)
        self._queue: queue.Queue = queue.Queue(maxsize=limits.ingest_queue_pieces_max)
        self.error: BaseException | None = None
        self.prepared = False
        self.aborted = False  # the client cancelled this member's call itself

    def put(self, piece) -> None:
        if self.prepared_already:
            return
        while self.error is None:
            try:
                self._queue.put(piece, timeout=0.1)
                return
            except queue.Full:
                continue

    def _pieces(self):
        while (piece := self._queue.get()) is not _END:
            if piece is _ABORT:
                self.aborted = True
                raise _Aborted("the client stopped the ingest")
            yield piece

    def run(self) -> None:
        if self.prepared_already:
            self.prepared = True
            return
        try:
            self.member.control.ingest(self.start, self._pieces())
            self.prepared = True
        except BaseException as exc:  # noqa: BLE001 - reported by run_two_phase
            self.error = _Aborted("cancelled by the client") if self.aborted else exc
        finally:
            while True:  # unblock the producer if it is waiting on this queue
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
