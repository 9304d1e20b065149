"""Striped ingest: one dataset over several daemons, all of them or none.

`ingest_striped` reads every file once, streams it to its holders
(rendezvous placement, `dlfs.client.placement`) and its metadata to every
other member, with two-phase commit: all members prepare (durable,
unpublished), then the first member commits (its SEAL is the decision), then
the others (see `_commit`).  `run_two_phase` is that protocol for any
producer; rebalancing (`dlfs.client.rebalance`) uses it too.  `router` is
the `ClusterRouter` of the members.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import secrets
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np

from dlfs import limits
from dlfs.client import convert
from dlfs.client.errors import from_rpc_error
from dlfs.client.ingest import batch_messages, dir_pieces, file_pieces
from dlfs.client.placement import place
from dlfs.errors import Cancelled, DlfsError, InvalidArgument, Unavailable
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


def ingest_striped(router, report, name: str, *, replace: bool, replicas: int,
                   progress: bool | None) -> DatasetInfo:
    """Stripe the walked files over all members with `replicas` copies each.

    Every member gets the whole directory (metadata of every sample) and the
    bytes of the samples it holds.  Two-phase: each member's stream ends with
    its data durable but unpublished; only when all succeeded are they told
    to commit.  On any failure every member aborts and nothing is kept.
    """
    members = list(router.members)
    paths = [f.path for f in report.files]
    holders = place(name, paths, members, replicas)

    def produce(streams, bar) -> None:
        _produce(report.files, holders, streams, bar, report.dirs)

    info = run_two_phase(router, name, members, replicas, replace=replace, produce=produce,
                         total_bytes=report.bytes, progress=progress,
                         desc=f"ingest {name} ({len(members)} daemons, {replicas}x)")
    return dataclasses.replace(info, samples=len(paths), bytes=report.bytes)


def run_two_phase(router, name: str, members: list[str], replicas: int, *,
                  replace: bool, produce, total_bytes: int, progress: bool | None,
                  desc: str) -> DatasetInfo:
    """One prepared Ingest stream per member, fed by `produce(streams, bar)`, then commit.

    `produce` puts pieces on each member's stream (`stream.put`) and calls
    `check_streams(streams)` between samples; `bar` (None or a tqdm bar of
    `total_bytes`) is its to update.  If it raises, or any member fails,
    every member aborts and nothing is kept; OSError from the producer
    becomes InvalidArgument (the source could not be read).  Returns the
    first member's DatasetInfo after all committed.
    """
    # The new version's number, the same on every member (above the dataset ids
    # daemons hand out), so readers can tell it from the one it replaces.
    generation = limits.cluster_generation_min | secrets.randbits(62)
    streams = [_MemberStream(router.member(address), name, replace, members, replicas, index,
                             generation)
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
    server/decisions.py), so once the first member committed, the dataset
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
        result = convert.dataset_info(first.member.call(
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
            return stream.member.address, convert.dataset_info(reply)
        except DlfsError as exc:
            return stream.member.address, exc

    if not prepared:
        return []
    with ThreadPoolExecutor(max_workers=min(len(prepared), limits.cluster_calls_in_flight_max),
                            thread_name_prefix="dlfs-commit") as pool:
        return list(pool.map(finish, prepared))


def _produce(files, holders: np.ndarray, streams, bar, dirs=()) -> None:
    """Read each file once; its pieces go to its holders, its metadata to the others.
    Every member gets the empty directories `dirs`."""
    for piece in dir_pieces(dirs):
        for stream in streams:
            stream.put(piece)
    for file, file_holders in zip(files, holders.tolist()):
        check_streams(streams)
        holding = [streams[h] for h in file_holders]
        for piece in file_pieces(file, file_holders):
            for stream in holding:
                stream.put(piece)
        remote = pb.IngestPiece(path=file.path, size=file.size, mode=file.mode,
                                mtime_ns=file.mtime_ns, holders=file_holders,
                                crc32c=piece.crc32c, remote=True)
        for index, stream in enumerate(streams):
            if index not in file_holders:
                stream.put(remote)
        if bar is not None:
            bar.update(file.size)


class _MemberStream:
    """One member's Ingest call, fed piece by piece through a bounded queue."""

    def __init__(self, member, name: str, replace: bool, members: list[str], replicas: int,
                 index: int, generation: int):
        self.member = member
        self.name = name
        self.index = index
        self.start = pb.IngestStart(dataset=name, replace=replace, members=members,
                                    replicas=replicas, member_index=index, prepare_only=True,
                                    generation=generation)
        self._queue: queue.Queue = queue.Queue(maxsize=limits.ingest_queue_pieces_max)
        self.error: BaseException | None = None
        self.prepared = False
        self.aborted = False  # the client cancelled this member's call itself

    def put(self, piece) -> None:
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
