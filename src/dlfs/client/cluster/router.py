"""`ClusterRouter`: the transport of a client of a cluster (`Client(etcd=...)`).

The router holds the client's `ClusterView` (the cluster's state in etcd,
kept current by a watch), one transport per member (`contract.DaemonTransport`), and
answers the same `contract.Transport` as a single daemon's transport:

- a striped dataset's version is what etcd's record says: its generation
  and its member list; every read names that generation, so a member
  holding another version refuses it and no batch mixes versions;
- metadata calls (stat, listdir, lookup, dataset info) go to a live member
  of the dataset: every member holds its whole directory;
- a batch is split by placement: each sample goes to the first live holder,
  the parts are fetched in parallel and the samples returned in request
  order; placement (which member holds which sample) is learned from a
  member that publishes the current generation (GetIndex), never
  recomputed by readers;
- a member is live while its lease in etcd is: one whose lease expired is
  skipped from the next read on, without a timeout on it.  A member that
  fails with UNAVAILABLE before that is marked down for
  `limits.member_down_s` and its part of the batch is retried on the next
  holder; with no live holder left the error names the members and the
  samples.

Striped ingest, rebalance and delete (`striped_ingest`, `rebalance`,
`etcd_commit`) use the members through `member` and etcd through `view`.
"""

from __future__ import annotations

import contextvars
import dataclasses
import itertools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, TypeVar

import numpy as np

from dlfs import limits
from dlfs.client.cluster.cluster_view import ClusterView
from dlfs.client.cluster.placement import Placement, placement_of
from dlfs.client.reply_buffers import copy_into
from dlfs.client.transport.contract import DaemonTransport
from dlfs.client.transport.read_requests import (
    BatchRequest,
    PrefetchRequest,
    RangeRequest,
    range_id,
    request_ids,
)
from dlfs.coord.cluster_keys import ClusterState, DatasetRecord
from dlfs.errors import (
    DlfsError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    StaleGeneration,
    Unavailable,
)
from dlfs.types import DatasetInfo, Entry

log = logging.getLogger(__name__)
T = TypeVar("T")


class ClusterRouter:
    """Routes the calls of a cluster `Client` to its members (`contract.Transport`).
    Thread-safe.

    `make_member(address)` builds a member's transport (a `contract.DaemonTransport`);
    `view` is the cluster's state in etcd.  `clock` (default
    `time.monotonic`) times the down marks; tests replace it to let a mark
    expire without waiting.
    """

    def __init__(self, make_member: Callable[[str], DaemonTransport], view: ClusterView, *,
                 clock: Callable[[], float] = time.monotonic):
        self._make_member = make_member
        self._lock = threading.Lock()
        self.clock = clock
        self.view = view
        self.members: dict[str, DaemonTransport] = {}
        self.address = f"etcd {','.join(view.endpoints)} (cluster {view.cluster})"
        # The live members' addresses (their leases in etcd are alive), sorted.
        self.addresses: tuple[str, ...] = tuple(view.members())
        self._down_until: dict[str, float] = {}
        self._placements: dict[str, Placement] = {}
        self._pool = ThreadPoolExecutor(max_workers=limits.cluster_calls_in_flight_max,
                                        thread_name_prefix="dlfs-cluster")
        view.listeners.append(self._on_state)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.view.close()
        for member in list(self.members.values()):
            member.close()

    def __repr__(self) -> str:
        return f"ClusterRouter({self.address!r})"

    # --- members ---------------------------------------------------------------

    def member(self, address: str) -> DaemonTransport:
        """The transport of `address`, created at its first use."""
        with self._lock:
            transport = self.members.get(address)
            if transport is None:
                transport = self.members[address] = self._make_member(address)
            return transport

    def is_down(self, address: str) -> bool:
        """Whether reads skip `address`: its lease in etcd is gone, or it failed with
        UNAVAILABLE within `limits.member_down_s`."""
        if address not in self.view.state.members:
            return True
        until = self._down_until.get(address)
        return until is not None and self.clock() < until

    def mark_down(self, address: str, error: Exception) -> None:
        """Skip `address` for `limits.member_down_s`.  One warning per outage, however
        many threads saw it fail at once; `error` already names the daemon."""
        with self._lock:
            first = not self.is_down(address)
            self._down_until[address] = self.clock() + limits.member_down_s
        if first:
            log.warning("reads go to the replicas of DLFS daemon %s for %.0f s: %s", address,
                        limits.member_down_s, error)

    def _ordered(self, addresses) -> list[str]:
        """`addresses`, live ones first (a member marked down is still tried last)."""
        return sorted(addresses, key=self.is_down)

    def submit(self, function, *args, **kwargs):
        """Run `function` on the router's pool in the caller's context (its request id travels)."""
        return self._pool.submit(contextvars.copy_context().run, function, *args, **kwargs)

    # --- any member, every member ----------------------------------------------------

    def call_any(self, call: Callable[[DaemonTransport], T]) -> T:
        """`call(member)` on the first live member that answers it (see `call_members`)."""
        return self.call_members(call, self.addresses)

    def call_members(self, call: Callable[[DaemonTransport], T], addresses) -> T:
        """`call(member)` on the first of `addresses` that answers it.

        Unavailable members are marked down and skipped; NotFound tries the
        next member too.  Raises the last error when every member failed,
        Unavailable when there is none.
        """
        last: Exception | None = None
        for address in self._ordered(addresses):
            try:
                return call(self.member(address))
            except Unavailable as exc:
                self.mark_down(address, exc)
                last = exc
            except NotFound as exc:
                last = exc
        if last is None:
            raise Unavailable(f"no DLFS daemon is a member of the cluster in {self.address} "
                              "(no live lease): start the daemons with --etcd")
        raise last

    def each(self, call: Callable[[DaemonTransport], T]) -> dict[str, T | DlfsError]:
        """`call(member)` on every live member in parallel: address -> result, or its
        DlfsError."""
        futures = {a: self.submit(call, self.member(a)) for a in self.addresses}
        results: dict = {}
        for address, future in futures.items():
            try:
                results[address] = future.result()
            except DlfsError as exc:
                if isinstance(exc, Unavailable):
                    self.mark_down(address, exc)
                results[address] = exc
        return results

    # --- what etcd says -------------------------------------------------------------

    def record(self, dataset: str) -> DatasetRecord:
        """The committed version of `dataset` in etcd (read again from etcd when the
        watched state does not have it yet).  Raises NotFound."""
        record = self.view.state.dataset(dataset)
        if record is None:
            record = self.view.refresh().dataset(dataset)
        if record is None:
            raise NotFound(f"no dataset named {dataset!r} in the cluster ({self.address})")
        return record

    def call_dataset(self, dataset: str, call: Callable[[DaemonTransport], T]) -> T:
        """`call(member)` on a live member of `dataset` (every one holds its directory)."""
        return self.call_members(call, self.record(dataset).members)

    def published(self, dataset: str, generation: int) -> DatasetInfo:
        """The summary of `generation` of `dataset`, once its live members publish it
        (they watch etcd: milliseconds), or after `limits.cluster_publish_wait_s` from
        whichever member has.  A member that does not answer is not waited for (it
        applies the commit when it starts again).  Raises NotFound when no member
        ever publishes it."""
        self.view.refresh()
        self.forget(dataset)
        record = self.record(dataset)
        deadline = time.monotonic() + limits.cluster_publish_wait_s
        pending = [a for a in record.members if not self.is_down(a)]
        found: DatasetInfo | None = None
        while True:
            pending = [a for a in pending if not self.is_down(a)]  # a lease gone: not waited
            for address in list(pending):
                try:
                    info = self.member(address).control.get_dataset(dataset, retry=False)
                except Unavailable as exc:  # down: it applies etcd's decision at its start
                    self.mark_down(address, exc)
                    continue
                except DlfsError:
                    continue
                if info.sealed and info.generation == generation:
                    found = found or info
                    pending.remove(address)
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        if pending:
            log.warning("dataset %r generation %d is committed; %s did not publish it within "
                        "%.0f s (they do once they read etcd)", dataset, generation,
                        ", ".join(pending), limits.cluster_publish_wait_s)
        if found is None:
            raise NotFound(f"dataset {dataset!r} generation {generation} is committed in etcd "
                           "but no member publishes it yet")
        return found

    def _on_state(self, state: ClusterState) -> None:
        """Note the live members; drop the placements of datasets etcd now holds in
        another version (or not at all)."""
        self.addresses = tuple(sorted(state.members))
        with self._lock:
            for name, placement in list(self._placements.items()):
                record = state.dataset(name)
                if record is None or record.generation != placement.generation:
                    del self._placements[name]

    # --- metadata: any member holds a striped dataset's whole directory ---------------------

    def dataset_info(self, dataset: str, known: DatasetInfo | None = None) -> DatasetInfo:
        """The summary of the version etcd holds of `dataset`, from one of its members
        (`known` is unused).  Raises NotFound, StaleGeneration (no member publishes
        that version yet)."""
        generation = self.record(dataset).generation

        def current(member: DaemonTransport) -> DatasetInfo:
            info = member.control.get_dataset(dataset)
            if info.generation != generation:
                raise NotFound(f"{member.address} does not publish generation {generation} "
                               f"of {dataset!r} yet")
            return info

        return self.call_dataset(dataset, current)

    def stat(self, dataset: str, path: str, generation: int) -> Entry:
        return self.call_dataset(dataset, lambda member: member.stat(dataset, path,
                                                                     generation))

    def list_page(self, dataset: str, path: str, start_after: str,
                  page_size: int, generation: int) -> tuple[list[Entry], bool]:
        return self.call_dataset(dataset, lambda member: member.list_page(
            dataset, path, start_after, page_size, generation))

    def lookup(self, dataset: str, *, ids: np.ndarray | None = None,
               paths=None) -> list[Entry]:
        return self.call_dataset(dataset, lambda member: member.lookup(dataset, ids=ids,
                                                                       paths=paths))

    # --- placement ----------------------------------------------------------------

    def placement(self, dataset: str, refresh: bool = False) -> Placement:
        """Where the samples of the version etcd holds live, learned from a live member
        that publishes it (one GetIndex), cached until etcd holds another version.
        Raises NotFound, StaleGeneration (no live member publishes it yet)."""
        if refresh:
            self.view.refresh()
        record = self.record(dataset)
        with self._lock:
            known = self._placements.get(dataset)
        if known is not None and known.generation == record.generation:
            return known
        stale = []
        for address in self._ordered(record.members):
            try:
                index = self.member(address).control.index(dataset)
            except Unavailable as exc:
                self.mark_down(address, exc)
                continue
            except NotFound:
                stale.append(address)
                continue
            if index.generation != record.generation:
                stale.append(address)
                continue
            placement = placement_of(index, address)
            with self._lock:
                self._placements[dataset] = placement
            return placement
        raise StaleGeneration(
            f"no live member publishes generation {record.generation} of dataset {dataset!r} "
            f"yet ({', '.join(stale) or 'none answers'}); it is committed in etcd and they "
            "publish it as they read it")

    def data_path_hints(self) -> dict:
        """{address: where its data path listens} of every member that answers."""
        hints: dict = {}
        for result in self.each(lambda member: member.data_path_hints()).values():
            if isinstance(result, dict):
                hints.update(result)
        return hints

    def adopt(self, dataset: str, placement: Placement) -> None:
        """Use `placement` for `dataset` (another process's, from a `DatasetTicket`)
        instead of asking a member for it (GetIndex, a gRPC call)."""
        with self._lock:
            self._placements[dataset] = placement

    def forget(self, dataset: str) -> None:
        """Drop the cached placement (after an ingest replaced the dataset)."""
        with self._lock:
            self._placements.pop(dataset, None)

    def holder_of(self, dataset: str, sample_id: int) -> DaemonTransport:
        """The member that should serve one sample (its first live holder)."""
        placement = self.placement(dataset)
        if not 0 <= sample_id < len(placement.holders):
            raise InvalidArgument(f"sample id {sample_id} is out of range for dataset {dataset!r}")
        return self.member(self._choose(placement, np.array([sample_id]), set())[0])

    # --- reads ---------------------------------------------------------------------

    def prepare(self, dataset: str) -> None:
        """Nothing to set up: placement is learned at the first batch."""

    def get_batch(self, request: BatchRequest, out=None) -> list[memoryview]:
        """The samples in request order, each part from a live holder (paths: one Lookup
        first).  With `out`, the parts are copied into it (`reply_buffers.copy_into`)."""
        if not request.size:
            return []
        samples = self.get_ids(request.dataset, request_ids(request, self.lookup),
                               verify=request.verify, prefetch=request.prefetch_ids,
                               generation=request.generation)
        return samples if out is None else copy_into(out, samples)

    def get_ids(self, dataset: str, ids: np.ndarray, *, verify: bool, prefetch: np.ndarray,
                generation: int = 0) -> list[memoryview]:
        """Samples `ids` of version `generation` (0: the current one) in request order,
        each part from a live holder, in parallel.

        The placement is of the version etcd holds; every part names it, so
        a member holding another version refuses its part and no batch mixes
        versions.  A placement that does not match is learned again; then
        StaleGeneration (the dataset was replaced, or a member has not
        published etcd's version after `limits.striped_settle_s`).
        """
        settle_until = None
        for attempt in range(limits.striped_settle_attempts_max):
            try:
                placement = self.placement(dataset, refresh=attempt > 0)
            except StaleGeneration as exc:
                settle_until = settle_until or self.clock() + limits.striped_settle_s
                if self.clock() >= settle_until:
                    raise exc from None
                time.sleep(limits.retry_backoff_s[min(attempt, len(limits.retry_backoff_s) - 1)])
                continue
            if generation and placement.generation and placement.generation != generation:
                if attempt:
                    raise StaleGeneration(
                        f"dataset {dataset!r} was replaced: version {generation} is no longer "
                        f"served (the current one is {placement.generation}); open it again")
                continue
            try:
                return self._get_ids(dataset, placement, ids, verify, prefetch)
            except _OutOfRange:
                if attempt:
                    raise InvalidArgument(_out_of_range(dataset, ids, placement)) from None
                # The cached placement may be of an older, smaller version: learn it again.
            except StaleGeneration as exc:
                # A member has not yet applied etcd's decision (it watches etcd,
                # or it was down and reads etcd as it starts): wait, then give up.
                settle_until = settle_until or self.clock() + limits.striped_settle_s
                if attempt and self.clock() >= settle_until:
                    raise StaleGeneration(
                        f"the daemons of dataset {dataset!r} serve different versions ({exc}) "
                        f"for over {limits.striped_settle_s:.0f} s; a member has not applied "
                        "the version etcd holds: `dlfs datasets` shows which") from None
                if attempt:
                    backoff = limits.retry_backoff_s
                    time.sleep(backoff[min(attempt, len(backoff)) - 1])
            except (NotFound, FailedPrecondition):
                if attempt:
                    raise  # the dataset really is gone or damaged
                # Placement changed (dataset replaced): learn it again once.
        raise StaleGeneration(f"the daemons of dataset {dataset!r} kept serving different "
                              "versions; ingest it again with --replace")

    def read_range(self, request: RangeRequest) -> memoryview:
        """A byte range of one sample from a live holder, failing over to replicas."""
        request = self._by_id(request)
        for _attempt in range(limits.replicas_max):
            member = self.holder_of(request.dataset, request.sample_id)
            try:
                return member.read_range(request)
            except Unavailable as exc:
                self.mark_down(member.address, exc)
        raise Unavailable(f"no holder of sample {request.sample_id} of dataset "
                          f"{request.dataset!r} answers")

    def read_chunks(self, request: RangeRequest) -> Iterator[tuple[int, memoryview]]:
        """The pieces of a byte range of one sample, from its first live holder (the next
        one when it fails before the first piece)."""
        request = self._by_id(request)
        for _attempt in range(limits.replicas_max):
            member = self.holder_of(request.dataset, request.sample_id)
            chunks = iter(member.read_chunks(request))
            try:
                first = next(chunks)
            except StopIteration:
                return iter(())
            except Unavailable as exc:  # nothing arrived yet: the next holder serves it
                self.mark_down(member.address, exc)
                continue
            return itertools.chain([first], chunks)
        raise Unavailable(f"no holder of sample {request.sample_id} of dataset "
                          f"{request.dataset!r} answers")

    def prefetch(self, request: PrefetchRequest, wait: bool = True) -> bool:
        """Send hints for the request's samples to their first live holders (fire and forget)."""
        ids = request_ids(request, self.lookup)
        placement = self.placement(request.dataset)
        self._hint(request.dataset, placement, ids)
        return True

    def _by_id(self, request: RangeRequest) -> RangeRequest:
        """The same range request naming its sample by id (paths cost one Lookup)."""
        if request.path is None:
            return request
        return dataclasses.replace(request, sample_id=range_id(request, self.lookup), path=None)

    def _get_ids(self, dataset: str, placement: Placement, ids: np.ndarray, verify: bool,
                 prefetch: np.ndarray) -> list[memoryview]:
        if ids.size and (ids.min() < 0 or ids.max() >= len(placement.holders)):
            raise _OutOfRange()
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
                part = BatchRequest(dataset, ids[positions], None, verify,
                                    generation=placement.generation)
                futures[address] = (positions, self.submit(self.member(address).get_batch, part))
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
            self.submit(_quiet_prefetch, self.member(address), dataset, ids[chosen == address])


class _OutOfRange(Exception):
    """A batch names ids past the cached placement (which may be of an older version)."""


def _out_of_range(dataset: str, ids: np.ndarray, placement: Placement) -> str:
    bad = int(ids[(ids < 0) | (ids >= len(placement.holders))][0])
    return (f"sample id {bad} is out of range for dataset {dataset!r}: valid ids are "
            f"0..{len(placement.holders) - 1}")


def _quiet_prefetch(member: DaemonTransport, dataset: str, ids: np.ndarray) -> None:
    try:
        member.prefetch(PrefetchRequest(dataset, ids))
    except DlfsError as exc:
        log.debug("prefetch hint to %s dropped: %s", member.address, exc)
