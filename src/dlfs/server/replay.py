"""Catalog replay at start: rebuild the sample directory, drop leftovers, compact.

`restore` folds the catalog's records into datasets by id, publishes the
sealed ones, brings back resumable ingests that broke off as parked ones
(resumable.py), discards other interrupted ingests (a DELETE record and
their extents) and extent directories no record names, and rewrites the
catalog when dead records make up most of it.  It runs once, before the daemon
serves anything.  Nothing here imports grpc.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging

from dlfs import limits
from dlfs.server import catalog as cat
from dlfs.server.directory import Cluster, DatasetIndex, SampleDirectory
from dlfs.server.extents import ExtentStore
from dlfs.server.resumable import (Checkpoint, ParkedIngest, decode_checkpoint, encode_checkpoint,
                                   truncate_blocks)

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ReplayedDataset:
    """One dataset as its catalog records describe it."""

    name: str
    created_ns: int
    blocks: list
    sealed: bool = False
    record_bytes: int = 0  # SAMPLES and HOLDERS payload bytes in the catalog
    cluster: Cluster | None = None
    checkpoint: Checkpoint | None = None  # the last one of a resumable ingest


def restore(catalog: cat.Catalog, records, extents: ExtentStore
            ) -> tuple[SampleDirectory, int, list[ParkedIngest]]:
    """The sealed datasets of `records` as a directory, the next free dataset id, and
    the resumable ingests that broke off (to be parked).

    Discards other incomplete ingests and orphaned extents (logged), syncs
    the catalog, and compacts it (see `compact_if_mostly_dead`).  Cost: one
    pass over the records plus one index build per dataset; the peak is
    about twice the directory's final size (see `release_free_heap`).
    """
    replayed, max_id = replay(records)
    directory = SampleDirectory()
    parked: list[ParkedIngest] = []
    for dataset_id, entry in replayed.items():
        if not entry.sealed and entry.checkpoint is not None:
            checkpoint = entry.checkpoint
            entry.blocks = truncate_blocks(entry.blocks, checkpoint.samples)
            if any(p.name == entry.name for p in parked):  # cannot happen with a sound log
                log.error("catalog holds two parked ingests named %r; discarding the earlier",
                          entry.name)
                parked = [p for p in parked if p.name != entry.name]
            parked.append(ParkedIngest(dataset_id, entry.name, entry.created_ns, entry.blocks,
                                       checkpoint, entry.cluster))
            continue
        if not entry.sealed:
            samples = sum(len(b) for b in entry.blocks)
            log.warning("discarding incomplete ingest of dataset %r (%d samples arrived "
                        "before the daemon stopped); ingest it again", entry.name, samples)
            catalog.append(cat.RecordType.DELETE, cat.encode_delete(dataset_id))
            extents.remove_dataset(dataset_id)
            continue
        index = DatasetIndex(entry.name, dataset_id, entry.created_ns,
                             cat.SampleBlock.concat(entry.blocks), entry.cluster)
        replaced = directory.publish(index)
        if replaced is not None:  # cannot happen with a well-formed log
            log.error("catalog holds two sealed datasets named %r; keeping the later",
                      entry.name)
    live = {d.dataset_id for d in directory.all()} | {p.dataset_id for p in parked}
    for dataset_id in extents.dataset_ids_on_disk():
        if dataset_id not in live:
            log.warning("removing orphaned extents of dataset id %x", dataset_id)
            extents.remove_dataset(dataset_id)
        max_id = max(max_id, dataset_id)
    for entry in parked:
        if not any(entry.dataset_id == i for i in extents.dataset_ids_on_disk()):
            log.warning("the parked ingest of dataset %r has no extents on disk", entry.name)
    catalog.sync()
    compact_if_mostly_dead(catalog, replayed, max_id, live)
    return directory, max_id + 1, parked


def replay(records) -> tuple[dict[int, ReplayedDataset], int]:
    """Fold catalog records into datasets by id; return them and the largest id seen."""
    datasets: dict[int, ReplayedDataset] = {}
    max_id = 0
    for rtype, payload in records:
        if rtype is cat.RecordType.BEGIN:
            dataset_id, created_ns, name = cat.decode_begin(payload)
            datasets[dataset_id] = ReplayedDataset(name, created_ns, [])
            max_id = max(max_id, dataset_id)
        elif rtype is cat.RecordType.SAMPLES:
            dataset_id, block = cat.decode_samples(payload)
            if dataset_id in datasets:
                datasets[dataset_id].blocks.append(block)
                datasets[dataset_id].record_bytes += len(payload)
        elif rtype is cat.RecordType.CLUSTER:
            dataset_id, replicas, member_index, members = cat.decode_cluster(payload)
            if dataset_id in datasets:
                datasets[dataset_id].cluster = Cluster(tuple(members), replicas, member_index)
        elif rtype is cat.RecordType.GENERATION:
            dataset_id, generation = cat.decode_generation(payload)
            entry = datasets.get(dataset_id)
            if entry is not None and entry.cluster is not None:
                entry.cluster = dataclasses.replace(entry.cluster, generation=generation)
        elif rtype is cat.RecordType.HOLDERS:
            dataset_id, holders = cat.decode_holders(payload)
            entry = datasets.get(dataset_id)
            if entry is not None and entry.blocks and len(entry.blocks[-1]) == len(holders):
                entry.blocks[-1].holders = holders
                entry.record_bytes += len(payload)
        elif rtype is cat.RecordType.SEAL:
            dataset_id, replaces = cat.decode_seal(payload)
            if dataset_id in datasets:
                datasets[dataset_id].sealed = True
            datasets.pop(replaces, None)
        elif rtype is cat.RecordType.DELETE:
            datasets.pop(cat.decode_delete(payload), None)
        elif rtype is cat.RecordType.CHECKPOINT:
            dataset_id, checkpoint = decode_checkpoint(payload)
            entry = datasets.get(dataset_id)
            if entry is not None:  # records of samples past it are void (resumable.py)
                entry.blocks = truncate_blocks(entry.blocks, checkpoint.samples)
                entry.checkpoint = checkpoint
    return datasets, max_id


def compact_if_mostly_dead(catalog: cat.Catalog, replayed: dict[int, ReplayedDataset],
                           max_id: int, live: set[int]) -> None:
    """Rewrite the catalog with only the live datasets when deleted, replaced and
    aborted ones make up most of it (keeps restart time proportional to what
    is stored).  The largest dataset id survives as an empty BEGIN+DELETE
    pair, so ids are never reused."""
    live_bytes = sum(replayed[i].record_bytes for i in live)
    dead_bytes = catalog.size - live_bytes
    if dead_bytes <= max(live_bytes, limits.catalog_compact_dead_bytes_min):
        return
    records = [(cat.RecordType.BEGIN, cat.encode_begin(max_id, 0, "")),
               (cat.RecordType.DELETE, cat.encode_delete(max_id))]
    for dataset_id in sorted(live):
        entry = replayed[dataset_id]
        records += cat.start_records(dataset_id, entry.created_ns, entry.name, entry.cluster)
        for block in entry.blocks:
            records += cat.block_records(dataset_id, block)
        if entry.sealed:
            records.append((cat.RecordType.SEAL, cat.encode_seal(dataset_id)))
        else:  # a parked resumable ingest: its blocks were cut at its last checkpoint
            records.append((cat.RecordType.CHECKPOINT,
                            encode_checkpoint(dataset_id, entry.checkpoint)))
    before = catalog.size
    catalog.rewrite(records)
    log.info("compacted the catalog from %d to %d bytes", before, catalog.size)


def release_free_heap() -> None:
    """Give the replay's freed temporaries back to the OS (glibc `malloc_trim`).

    Replay briefly needs about twice the directory's final size; without
    this the peak stays resident.  A no-op where the C library lacks it.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
