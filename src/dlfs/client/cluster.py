"""A client of several daemons: routing, failover, striped ingest.

`Client(["A", "B", "C"])` keeps one single-daemon `Client` per member and a
`ClusterRouter` that decides which member serves what:

- metadata calls (stat, listdir, lookup, dataset info) go to any live member:
  every member of a striped dataset holds its whole directory;
- a batch is split by placement: each sample goes to the first live daemon
  among its holders, the parts are fetched in parallel and the samples are
  returned in request order;
- placement is learned from the daemons (GetIndex carries each sample's
  holders and the member list), never recomputed by readers;
- a member that fails with UNAVAILABLE is marked down for
  `limits.member_down_s` and its part of the batch is retried on the next
  holder; with no live holder left the error names the daemon and the
  samples.  A member that is back is used again once its mark expires.

Striped ingest (`ingest_striped`) reads every file once, streams it to its
holders and its metadata to every other member, with two-phase commit: all
members prepare (durable, unpublished), then all commit.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np

from dlfs import limits
from dlfs.client import convert
from dlfs.client.errors import from_rpc_error
from dlfs.client.ingest import batch_messages, file_pieces
from dlfs.client.placement import place
from dlfs.errors import (
    Cancelled,
    DlfsError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from dlfs.proto import dlfs_pb2 as pb
from dlfs.types import DatasetInfo

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a dataset's samples live, as its daemons reported it."""

    members: tuple  # addresses in placement order; () for a one-daemon dataset
    holders: np.ndarray | None  # uint16 (samples, replicas); None for a one-daemon dataset
    owner: str  # for a one-daemon dataset: the daemon that has it


class ClusterRouter:
    """Routes calls of a multi-daemon `Client` to its members.  Thread-safe."""

    def __init__(self, make_member, addresses: list[str]):
        self._make_member = make_member  # address -> single-daemon Client
        self._lock = threading.Lock()
        self.members = {address: make_member(address) for address in addresses}
        self._down_until: dict[str, float] = {}
        self._placements: dict[str, Placement] = {}
        self._pool = ThreadPoolExecutor(max_workers=limits.cluster_calls_in_flight_max,
                                        thread_name_prefix="dlfs-cluster")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for member in list(self.members.values()):
            member.close()

    # --- members ---------------------------------------------------------------

    def member(self, address: str):
        """The client of `address`, created when placement names a new member."""
        with self._lock:
            client = self.members.get(address)
            if client is None:
                client = self.members[address] = self._make_member(address)
            return client

    def is_down(self, address: str) -> bool:
        until = self._down_until.get(address)
        return until is not None and time.monotonic() < until

    def mark_down(self, address: str, error: Exception) -> None:
        if not self.is_down(address):
            log.warning("DLFS daemon %s is down (%s); reads go to replicas for %.0f s",
                        address, error, limits.member_down_s)
        self._down_until[address] = time.monotonic() + limits.member_down_s

    def _ordered(self) -> list[str]:
        """Members, live ones first (a member marked down is still tried last)."""
        addresses = list(self.members)
        return sorted(addresses, key=self.is_down)

    def _submit(self, function, *args, **kwargs):
        """Run `function` on the pool in the caller's context (its request id travels)."""
        return self._pool.submit(contextvars.copy_context().run, function, *args, **kwargs)

    # --- any member --------------------------------------------------------------

    def call_any(self, call):
        """`call(member_client)` on the first member that answers it.

        Unavailable members are marked down and skipped; NotFound tries the
        next member too (a one-daemon dataset lives on one member only).
        Raises the last error when every member failed.
        """
        last: Exception | None = None
        for address in self._ordered():
            try:
                return call(self.member(address))
            except Unavailable as exc:
                self.mark_down(address, exc)
                last = exc
            except NotFound as exc:
                last = exc
        assert last is not None
        raise last

    def each(self, call) -> dict[str, object]:
        """`call(member_client)` on every member in parallel: address -> result or error."""
        futures = {a: self._submit(call, self.member(a)) for a in list(self.members)}
        results: dict[str, object] = {}
        for address, future in futures.items():
            try:
                results[address] = future.result()
            except DlfsError as exc:
                if isinstance(exc, Unavailable):
                    self.mark_down(address, exc)
                results[address] = exc
        return results

    # --- placement ----------------------------------------------------------------

    def placement(self, dataset: str, refresh: bool = False) -> Placement:
        with self._lock:
            known = self._placements.get(dataset)
        if known is not None and not refresh:
            return known
        found = self.call_any(lambda member: (member.address, _fetch_placement(member, dataset)))
        address, (members, holders) = found
        placement = Placement(members, holders, "" if members else address)
        with self._lock:
            self._placements[dataset] = placement
        return placement

    # --- reads ---------------------------------------------------------------------

    def get_batch(self, dataset: str, ids: np.ndarray, *, verify: bool,
                  prefetch: np.ndarray) -> list[memoryview]:
        """Samples `ids` in request order, each part from a live holder, in parallel."""
        for attempt in range(2):
            placement = self.placement(dataset, refresh=attempt > 0)
            try:
                return self._get_batch(dataset, placement, ids, verify, prefetch)
            except (NotFound, FailedPrecondition):
                if attempt:
                    raise  # the dataset really is gone or damaged
                # Placement changed (dataset replaced): learn it again once.
        raise AssertionError("unreachable")

    def _get_batch(self, dataset: str, placement: Placement, ids: np.ndarray, verify: bool,
                   prefetch: np.ndarray) -> list[memoryview]:
        if not placement.members:
            return self.member(placement.owner).get_batch(ids, dataset=dataset, verify=verify,
                                                          prefetch=prefetch)
        if ids.size and (ids.min() < 0 or ids.max() >= len(placement.holders)):
            bad = int(ids[(ids < 0) | (ids >= len(placement.holders))][0])
            raise InvalidArgument(f"sample id {bad} is out of range for dataset {dataset!r}: "
                                  f"valid ids are 0..{len(placement.holders) - 1}")
        if prefetch.size:
            self._hint(dataset, placement, prefetch)
        result: list = [None] * ids.size
        pending = np.arange(ids.size)
        excluded: set[str] = set()
        while pending.size:
            chosen = self._choose(placement, ids[pending], excluded)
            futures = {}
            for address in np.unique(chosen):
                positions = pending[chosen == address]
                futures[address] = (positions, self._submit(
                    self.member(address).get_batch, ids[positions], dataset=dataset,
                    verify=verify))
            retry = []
            for address, (positions, future) in futures.items():
                try:
                    for position, sample in zip(positions.tolist(), future.result()):
                        result[position] = sample
                except Unavailable as exc:
                    self.mark_down(address, exc)
                    excluded.add(address)
                    retry.append(positions)
            pending = np.concatenate(retry) if retry else pending[:0]
        return result

    def _choose(self, placement: Placement, ids: np.ndarray, excluded: set[str]) -> np.ndarray:
        """Per sample, the address of its first holder that is live and not excluded."""
        holders = placement.holders[ids]
        members = placement.members
        usable = np.array([a not in excluded and not self.is_down(a) for a in members])
        if not usable.any():  # every member marked down: try them again rather than fail blind
            usable = np.array([a not in excluded for a in members])
        ok = usable[holders]
        has_one = ok.any(axis=1)
        if not has_one.all():
            first = int(np.argmax(~has_one))
            lost = ", ".join(members[h] for h in holders[first])
            raise Unavailable(
                f"sample {int(ids[first])} (and {int((~has_one).sum()) - 1} more of this batch) "
                f"is stored only on {lost}, and none of them answers; start that daemon again, "
                "or ingest with --replicas 2 or more to survive the loss of one")
        column = np.argmax(ok, axis=1)
        chosen_index = holders[np.arange(len(ids)), column]
        return np.asarray(members, dtype=object)[chosen_index]

    def _hint(self, dataset: str, placement: Placement, ids: np.ndarray) -> None:
        ids = ids[(ids >= 0) & (ids < len(placement.holders))]
        if not ids.size:
            return
        chosen = self._choose(placement, ids, set())
        for address in np.unique(chosen):
            # Fire and forget: a hint must never slow the batch down.
            self._submit(_quiet_prefetch, self.member(address), dataset,
                         ids[chosen == address])

    def prefetch(self, dataset: str, ids: np.ndarray) -> None:
        """Send hints for `ids` to their first live holders (fire and forget)."""
        placement = self.placement(dataset)
        if not placement.members:
            _quiet_prefetch(self.member(placement.owner), dataset, ids)
        else:
            self._hint(dataset, placement, ids)

    def forget(self, dataset: str) -> None:
        """Drop the cached placement (after an ingest replaced the dataset)."""
        with self._lock:
            self._placements.pop(dataset, None)

    def holder_of(self, dataset: str, sample_id: int):
        """The member client that should serve one sample (first live holder)."""
        placement = self.placement(dataset)
        if not placement.members:
            return self.member(placement.owner)
        if not 0 <= sample_id < len(placement.holders):
            raise InvalidArgument(f"sample id {sample_id} is out of range for dataset {dataset!r}")
        return self.member(self._choose(placement, np.array([sample_id]), set())[0])


def _fetch_placement(member, dataset: str) -> tuple[tuple, np.ndarray | None]:
    """(members, holders) of `dataset` as `member` reports it (one GetIndex stream)."""
    members: tuple = ()
    replicas = 0
    parts: list[bytes] = []
    try:
        for chunk in member._stub.GetIndex(pb.GetIndexRequest(dataset=dataset),
                                           timeout=member.timeout_s):
            if chunk.members:
                members, replicas = tuple(chunk.members), chunk.replicas
            parts.append(chunk.holders)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc, member.address) from None
    if not members:
        return (), None
    holders = np.frombuffer(b"".join(parts), "<u2").reshape(-1, replicas)
    return members, holders


def _quiet_prefetch(member, dataset: str, ids: np.ndarray) -> None:
    try:
        member._call("Prefetch", pb.PrefetchRequest(dataset=dataset, ids=ids.tolist()),
                     retry=False)
    except DlfsError as exc:
        log.debug("prefetch hint to %s dropped: %s", member.address, exc)


# --- striped ingest --------------------------------------------------------------------

_END = object()
_ABORT = object()


class _Aborted(Exception):
    """Raised inside a member's request stream to cancel its Ingest call."""


class _MemberFailed(Exception):
    """A member's stream failed while the producer was still reading files."""

    def __init__(self, stream):
        super().__init__(stream.member.address)
        self.stream = stream


def ingest_striped(router: ClusterRouter, report, name: str, *, replace: bool, replicas: int,
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
        _produce(report.files, holders, streams, bar)

    info = run_two_phase(router, name, members, replicas, replace=replace, produce=produce,
                         total_bytes=report.bytes, progress=progress,
                         desc=f"ingest {name} ({len(members)} daemons, {replicas}x)")
    return dataclasses.replace(info, samples=len(paths), bytes=report.bytes)


def run_two_phase(router: ClusterRouter, name: str, members: list[str], replicas: int, *,
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
    streams = [_MemberStream(router.member(address), name, replace, members, replicas, index)
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
    results = _finish_all(streams, commit=True)
    errors = [(a, r) for a, r in results if isinstance(r, Exception)]
    if errors:
        committed = [a for a, r in results if not isinstance(r, Exception)]
        raise Unavailable(
            f"dataset {name!r} was committed on {', '.join(committed) or 'no daemon'} but not on "
            f"{', '.join(a for a, _ in errors)} ({errors[0][1]}); ingest it again with --replace")
    return results[0][1]


def check_streams(streams) -> None:
    """Raise (ending the producer) once any member's stream has failed."""
    failed = next((s for s in streams if s.error is not None), None)
    if failed is not None:  # stop every member: a striped ingest is all or nothing
        raise _MemberFailed(failed)


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
            reply = stream.member._call(method, pb.CommitIngestRequest(dataset=stream.name),
                                        retry=True)
            return stream.member.address, convert.dataset_info(reply)
        except DlfsError as exc:
            return stream.member.address, exc

    if not prepared:
        return []
    with ThreadPoolExecutor(max_workers=min(len(prepared), limits.cluster_calls_in_flight_max),
                            thread_name_prefix="dlfs-commit") as pool:
        return list(pool.map(finish, prepared))


def _produce(files, holders: np.ndarray, streams, bar) -> None:
    """Read each file once; its pieces go to its holders, its metadata to the others."""
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
                 index: int):
        self.member = member
        self.name = name
        self.index = index
        self.start = pb.IngestStart(dataset=name, replace=replace, members=members,
                                    replicas=replicas, member_index=index, prepare_only=True)
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
            self.member._stub.Ingest(self._messages(), timeout=limits.ingest_timeout_s_default)
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
