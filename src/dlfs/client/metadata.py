"""Metadata reads over any transport: entries, directory pages, lookups.

`Client` and `Dataset` both answer stat/listdir/lookup; the calls live
here once, as functions of a transport (one daemon, or a router that asks
any live member: every member of a striped dataset holds its whole
directory).  Each function is one round trip unless it says otherwise.
"""

from __future__ import annotations

from typing import Iterator, Sequence

from dlfs import limits
from dlfs.client.transport import grpc_types
from dlfs.client.requests import SampleKey, fill_keys
from dlfs.paths import normalize_dir_path
from dlfs.proto import dlfs_pb2 as pb
from dlfs.types import DatasetInfo, Entry


def dataset_info(transport, dataset: str) -> DatasetInfo:
    """The summary of the current version of `dataset`.  Raises NotFound."""
    request = pb.GetDatasetRequest(dataset=dataset)
    return grpc_types.dataset_info(transport.call("GetDataset", request))


def stat(transport, dataset: str, path: str) -> Entry:
    """Metadata of a file or directory of `dataset` ("" is its root).  Raises NotFound."""
    request = pb.StatRequest(dataset=dataset, path=normalize_dir_path(path))
    return grpc_types.entry(transport.call("Stat", request))


def list_page(transport, dataset: str, path: str = "", start_after: str = "",
              page_size: int = limits.list_page_entries_default) -> tuple[list[Entry], bool]:
    """At most `page_size` entries of a directory after name `start_after`, in name
    order, and whether more follow."""
    reply = transport.call("ListDir", pb.ListDirRequest(
        dataset=dataset, path=normalize_dir_path(path), start_after=start_after,
        page_size=page_size))
    return [grpc_types.entry(e) for e in reply.entries], reply.more


def listdir(transport, dataset: str, path: str = "", *,
            page_size: int = limits.list_page_entries_default) -> Iterator[Entry]:
    """Entries of a directory in name order, fetched page by page (one call a page)."""
    start_after = ""
    while True:
        entries, more = list_page(transport, dataset, path, start_after, page_size)
        yield from entries
        if not more or not entries:
            return
        start_after = entries[-1].name


def lookup(transport, dataset: str, keys: Sequence[SampleKey]) -> list[Entry]:
    """Entries of samples by ids or paths, in order (at most limits.lookup_items_max)."""
    request = pb.LookupRequest(dataset=dataset)
    fill_keys(request, keys)
    return [grpc_types.entry(e) for e in transport.call("Lookup", request).entries]


def all_entries(transport, dataset: str, samples: int) -> list[Entry]:
    """Every sample's entry of a dataset of `samples` samples, in id order.

    One Lookup per `limits.lookup_items_max` samples.
    """
    step = limits.lookup_items_max
    entries: list[Entry] = []
    for start in range(0, samples, step):
        entries.extend(lookup(transport, dataset, range(start, min(start + step, samples))))
    return entries


def empty_dirs(transport, dataset: str) -> list[str]:
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
            problems.append(f"{address} has not committed it yet")
        elif other.generation != info.generation:
            problems.append(f"{address} serves version {other.generation}")
    if not problems:
        return ""
    return (f"members disagree about version {info.generation}: {'; '.join(problems)}. A "
            "member left prepared commits or aborts by itself within seconds once it reaches "
            f"{info.members[0]}; if this stays, run `dlfs ingest SOURCE {info.name} --replace`")
