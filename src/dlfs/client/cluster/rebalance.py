"""Rebalancing: move a dataset onto a new list of daemons, sending only what moves.

`Client(etcd=URL).rebalance("imagenet")` (CLI: `dlfs --etcd URL rebalance
imagenet`) re-places every sample on the cluster's live members (or the
`members` given) by the same rendezvous hashing as ingest
(docs/cluster.md).  Adding a daemon changes the holders of replicas/(N+1)
of the samples, so:

- a copy a daemon already holds is *kept*: its stream carries metadata only
  and the daemon copies the bytes from its own old extents (local disk,
  nothing on the network);
- a copy a daemon does not hold is *moved*: the client reads it from a live
  old holder (one get_batch per chunk) and streams it to its new holder;
- every other member gets the sample's metadata (`remote`);
- every member gets the dataset's empty directories.

It is one two-phase change (see `two_phase.run_two_phase`): until etcd's
transaction commits it, readers see the old placement; any failure drops
the intent and the old dataset stays as it was.  Daemons that left the
list delete their copy themselves when they read the new record in etcd
(the report says which did before it returned).  The same call stripes a
one-daemon dataset (`source`, a daemon's address) over the cluster, or
changes the replica count (`replicas=`).

Cost: every sample's metadata goes to every member; bytes cross the network
only for moved copies; each member rewrites its kept copies locally.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from dlfs import limits
from dlfs.client import metadata
from dlfs.client.cluster.placement import place
from dlfs.client.cluster.two_phase import check_streams, run_two_phase
from dlfs.client.transport.ingest_requests import IngestPiece, buffer_pieces, dir_pieces
from dlfs.client.transport.read_requests import BatchRequest
from dlfs.errors import DlfsError, InvalidArgument, Unavailable
from dlfs.types import Entry

# A chunk of samples handled at once: one get_batch for its moved copies.
_CHUNK_SAMPLES = 256
_CHUNK_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class RebalanceReport:
    """What a rebalance did."""

    dataset: str
    members: tuple[str, ...]  # the new member list, in placement order
    replicas: int
    samples: int
    copies_moved: int  # sample copies sent to a daemon that did not hold them
    bytes_moved: int
    copies_kept: int  # copies a daemon already held (copied locally, not sent)
    removed_from: tuple[str, ...] = ()  # daemons that left the list: dataset deleted there
    not_removed: tuple[str, ...] = ()  # such daemons that had not deleted it yet (down)


def rebalance(router, name: str, *, replicas: int | None = None,
              progress: bool | None = None, members=None,
              source: str | None = None) -> RebalanceReport:
    """Place dataset `name` on `members` (default: the live members of `router`'s
    cluster) with `replicas` copies (default: as now).  `source`: the address of a
    daemon holding `name` as its own one-daemon dataset, to stripe it.

    Raises NotFound (no such dataset), InvalidArgument (bad replica count, or
    a member that is not live), AlreadyExists (another change of it is in
    flight), Unavailable (a new member, or every old holder of a moved
    sample, is down: nothing changed), and the daemons' errors.
    """
    live = list(router.addresses)
    members = sorted(members) if members else live
    dead = [address for address in members if address not in live]
    if dead:
        raise InvalidArgument(f"{', '.join(dead)} is not a live member of the cluster "
                              f"({router.address}); members are {', '.join(live) or 'none'}")
    if source is None:
        placement = router.placement(name, refresh=True)
        old_members, old_holders = list(placement.members), placement.holders
        owner = None
    else:
        owner = router.member(source)
        old_members = [source]
    entries = _entries(owner or router, name)
    if source is not None:
        old_holders = np.zeros((len(entries), 1), np.uint16)
    replicas = replicas or old_holders.shape[1]
    paths = [entry.path for entry in entries]
    new_holders = place(name, paths, members, replicas)  # validates replicas and members
    # had[i, j]: new member j already stores sample i.
    had = np.zeros((len(entries), len(members)), bool)
    for j, address in enumerate(members):
        if address in old_members:
            had[:, j] = (old_holders == old_members.index(address)).any(axis=1)
    holds = np.zeros_like(had)
    holds[np.arange(len(entries))[:, None], new_holders] = True
    moves = holds & ~had
    sizes = np.array([entry.size for entry in entries], np.int64)
    report = RebalanceReport(
        dataset=name, members=tuple(members), replicas=replicas, samples=len(entries),
        copies_moved=int(moves.sum()), bytes_moved=int((moves.sum(axis=1) * sizes).sum()),
        copies_kept=int((holds & had).sum()))

    if owner is not None:
        dirs = metadata.empty_dirs(owner, name)

        def fetch(ids: np.ndarray) -> list:
            return owner.get_batch(BatchRequest(name, ids, None, True))
    else:
        dirs = router.call_dataset(name, lambda member: metadata.empty_dirs(member, name))

        def fetch(ids: np.ndarray) -> list:
            return router.get_ids(name, ids, verify=True, prefetch=np.empty(0, np.int64))

    def produce(streams, bar) -> None:
        for piece in dir_pieces(dirs):  # the tree stays the one ingested
            for stream in streams:
                stream.put(piece)
        _produce(fetch, entries, new_holders, holds, moves, sizes, streams, bar)

    run_two_phase(router, name, members, replicas, replace=True, produce=produce,
                  total_bytes=report.bytes_moved, progress=progress,
                  desc=f"rebalance {name} onto {len(members)} daemons",
                  kind="rebalance" if source is None else "replace")
    router.forget(name)
    if source is not None:
        return report
    left = [address for address in old_members if address not in members]
    removed, kept = _wait_removed(router, name, left)
    return dataclasses.replace(report, removed_from=tuple(removed), not_removed=tuple(kept))


def _wait_removed(router, name: str, addresses: list[str]) -> tuple[list[str], list[str]]:
    """(those of `addresses` that no longer list `name`, those that still do or do not
    answer), waiting at most `limits.cluster_publish_wait_s` (members that left
    delete their copy as they read etcd: milliseconds).  One that does not answer
    is not waited for: it deletes its copy when it starts again."""
    deadline = time.monotonic() + limits.cluster_publish_wait_s
    pending = list(addresses)
    removed, down = [], []
    while pending:
        for address in list(pending):
            try:
                listed = [i.name for i in router.member(address).control.list_datasets()]
            except Unavailable:
                down.append(address)
                pending.remove(address)
                continue
            except DlfsError:
                continue
            if name not in listed:
                removed.append(address)
                pending.remove(address)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return removed, down + pending


def _entries(transport, name: str) -> list[Entry]:
    """Every sample's entry in id order, from a member holding the directory (or the
    one daemon `transport` is)."""
    def fetch(member) -> list[Entry]:
        info = member.control.get_dataset(name)
        return metadata.all_entries(member, name, info.samples)

    if hasattr(transport, "call_dataset"):
        return transport.call_dataset(name, fetch)
    return fetch(transport)


def _chunks(sizes: np.ndarray, moves: np.ndarray):
    """Consecutive id ranges of at most _CHUNK_SAMPLES samples and about _CHUNK_BYTES moved."""
    moved_bytes = sizes * moves.any(axis=1)
    start = 0
    while start < len(sizes):
        stop = min(start + _CHUNK_SAMPLES, len(sizes))
        running = np.cumsum(moved_bytes[start:stop])
        over = np.flatnonzero(running > _CHUNK_BYTES)
        if over.size:
            stop = start + max(int(over[0]), 1)
        yield start, stop
        start = stop


def _produce(fetch, entries, new_holders, holds, moves, sizes, streams, bar) -> None:
    for start, stop in _chunks(sizes, moves):
        needed = start + np.flatnonzero(moves[start:stop].any(axis=1))
        fetched = dict(zip(needed.tolist(), fetch(needed.astype(np.int64)))
                       if needed.size else ())
        for i in range(start, stop):
            check_streams(streams)
            entry = entries[i]
            holders = new_holders[i].tolist()
            meta = IngestPiece(entry.path, entry.size, entry.mode, entry.mtime_ns,
                               crc32c=entry.crc32c, holders=holders)
            for j, stream in enumerate(streams):
                if moves[i, j]:
                    head = meta._replace(crc32c=None)
                    for piece in buffer_pieces(head, fetched[i]):
                        stream.put(piece)
                    if bar is not None:
                        bar.update(entry.size)
                elif holds[i, j]:
                    stream.put(meta._replace(kept=True))
                else:
                    stream.put(meta._replace(remote=True))
