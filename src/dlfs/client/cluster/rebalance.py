"""Rebalancing: move a dataset onto a new list of daemons, sending only what moves.

`Client(["A", "B", "C", "D"]).rebalance("imagenet")` (CLI: `dlfs --server
A,B,C,D rebalance imagenet`) re-places every sample on the new member list
by the same rendezvous hashing as ingest (docs/cluster.md).  Adding a
daemon changes the holders of replicas/(N+1) of the samples, so:

- a copy a daemon already holds is *kept*: its stream carries metadata only
  and the daemon copies the bytes from its own old extents (local disk,
  nothing on the network);
- a copy a daemon does not hold is *moved*: the client reads it from a live
  old holder (one get_batch per chunk) and streams it to its new holder;
- every other member gets the sample's metadata (`remote`);
- every member gets the dataset's empty directories.

It is one two-phase ingest with `replace` on every new member (see
`two_phase.run_two_phase`): until all of them prepared, readers see the old
placement; any failure aborts everywhere and the old dataset stays as it
was.  Daemons that left the list get the dataset deleted after the commit.
The same call stripes a one-daemon dataset over several daemons, or
changes the replica count (`replicas=`).

Cost: every sample's metadata goes to every member; bytes cross the network
only for moved copies; each member rewrites its kept copies locally.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dlfs.client import metadata
from dlfs.client.cluster.placement import place
from dlfs.client.cluster.two_phase import check_streams, run_two_phase
from dlfs.client.transport.ingest_requests import IngestPiece, buffer_pieces, dir_pieces
from dlfs.errors import DlfsError
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
    not_removed: tuple[str, ...] = ()  # such daemons that did not answer the delete


def rebalance(router, name: str, *, replicas: int | None = None,
              progress: bool | None = None) -> RebalanceReport:
    """Place dataset `name` on the members of `router` (a ClusterRouter) with `replicas`
    copies (default: as now).

    Raises NotFound (no such dataset), InvalidArgument (bad replica count),
    Unavailable (a new member, or every old holder of a moved sample, is
    down: nothing changed), and the daemons' errors.
    """
    members = list(router.addresses)  # as given: not members learnt from placements
    placement = router.placement(name, refresh=True)
    entries = _entries(router, name)
    if placement.members:
        old_members, old_holders = list(placement.members), placement.holders
    else:
        old_members = [placement.owner]
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

    dirs = router.call_any(lambda member: metadata.empty_dirs(member, name))

    def produce(streams, bar) -> None:
        for piece in dir_pieces(dirs):  # the tree stays the one ingested
            for stream in streams:
                stream.put(piece)
        _produce(router, name, entries, new_holders, holds, moves, sizes, streams, bar)

    run_two_phase(router, name, members, replicas, replace=True, produce=produce,
                  total_bytes=report.bytes_moved, progress=progress,
                  desc=f"rebalance {name} onto {len(members)} daemons")
    router.forget(name)
    removed, failed = [], []
    for address in (a for a in old_members if a not in members):
        try:
            if _remove_old_copy(router.member(address), name, tuple(placement.members)):
                removed.append(address)
        except DlfsError:
            failed.append(address)
    return dataclasses.replace(report, removed_from=tuple(removed), not_removed=tuple(failed))


def _remove_old_copy(member, name: str, old_members: tuple) -> bool:
    """Delete `name` on a daemon that left the list, if it still holds the old placement.

    A daemon reached under two spellings of its address ("localhost:7010"
    and "127.0.0.1:7010") is in both lists; it already holds the new
    placement, and deleting it would lose the data.
    """
    info = member.control.get_dataset(name, retry=False)
    if tuple(info.members) != old_members:
        return False
    member.control.delete_dataset(name)
    return True


def _entries(router, name: str) -> list[Entry]:
    """Every sample's entry in id order, from any member holding the directory."""
    def fetch(member) -> list[Entry]:
        info = member.control.get_dataset(name)
        return metadata.all_entries(member, name, info.samples)

    return router.call_any(fetch)


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


def _produce(router, name, entries, new_holders, holds, moves, sizes, streams, bar) -> None:
    for start, stop in _chunks(sizes, moves):
        needed = start + np.flatnonzero(moves[start:stop].any(axis=1))
        fetched = dict(zip(needed.tolist(), router.get_ids(
            name, needed.astype(np.int64), verify=True, prefetch=np.empty(0, np.int64)))
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
