"""Metadata reads over any transport: entries, directory pages, lookups.

`Client` and `Dataset` both answer stat/listdir/lookup; the calls live
here once, as functions of a transport (one daemon, or a router that asks
any live member: every member of a striped dataset holds its whole
directory).  Each function is one round trip unless it says otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Sequence

import numpy as np

from dlfs import limits
from dlfs.client.transport.contract import Transport
from dlfs.client.transport.read_requests import SampleKey, sample_keys
from dlfs.paths import normalize_dir_path
from dlfs.types import DatasetInfo, Entry


def stat(transport: Transport, dataset: str, path: str, generation: int = 0) -> Entry:
    """Metadata of a file or directory of `dataset` ("" is its root), of version
    `generation` (0: the current one).  Raises NotFound, InvalidArgument (a bad path),
    StaleGeneration (another version is served)."""
    return transport.stat(dataset, normalize_dir_path(path), generation)


def list_page(transport: Transport, dataset: str, path: str = "", start_after: str = "",
              page_size: int = limits.list_page_entries_default, generation: int = 0
              ) -> tuple[list[Entry], bool]:
    """At most `page_size` entries of a directory after name `start_after`, in name
    order, and whether more follow, of version `generation` (as `stat`)."""
    return transport.list_page(dataset, normalize_dir_path(path), start_after, page_size,
                               generation)


def listdir(transport: Transport, dataset: str, path: str = "", *,
            page_size: int = limits.list_page_entries_default) -> Iterator[Entry]:
    """Entries of a directory in name order, fetched page by page (one call a page)."""
    start_after = ""
    while True:
        entries, more = list_page(transport, dataset, path, start_after, page_size)
        yield from entries
        if not more or not entries:
            return
        start_after = entries[-1].name


def lookup(transport: Transport, dataset: str, keys: Sequence[SampleKey]) -> list[Entry]:
    """Entries of samples by ids or paths, in order (at most limits.lookup_items_max).
    Raises InvalidArgument (see `read_requests.sample_keys`), NotFound."""
    ids, paths = sample_keys(keys)
    return transport.lookup(dataset, ids=ids, paths=paths)


def all_entries(transport: Transport, dataset: str, samples: int) -> list[Entry]:
    """Every sample's entry of a dataset of `samples` samples, in id order.

    One Lookup per `limits.lookup_items_max` samples.
    """
    step = limits.lookup_items_max
    entries: list[Entry] = []
    for start in range(0, samples, step):
        ids = np.arange(start, min(start + step, samples), dtype=np.int64)
        entries.extend(transport.lookup(dataset, ids=ids))
    return entries


def empty_dirs(transport: Transport, dataset: str) -> list[str]:
    """Paths of the directories of a dataset that hold nothing, sorted.

    Walks every directory: one ListDir call per page of each directory
    (about entries / 1,000 calls), so it is for whole-dataset work such as
    rebalancing, not for reads.
    """
    found, pending = [], [""]
    while pending:
        path = pending.pop()
        for entry in listdir(transport, dataset, path, page_size=limits.list_page_entries_max):
            if entry.is_dir:
                (pending if entry.children else found).append(entry.path)
    return sorted(found)


def merged_listings(listings: dict) -> list[DatasetInfo]:
    """One listing of every dataset from each daemon's ListDatasets (`listings`: address
    -> its summaries, or the error asking it raised), sorted by name: a sealed summary
    wins over an unsealed one, and a striped dataset says how its members disagree."""
    found: dict[str, DatasetInfo] = {}
    by_member: dict[str, dict[str, DatasetInfo]] = {}
    for address, result in listings.items():
        if isinstance(result, list):
            by_member[address] = {info.name: info for info in result}
            for info in result:
                if info.name not in found or (info.sealed and not found[info.name].sealed):
                    found[info.name] = info
    return [dataclasses.replace(found[name],
                                disagreement=members_disagree(found[name], by_member))
            for name in sorted(found)]


def members_disagree(info: DatasetInfo, listings: dict[str, dict[str, DatasetInfo]]) -> str:
    """How the members of striped dataset `info` disagree about it, from each
    answering member's ListDatasets (`listings`: address -> name -> summary),
    with what to do; "" when they agree (or `info` is not striped)."""
    problems = []
    for address in info.members:
        listing = listings.get(address)
        if listing is None:
            continue  # did not answer: the listing says nothing about it
        other = listing.get(info.name)
        if other is None:
            problems.append(f"{address} does not have it")
        elif not other.sealed:
            problems.append(f"{address} has not published it yet")
        elif other.generation != info.generation:
            problems.append(f"{address} serves version {other.generation}")
    if not problems:
        return ""
    return (f"members disagree about version {info.generation}: {'; '.join(problems)}. A "
            "member applies the version etcd holds as soon as it reads etcd (it watches it); "
            "one that cannot reach etcd keeps what it has until it can")


def cluster_listing(state, listings: dict) -> list[DatasetInfo]:
    """Every dataset of a cluster, sorted by name: what etcd holds (`state`, a
    `ClusterState`), each saying how the live members' own listings (`listings`:
    address -> their summaries, or the error asking them raised) disagree with it;
    changes in flight are listed unsealed ("receiving"), and so are ingests the
    members hold parked (a resumable striped ingest that broke off is no change
    in etcd), after a sealed dataset of the same name: its members are those
    that hold a part, its files the most any of them holds.  A parked ingest
    that a member still lists as receiving (it has not noticed the stream's
    end yet, or a resume began there) is listed receiving: parked only once no
    member still takes it in."""
    by_member: dict[str, dict[str, DatasetInfo]] = {}
    parked: dict[str, list[tuple[str, DatasetInfo]]] = {}
    receiving: dict[str, list[str]] = {}  # name -> members still receiving an ingest of it
    for address, result in listings.items():
        if not isinstance(result, list):
            continue
        by_member[address] = {}
        for info in result:
            if info.sealed or info.name not in by_member[address]:
                by_member[address][info.name] = info
            if info.ingest_state == "parked":
                parked.setdefault(info.name, []).append((address, info))
            elif info.ingest_state == "receiving":
                receiving.setdefault(info.name, []).append(address)
    found = []
    for name, (record, _revision) in state.datasets.items():
        info = DatasetInfo(name, record.samples, record.bytes, True, record.committed_unix_ns,
                           0, record.members, record.replicas, generation=record.generation)
        found.append(dataclasses.replace(info, disagreement=members_disagree(info, by_member)))
    for name, (intent, _revision) in state.intents.items():
        if name not in state.datasets:
            found.append(DatasetInfo(name, 0, 0, False, 0, 0, intent.members, intent.replicas,
                                     ingest_state="receiving"))
    for name, held in parked.items():
        if name in state.intents:
            continue  # the change in flight is listed (receiving)
        most = max((info for _, info in held), key=lambda info: info.samples)
        still = receiving.get(name, [])
        found.append(dataclasses.replace(
            most, bytes=sum(info.bytes for _, info in held),
            members=tuple(sorted({address for address, _ in held} | set(still))),
            member_index=0, ingest_state="receiving" if still else "parked"))
    return sorted(found, key=lambda info: (info.name, not info.sealed))
