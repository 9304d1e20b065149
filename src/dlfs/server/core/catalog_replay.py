"""Catalog replay at start: rebuild the sample directory, drop leftovers, compact.

`restore` folds the catalog's records into datasets by id, publishes the
sealed ones, brings back resumable ingests that broke off as parked ones
(checkpoints.py), discards other interrupted ingests (a DELETE record and
their extents) and extent directories no record names, and rewrites the
catalog when dead records make up most of it.  It runs once, before the daemon
serves anything.  Nothing here imports grpc.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os

import numpy as np

from dlfs import limits
from dlfs.formats.disk_layout import NO_EXTENT
from dlfs.server.core import catalog as cat
from dlfs.server.core import catalog_records as records
from dlfs.server.core.directory import Cluster, DatasetIndex
from dlfs.server.core.sealed_datasets import SampleDirectory
from dlfs.server.core.extents import ExtentStore
from dlfs.server.core.space_replay import records_of, replay_spaces
from dlfs.server.core.space_tree import SpaceTree
from dlfs.server.core.checkpoints import (
    Checkpoint,
    ParkedIngest,
    decode_checkpoint,
    encode_checkpoint,
    truncate_blocks,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ReplayedDataset:
    """One dataset as its catalog records describe it."""

    name: str
    created_ns: int
    blocks: list
    sealed: bool = False
    record_bytes: int = 0  # SAMPLES, HOLDERS, BLOCKS and DIRS payload bytes in the catalog
    cluster: Cluster | None = None
    dirs: list = dataclasses.field(default_factory=list)  # empty directories (DIRS)
    prepared: bool = False  # a two-phase ingest waiting for its decision
    replace: bool = False  # (prepared) it replaces the dataset of its name
    checkpoint: Checkpoint | None = None  # the last one of a resumable ingest


@dataclasses.dataclass
class Restored:
    """What a data dir holds: the sealed datasets, the prepared two-phase ingests
    (each with whether it replaces its name's dataset), the next free dataset id,
    and the resumable ingests that broke off (to be parked)."""

    directory: SampleDirectory
    prepared: list[tuple[DatasetIndex, bool]]
    next_dataset_id: int
    parked: list[ParkedIngest] = dataclasses.field(default_factory=list)
    spaces: dict[int, SpaceTree] = dataclasses.field(default_factory=dict)


def restore(catalog: cat.Catalog, logged, extents: ExtentStore,
            compact_dead_bytes_min: int = limits.catalog_compact_dead_bytes_min) -> Restored:
    """The sealed datasets, prepared ingests and parked (resumable, broken-off)
    ingests of the `logged` records, and the next free id.

    Discards other incomplete ingests and orphaned
    extents (logged), syncs the catalog, and compacts it (see
    `compact_if_mostly_dead`).  Cost: one pass over the records plus one
    index build per dataset; the peak is about twice the directory's final
    size (see `release_free_heap`).
    """
    replayed, max_id = replay(logged)
    spaces, space_max_id, space_bytes = replay_spaces(logged)
    max_id = max(max_id, space_max_id)
    directory = SampleDirectory()
    prepared: list[tuple[DatasetIndex, bool]] = []
    parked: list[ParkedIngest] = []
    for dataset_id, entry in replayed.items():
        if (not entry.sealed and not entry.prepared and entry.checkpoint is not None
                and entry.checkpoint.samples == 0):
            # Broken off before its first file was durable: nothing to resume from,
            # so it takes no space (a resume with nothing parked starts afresh).
            log.warning("discarding the broken-off ingest of dataset %r: it held no file "
                        "durably", entry.name)
            catalog.append(records.RecordType.DELETE, records.encode_delete(dataset_id))
            _remove_quietly(extents, dataset_id)
            continue
        if not entry.sealed and not entry.prepared and entry.checkpoint is not None:
            checkpoint = entry.checkpoint
            entry.blocks = truncate_blocks(entry.blocks, checkpoint.samples)
            missing = _missing_extents(extents, dataset_id, entry.blocks)
            if missing:
                # A discard whose DELETE did not reach the catalog (a full disk) removes
                # the extents anyway: without them there is nothing to resume.
                log.warning("discarding the broken-off ingest of dataset %r: its extents %s "
                            "are gone", entry.name, missing)
                catalog.append(records.RecordType.DELETE, records.encode_delete(dataset_id))
                _remove_quietly(extents, dataset_id)
                continue
            if any(p.name == entry.name for p in parked):  # cannot happen with a sound log
                log.error("catalog holds two parked ingests named %r; discarding the earlier",
                          entry.name)
                parked = [p for p in parked if p.name != entry.name]
            parked.append(ParkedIngest(dataset_id, entry.name, entry.created_ns, entry.blocks,
                                       checkpoint, entry.cluster))
            continue
        if not entry.sealed and not entry.prepared:
            samples = sum(len(b) for b in entry.blocks)
            log.warning("discarding incomplete ingest of dataset %r (%d samples arrived "
                        "before the daemon stopped); ingest it again", entry.name, samples)
            catalog.append(records.RecordType.DELETE, records.encode_delete(dataset_id))
            _remove_quietly(extents, dataset_id)
            continue
        block = records.SampleBlock.concat(entry.blocks)
        if block.block_crc is None:
            log.info("dataset %r has no block CRCs: parts of its samples over %d bytes are "
                     "not verified, whole samples are (ingest it again to verify every read)",
                     entry.name, block.block_bytes)
        index = DatasetIndex(entry.name, dataset_id, entry.created_ns, block, entry.cluster,
                             dirs=entry.dirs)
        if entry.prepared and not entry.sealed:
            log.warning("dataset %r (generation %d) was prepared but not yet committed or "
                        "aborted when the daemon stopped: it waits for its decision",
                        entry.name, index.generation)
            prepared.append((index, entry.replace))
            continue
        replaced = directory.publish(index)
        if replaced is not None:  # cannot happen with a well-formed log
            log.error("catalog holds two sealed datasets named %r; keeping the later",
                      entry.name)
    live = {d.dataset_id for d in directory.all()} | {i.dataset_id for i, _ in prepared} | \
        {p.dataset_id for p in parked}
    # A space's live file versions keep their extents; the versions of files that
    # were being written when the daemon stopped (never recorded) are orphans.
    live_versions = {v.version_id for tree in spaces.values() for _, v in tree.versions()}
    for dataset_id in extents.dataset_ids_on_disk():
        if dataset_id not in live and dataset_id not in live_versions:
            log.warning("removing orphaned extents of dataset id %x", dataset_id)
            _remove_quietly(extents, dataset_id)
        max_id = max(max_id, dataset_id)
    catalog.sync()
    compact_if_mostly_dead(catalog, replayed, max_id, live, compact_dead_bytes_min,
                           spaces=list(spaces.values()), space_bytes=space_bytes)
    return Restored(directory, prepared, max_id + 1, parked, spaces)


def _missing_extents(extents: ExtentStore, dataset_id: int, blocks) -> list[int]:
    """The extent numbers `blocks` refer to that have no file on disk, sorted."""
    numbers: set[int] = set()
    for block in blocks:
        numbers.update(int(e) for e in np.unique(block.extent) if e != NO_EXTENT)
    return sorted(n for n in numbers
                  if not os.path.exists(extents.extent_path(dataset_id, n)))


def _remove_quietly(extents: ExtentStore, dataset_id: int) -> None:
    """Remove extents no sealed dataset uses; a failure only costs space until the next start."""
    try:
        extents.remove_dataset(dataset_id)
    except OSError as exc:
        log.warning("could not remove the extents of dataset id %x (%s); the next start "
                    "tries again", dataset_id, exc)


def replay(logged) -> tuple[dict[int, ReplayedDataset], int]:
    """Fold catalog records into datasets by id; return them and the largest id seen."""
    datasets: dict[int, ReplayedDataset] = {}
    max_id = 0
    for rtype, payload in logged:
        if rtype is records.RecordType.BEGIN:
            dataset_id, created_ns, name = records.decode_begin(payload)
            datasets[dataset_id] = ReplayedDataset(name, created_ns, [])
            max_id = max(max_id, dataset_id)
        elif rtype is records.RecordType.SAMPLES:
            dataset_id, block = records.decode_samples(payload)
            if dataset_id in datasets:
                datasets[dataset_id].blocks.append(block)
                datasets[dataset_id].record_bytes += len(payload)
        elif rtype is records.RecordType.CLUSTER:
            dataset_id, replicas, member_index, members = records.decode_cluster(payload)
            if dataset_id in datasets:
                datasets[dataset_id].cluster = Cluster(tuple(members), replicas, member_index)
        elif rtype is records.RecordType.GENERATION:
            dataset_id, generation = records.decode_generation(payload)
            entry = datasets.get(dataset_id)
            if entry is not None and entry.cluster is not None:
                entry.cluster = dataclasses.replace(entry.cluster, generation=generation)
        elif rtype is records.RecordType.HOLDERS:
            dataset_id, holders = records.decode_holders(payload)
            entry = datasets.get(dataset_id)
            if entry is not None and entry.blocks and len(entry.blocks[-1]) == len(holders):
                entry.blocks[-1].holders = holders
                entry.record_bytes += len(payload)
        elif rtype is records.RecordType.PREPARE:
            dataset_id, replace = records.decode_prepare(payload)
            entry = datasets.get(dataset_id)
            if entry is not None:
                entry.prepared, entry.replace = True, replace
        elif rtype is records.RecordType.BLOCKS:
            dataset_id, block_bytes, crcs = records.decode_blocks(payload)
            entry = datasets.get(dataset_id)
            if entry is not None and entry.blocks and \
                    entry.blocks[-1].block_crcs_expected(block_bytes) == crcs.size:
                entry.blocks[-1].block_crc = crcs
                entry.blocks[-1].block_bytes = block_bytes
                entry.record_bytes += len(payload)
        elif rtype is records.RecordType.DIRS:
            dataset_id, paths = records.decode_dirs(payload)
            entry = datasets.get(dataset_id)
            if entry is not None:
                entry.dirs.extend(paths)
                entry.record_bytes += len(payload)
        elif rtype is records.RecordType.SEAL:
            dataset_id, replaces = records.decode_seal(payload)
            if dataset_id in datasets:
                datasets[dataset_id].sealed = True
            datasets.pop(replaces, None)
        elif rtype is records.RecordType.DELETE:
            datasets.pop(records.decode_delete(payload), None)
        elif rtype is records.RecordType.CHECKPOINT:
            dataset_id, checkpoint = decode_checkpoint(payload)
            entry = datasets.get(dataset_id)
            if entry is not None:  # records of samples past it are void (checkpoints.py)
                entry.blocks = truncate_blocks(entry.blocks, checkpoint.samples)
                entry.checkpoint = checkpoint
    return datasets, max_id


def compact_if_mostly_dead(catalog: cat.Catalog, replayed: dict[int, ReplayedDataset],
                           max_id: int, live: set[int],
                           dead_bytes_min: int = limits.catalog_compact_dead_bytes_min, *,
                           spaces: list[SpaceTree] = (), space_bytes: int = 0) -> None:
    """Rewrite the catalog with only the live datasets (sealed or prepared) and
    `spaces` (whose records take `space_bytes`) when deleted, replaced and
    aborted datasets and dead file versions make up most of it and more than
    `dead_bytes_min` (keeps restart time proportional to what is stored).  The
    largest dataset id survives as an empty BEGIN+DELETE pair, so ids are
    never reused."""
    live_bytes = sum(replayed[i].record_bytes for i in live) + space_bytes
    dead_bytes = catalog.size - live_bytes
    if dead_bytes <= max(live_bytes, dead_bytes_min):
        return
    kept = [(records.RecordType.BEGIN, records.encode_begin(max_id, 0, "")),
            (records.RecordType.DELETE, records.encode_delete(max_id))]
    for dataset_id in sorted(live):
        entry = replayed[dataset_id]
        kept += records.start_records(dataset_id, entry.created_ns, entry.name, entry.cluster)
        for block in entry.blocks:
            kept += records.block_records(dataset_id, block)
        kept += records.dirs_records(dataset_id, entry.dirs)
        if entry.sealed:
            kept.append((records.RecordType.SEAL, records.encode_seal(dataset_id)))
        elif entry.prepared:  # a prepared ingest stays prepared
            kept.append((records.RecordType.PREPARE,
                         records.encode_prepare(dataset_id, entry.replace)))
        else:  # a parked resumable ingest: its blocks were cut at its last checkpoint
            kept.append((records.RecordType.CHECKPOINT,
                         encode_checkpoint(dataset_id, entry.checkpoint)))
    for tree in spaces:
        kept += records_of(tree)
    before = catalog.size
    try:
        catalog.rewrite(kept)
    except cat.CatalogFailed:
        raise
    except OSError as exc:  # compaction only saves time: go on with the old log
        log.warning("could not compact the catalog (%s); going on with the old one", exc)
        return
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
