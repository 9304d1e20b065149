"""Striped ingest: one dataset over several daemons, all of them or none.

`ingest_striped` reads every file once (with the reader pool of
`dlfs.client.ingest_upload`: many files in flight, bounded memory), streams it to
its holders (rendezvous placement, `dlfs.client.cluster.placement`) and its
metadata to every other member, with two-phase commit: all members prepare
(durable, unpublished), then the first member commits (its SEAL is the
decision), then the others (see `_commit`).  `run_two_phase` is that protocol
for any producer; rebalancing (`dlfs.client.cluster.rebalance`) uses it too.
`router` is the `ClusterRouter` of the members.

Resumable striped ingests: each member parks its part when its stream
breaks off; a resume asks every member what it holds (each may hold a
different number of files) and sends each member the files after its own.
"""

from __future__ import annotations

import logging
import queue
import secrets
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc

from dlfs import limits
from dlfs.client.transport import grpc_types
from dlfs.client.transport.grpc_errors import from_rpc_error
from dlfs.client.ingest_upload import (
    Duplicates,
    as_source_set,
    batch_messages,
    check_prefix,
    check_resumable,
    dir_pieces,
    get_progress,
    ordered_files,
    pool_for,
    resume_hint,
    resume_prefix,
)
from dlfs.client.cluster.placement import member_hashes, place, place_one
from dlfs.staging.progress import IngestProgress, IngestStats, progress_mode
from dlfs.staging.read_pool import READERS_DEFAULT
from dlfs.errors import Cancelled, DlfsError, InvalidArgument, ResumeConflict, Unavailable
from dlfs.proto import dlfs_pb2 as pb
from dlfs.types import DatasetInfo

log = logging.getLogger(__name__)
_END = object()
_ABORT = object()


class _Aborted(Exception):
    """Raised inside a member's request stream to cancel its Ingest call."""


class _MemberFailed(Exception):
    """A member's stream failed while the producer was still reading files."""

    def __init__(self, stream):
        super().__init__(stream.member.address)
        self.stream = stream


def ingest_striped(router, source, name: str, *, replace: bool, replicas: int,
                   progress: bool | str | None, readers: int = READERS_DEFAULT,
                   resumable: bool = False, resume: bool = False, via: str = "auto",
                   stats: IngestStats | None = None) -> DatasetInfo:
    """Stripe `source` (see `dlfs.client.ingest_upload.upload`) over all members with
    `replicas` copies each.

    Every member gets the whole directory (metadata of every sample) and the
    bytes of the samples it holds.  Two-phase: each member's stream ends with
    its data durable but unpublished; only when all succeeded are they told
    to commit.  On any failure every member aborts and nothing is kept,
    unless `resumable`: then each member that was receiving parks what it
    holds durably, and `resume=True` continues them; members found prepared
    get no stream and join the commit (first member first).  Members are fed
    over gRPC whatever `via` says.
    """
    # The daemons the client was given, not every member it has learnt of from
    # other datasets' placements (a dead one among them would fail the ingest).
    members = list(router.addresses)
    sources = as_source_set(source)
    duplicates = Duplicates() if sources.needs_duplicate_check else None
    resumable = resumable or resume
    skips = [0] * len(members)
    fields = [{"resumable": resumable} for _ in members]
    generation = None
    if resume:
        generation = _resume_points(router, members, replicas, replace, name, sources,
                                    duplicates, skips, fields)
    skip = min(skips)
    if sources.known_files is not None:
        paths = [f.path for f in sources.entries()]
        table = place(name, paths, members, replicas).tolist()
        del paths

        def holders_of(index, _file):
            return table[index]
    else:
        hashes = member_hashes(members)

        def holders_of(_index, file):
            return place_one(name, file.path, hashes, replicas)

    meter = IngestProgress(f"ingest {name} ({len(members)} daemons, {replicas}x)",
                           sources.total_bytes, mode=progress_mode(progress),
                           known_files=None if sources.known_files is None
                           else sources.known_files - skip)
    with pool_for(sources, skip, readers) as pool:
        def produce(streams, _bar) -> None:
            _produce(ordered_files(pool, meter, duplicates), skip, skips, holders_of, streams,
                     sources.dirs)

        try:
            info = run_two_phase(router, name, members, replicas, replace=replace,
                                 produce=produce, total_bytes=0, progress=False, desc="",
                                 generation=generation, start_fields=fields,
                                 keep_on_failure=resumable)
        except DlfsError as exc:
            if resumable:
                raise resume_hint(exc, [router.member(a) for a in members], name) from None
            raise
        finally:
            elapsed = meter.close()
    if stats is not None:
        stats.files, stats.data_bytes = meter.files, meter.data_bytes
        stats.source_bytes, stats.elapsed_s, stats.readers = meter.source_bytes, elapsed, readers
        stats.resumed_files = skip
    return info


def _resume_points(router, members, replicas, replace, name, sources, duplicates, skips,
                   fields) -> int | None:
    """Ask every member what it holds; fill `skips` and `fields`; return the generation
    to reuse (None when nothing is parked anywhere)."""
    results = router.each(lambda member: get_progress(member, name))
    states = []
    for index, address in enumerate(members):
        state = results.get(address)
        if isinstance(state, Exception):
            raise state
        if state is None:
            continue
        check_resumable(state, name, address)
        if (list(state.members) != members or state.replicas != replicas
                or state.member_index != index or state.replace != replace):
            raise ResumeConflict(
                f"the broken-off ingest of {name!r} on {address} was started over "
                f"{', '.join(state.members) or 'that daemon alone'} with {state.replicas} "
                f"replicas{' and --replace' if state.replace else ''}; resume it with the same "
                "--server list (same order), --replicas and --replace")
        states.append((index, state))
    if not states:
        return None
    generations = {state.generation for _, state in states}
    if len(generations) != 1:
        raise ResumeConflict(f"the members hold different versions of the broken-off ingest of "
                             f"{name!r}; remove it (`dlfs rm {name}`) and ingest again")
    prefixes = resume_prefix(sources, [state.samples for _, state in states], duplicates)
    for index, state in states:
        skips[index] = state.samples
        if state.state == "prepared":  # holds all its files: it only waits for the commit
            fields[index] = {"prepared_already": True}
            continue
        check_prefix(state, prefixes[state.samples], name, members[index])
        fields[index].update(resume=True, resume_from=state.samples)
    return generations.pop()  # members that hold nothing start from the beginning


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
        if not isinstance(exc, _MemberFailed):
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
            raise type(error)(f"ingest into {address} failed, nothing was kept: {error.message}")
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
        if outcome == pb.IngestOutcome.ABORTED:
            _finish_all(rest, commit=False)
            raise type(result)(f"dataset {name!r} was not committed: its first member "
                               f"{address} refused ({result.message}); nothing was kept")
        if outcome != pb.IngestOutcome.COMMITTED:
            raise Unavailable(
                f"the commit of dataset {name!r} on its first member {address} did not "
                f"finish ({result.message}); the other members follow its decision once it "
                "has one: `dlfs datasets` shows the dataset once it is published")
        result = grpc_types.dataset_info(first.member.call(
            "GetDataset", pb.GetDatasetRequest(dataset=name)))
    for address, other in _finish_all(rest, commit=True):
        if isinstance(other, Exception):
            log.warning("dataset %r is committed, but %s did not confirm (%s); it commits by "
                        "itself once it reaches %s", name, address, other, first.member.address)
    return result


def check_streams(streams) -> None:
    """Raise (ending the producer) once any member's stream has failed."""
    failed = next((s for s in streams if s.error is not None), None)
    if failed is not None:  # stop every member: a striped ingest is all or nothing
        raise _MemberFailed(failed)


def _outcome(stream) -> int | None:
    """GetIngestOutcome of the stream's generation on its member; None if it does not answer."""
    request = pb.IngestOutcomeRequest(dataset=stream.name, generation=stream.start.generation)
    try:
        return stream.member.call("GetIngestOutcome", request, retry=True).state
    except DlfsError:
        return None


def _finish_all(streams, commit: bool) -> list[tuple[str, object]]:
    """CommitIngest (or AbortIngest) on every prepared member, all at once.

    In parallel so that the window in which some members published and
    others not yet is one round trip, not one per member.  Returns, in
    member order, (address, DatasetInfo or the DlfsError it raised).
    """
    method = "CommitIngest" if commit else "AbortIngest"
    prepared = [stream for stream in streams if stream.prepared]
    for stream in prepared:
        stream.prepared = False

    def finish(stream):
        try:
            request = pb.CommitIngestRequest(dataset=stream.name,
                                             generation=stream.start.generation)
            reply = stream.member.call(method, request, retry=True)
            return stream.member.address, grpc_types.dataset_info(reply)
        except DlfsError as exc:
            return stream.member.address, exc

    if not prepared:
        return []
    with ThreadPoolExecutor(max_workers=min(len(prepared), limits.cluster_calls_in_flight_max),
                            thread_name_prefix="dlfs-commit") as pool:
        return list(pool.map(finish, prepared))


def _produce(chunks, skip: int, skips: list[int], holders_of, streams, dirs=()) -> None:
    """Each file's pieces to its holders, its metadata to the other members; a member
    gets only the files after those it already holds (`skips`, resuming).  Every
    member's stream starts with the empty directories `dirs` (a resumed one too)."""
    for piece in dir_pieces(dirs):
        for stream in streams:
            stream.put(piece)
    index = skip - 1
    holders: list[int] = []
    holding: list = []
    current = None
    for file, data, last, crc in chunks:
        if file is not None:
            check_streams(streams)
            index += 1
            current = file
            holders = holders_of(index, file)
            holding = [streams[h] for h in holders if index >= skips[h]]
            piece = pb.IngestPiece(path=file.path, size=file.size, mode=file.mode,
                                   mtime_ns=file.mtime_ns, holders=holders, data=data)
        else:
            piece = pb.IngestPiece(data=data)
        if last:
            piece.crc32c = crc
        for stream in holding:
            stream.put(piece)
        if last:
            remote = pb.IngestPiece(path=current.path, size=current.size, mode=current.mode,
                                    mtime_ns=current.mtime_ns, holders=holders, crc32c=crc,
                                    remote=True)
            for member, stream in enumerate(streams):
                if member not in holders and index >= skips[member]:
                    stream.put(remote)


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
        self.start = pb.IngestStart(dataset=name, replace=replace, members=members,
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

    def _messages(self):
        yield pb.IngestMessage(start=self.start)
        yield from batch_messages(self._pieces())

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
            self.member.ingest(self._messages())
            self.prepared = True
        except grpc.RpcError as exc:
            self.error = (_Aborted("cancelled by the client") if self.aborted
                          else from_rpc_error(exc, self.member.address))
        except BaseException as exc:  # noqa: BLE001 - reported by ingest_striped
            self.error = exc
        finally:
            while True:  # unblock the producer if it is waiting on this queue
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
