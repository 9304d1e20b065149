"""The numeric part of a sealed dataset: one array per field, indexed by sample id.

`SampleArrays` is what the data path's replies read of a dataset (where
each sample lies, its length and CRC32C, its block CRCs, which members
hold it) and the checks a request meets (ids in range, samples stored
here).  `DatasetIndex` (directory.py) adds the directory tree and names
for the gRPC front door; a data path worker process holds only this part,
mapped from the main process's shared copy (shared_index.py), so the
arrays exist once in memory however many processes serve them.

Immutable.  Every check is vectorized: O(len(ids)), no Python loop per
sample.  Memory: 36 bytes per sample (extent 4, offset 8, length 8, crc 4,
mode 4, mtime 8), plus the holders of a striped dataset and the block CRCs
of large samples (block_index.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dlfs.errors import FailedPrecondition, InvalidArgument, StaleGeneration
from dlfs.formats.disk_layout import NO_EXTENT
from dlfs.server.core.block_index import BlockIndex
from dlfs.types import DatasetInfo


@dataclasses.dataclass(frozen=True)
class Cluster:
    """How a striped dataset is spread: member daemons (placement order),
    copies per sample, and this daemon's index among the members."""

    members: tuple
    replicas: int
    member_index: int
    # The version id the striped ingest named, the same on every member; 0 in
    # catalogs written before generations (the dataset id stands in then).
    generation: int = 0


def generation_of(cluster: "Cluster | None", dataset_id: int) -> int:
    """The version number of a dataset with this `cluster` (None: one daemon's) and
    id: the striped ingest's generation, or the dataset id (see SampleArrays.generation)."""
    return cluster.generation if cluster is not None else dataset_id


def stale_generation(name: str, generation: int, current: int) -> StaleGeneration:
    """The error for a read naming version `generation` of dataset `name` when
    `current` is served: the same words from every process that serves reads."""
    return StaleGeneration(
        f"dataset {name!r} was replaced: version {generation} is no longer served (the "
        f"current one is {current}); open it again")


class SampleArrays:
    """One sealed dataset's per-sample arrays (read-only numpy arrays, any backing).

    `extent` uint32 (NO_EXTENT: stored by other members only), `offset` and
    `length` uint64, `crc` uint32, `mode` uint32, `mtime_ns` int64, each of
    one entry per sample id; `holders` uint16 (samples, replicas) for a
    striped dataset (with `cluster`), else None; `blocks` the block CRCs.
    `total_bytes` and `extents` (distinct local extent files) are computed
    when not given.
    """

    def __init__(self, name: str, dataset_id: int, created_ns: int, *, extent: np.ndarray,
                 offset: np.ndarray, length: np.ndarray, crc: np.ndarray, mode: np.ndarray,
                 mtime_ns: np.ndarray, blocks: BlockIndex, cluster: Cluster | None = None,
                 holders: np.ndarray | None = None, total_bytes: int | None = None,
                 extents: int | None = None):
        self.name = name
        self.dataset_id = dataset_id
        self.created_ns = created_ns
        self.cluster = cluster  # striped datasets: the member daemons, else None
        self.extent, self.offset, self.length, self.crc = extent, offset, length, crc
        self.mode, self.mtime_ns = mode, mtime_ns
        self.holders = holders
        self.blocks = blocks
        # The sealed memfd the arrays are views of, when other processes serve this
        # dataset too (shared_index.share); None while they are private.
        self.shared_index = None
        if (self.holders is None) != (cluster is None):
            raise InvalidArgument(f"dataset {name!r}: sample holders and cluster members must "
                                  "come together")
        self.total_bytes = int(length.sum()) if total_bytes is None else total_bytes
        self.extents = (int(np.unique(extent[extent != NO_EXTENT]).size) if extents is None
                        else extents)

    def __len__(self) -> int:
        return int(self.length.size)

    @property
    def generation(self) -> int:
        """This sealed version's number, never reused (a replace gets a new one): the
        id a striped ingest named on all its members, else the dataset id.

        0 for a striped dataset ingested before generations existed: its
        members' dataset ids differ, so there is no common number; reads of
        it cannot tell versions apart (ingest it again to get one).
        """
        return generation_of(self.cluster, self.dataset_id)

    def summary(self) -> DatasetInfo:
        cluster = self.cluster
        return DatasetInfo(self.name, len(self), self.total_bytes, True, self.created_ns,
                           self.extents, tuple(cluster.members) if cluster else (),
                           cluster.replicas if cluster else 0,
                           cluster.member_index if cluster else 0, self.generation)

    def check_generation(self, generation: int) -> None:
        """Raise StaleGeneration unless `generation` is 0 (any) or this version's."""
        if generation and self.generation != generation:
            raise stale_generation(self.name, generation, self.generation)

    def check_local(self, ids: np.ndarray) -> None:
        """Raise FailedPrecondition if any of `ids` is stored on other daemons only."""
        if self.cluster is None or ids.size == 0:
            return
        remote = self.extent[ids] == NO_EXTENT
        if remote.any():
            sample_id = int(ids[np.argmax(remote)])
            holders = ", ".join(self.cluster.members[h] for h in self.holders[sample_id])
            raise FailedPrecondition(
                f"sample {sample_id} of dataset {self.name!r} is stored on {holders}, not on "
                "this daemon; a client given every member address routes reads itself")

    def check_ids(self, ids) -> np.ndarray:
        """Validate `ids` (any integer sequence) and return them as int64.

        Vectorized: O(len(ids)).  Raises InvalidArgument naming the first id
        outside 0..N-1.
        """
        values = np.asarray(ids)
        if values.size == 0:
            return np.empty(0, dtype=np.int64)
        if values.ndim != 1 or values.dtype.kind not in "iu":
            raise InvalidArgument("sample ids must be a flat sequence of integers")
        if values.dtype.kind == "u" and values.dtype.itemsize == 8:
            out_of_range = int(values.max()) >= len(self)
        else:
            values = values.astype(np.int64, copy=False)
            # Two reductions, no temporary arrays: this runs for every batch.
            out_of_range = int(values.min()) < 0 or int(values.max()) >= len(self)
        if out_of_range:
            bad = (values < 0) | (values >= len(self))  # never negative when unsigned
            first = int(np.asarray(ids)[np.argmax(bad)])
            raise InvalidArgument(self._range_message(first))
        return values.astype(np.int64, copy=False)

    def check_id(self, sample_id: int) -> None:
        """Raise InvalidArgument unless 0 <= `sample_id` < samples.  O(1)."""
        if not 0 <= sample_id < len(self):
            raise InvalidArgument(self._range_message(sample_id))

    def _range_message(self, sample_id: int) -> str:
        if len(self) == 0:
            return f"sample id {sample_id} is out of range: dataset {self.name!r} is empty"
        return (
            f"sample id {sample_id} is out of range for dataset {self.name!r}: "
            f"valid ids are 0..{len(self) - 1}"
        )

    def describe(self, sample_id: int) -> str:
        """The sample named for error messages: sample ID of dataset 'NAME' (DatasetIndex
        adds its path).  O(1)."""
        return f"sample {sample_id} of dataset {self.name!r}"

    def describe_extent(self, extent_no: int) -> str:
        """An extent named for error messages.  O(1)."""
        return f"extent {extent_no} of dataset {self.name!r}"

    def block_crcs(self, sample_id: int) -> np.ndarray | None:
        """CRC32C of each block of sample `sample_id` (dlfs.formats.block_crcs), or None when
        its blocks have none (ingested before block CRCs).  O(log n)."""
        return self.blocks.crcs(sample_id, int(self.length[sample_id]),
                                int(self.crc[sample_id]))

    def size_and_crc(self, sample_id: int) -> tuple[int, int]:
        """(bytes, CRC32C) of sample `sample_id` as stored.  O(1).  Raises InvalidArgument."""
        self.check_id(sample_id)
        return int(self.length[sample_id]), int(self.crc[sample_id])

    # The per-sample columns, in the order shared_index.py stores them.
    COLUMNS = ("extent", "offset", "length", "crc", "mode", "mtime_ns")
