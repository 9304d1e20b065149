"""Resumable ingests: the CHECKPOINT record and what it means at replay.

A resumable ingest (IngestStart.resumable) survives its stream breaking off
and the daemon restarting.  What it holds durably is always a prefix of
what its streams carried: the first K files, in stream order.  A
checkpoint makes that prefix durable and says so, in this order:

1. fsync the open extent and the dataset's extent directory (extents the
   ingest moved past were synced when it moved past them);
2. append the SAMPLES records of the files received since the last
   checkpoint;
3. append CHECKPOINT (below) and fsync the catalog.

CHECKPOINT payload (little endian)::

    dataset id u64 | samples K u64 | bytes u64 | extent no u32 (0xFFFFFFFF:
    none yet) | extent end u64 | wall time ns i64 | flags u32 (bit 0:
    replace) | digest 16 bytes (dlfs.formats.ingest_digest over the K files)

Meaning at replay: the dataset's first K samples recorded so far are
durable; records of further samples before the CHECKPOINT are void (a
daemon that died after appending them had not synced their bytes).  Every
resume appends a CHECKPOINT before it accepts data, so the void records of
a crash are cut off from what follows.  An unsealed dataset with a
CHECKPOINT of K > 0 files is not discarded at restart (K = 0: nothing to
resume from, it is): it comes back *parked* with its
first K samples (SAMPLES records after its last CHECKPOINT are void), its
extents truncated at `extent end` when it resumes, and new data in a new
extent.  The first CHECKPOINT (K = 0) is written when the ingest begins,
which is what marks it resumable.  A parked ingest is discarded (DELETE
record, extents removed) when it is not resumed within the daemon's
--resumable-ingest-timeout-s of its last CHECKPOINT, or by DiscardIngest.
A stream that breaks off parks the ingest only when it holds files
durably (else it is discarded at once); when the checkpoint at the break
cannot be taken (disk full, EIO), it parks at the last one, and the
extents are cut there (IngestSession.back_to_checkpoint).

Checkpoints are taken every `limits.ingest_checkpoint_bytes` or
`limits.ingest_checkpoint_interval_s`, when the stream breaks off (the
file being received is dropped), and when a two-phase ingest is prepared.
Nothing here imports grpc.
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np

from dlfs.formats.ingest_digest import DIGEST_BYTES
from dlfs.formats.disk_layout import NO_EXTENT
from dlfs.server.core.catalog_records import SampleBlock

_CHECKPOINT = struct.Struct(f"<QQQIQqI{DIGEST_BYTES}s")
_REPLACE = 1


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A resumable ingest's durable point: its first `samples` files."""

    samples: int
    bytes: int
    extent_no: int  # the extent holding the last durable byte; -1: none yet
    extent_end: int  # bytes of that extent that are durable (header included)
    time_ns: int  # wall clock when it was taken
    replace: bool
    digest: bytes


def encode_checkpoint(dataset_id: int, checkpoint: Checkpoint) -> bytes:
    extent = NO_EXTENT if checkpoint.extent_no < 0 else checkpoint.extent_no
    return _CHECKPOINT.pack(dataset_id, checkpoint.samples, checkpoint.bytes, extent,
                            checkpoint.extent_end, checkpoint.time_ns,
                            _REPLACE if checkpoint.replace else 0, checkpoint.digest)


def decode_checkpoint(payload: bytes) -> tuple[int, Checkpoint]:
    (dataset_id, samples, size, extent, end, time_ns, flags,
     digest) = _CHECKPOINT.unpack_from(payload)
    extent_no = -1 if extent == NO_EXTENT else extent
    return dataset_id, Checkpoint(samples, size, extent_no, end, time_ns, bool(flags & _REPLACE),
                                  digest)


def truncate_blocks(blocks: list[SampleBlock], samples: int) -> list[SampleBlock]:
    """The first `samples` samples of `blocks` (the blocks themselves where whole)."""
    kept: list[SampleBlock] = []
    left = samples
    for block in blocks:
        if left <= 0:
            break
        if len(block) <= left:
            kept.append(block)
            left -= len(block)
            continue
        cut = SampleBlock(block.paths[:left], block.extent[:left], block.offset[:left],
                          block.length[:left], block.crc[:left], block.mode[:left],
                          block.mtime_ns[:left],
                          None if block.holders is None else block.holders[:left],
                          block_bytes=block.block_bytes)
        if block.block_crc is not None:  # the kept samples' block CRCs come first
            cut.block_crc = block.block_crc[:cut.block_crcs_expected()]
        kept.append(cut)
        left = 0
    return kept


def block_samples(blocks: list[SampleBlock]) -> int:
    return sum(len(block) for block in blocks)


@dataclasses.dataclass(frozen=True)
class ParkedIngest:
    """An unsealed resumable dataset found at replay: comes back parked."""

    dataset_id: int
    name: str
    created_ns: int
    blocks: list
    checkpoint: Checkpoint
    cluster: object  # dlfs.server.core.directory.Cluster or None


@dataclasses.dataclass(frozen=True)
class ProgressInfo:
    """What GetIngestProgress tells about a running, prepared or parked ingest."""

    name: str
    state: str
    samples: int
    bytes: int
    digest: bytes
    last_path: str
    replace: bool
    cluster: object  # Cluster or None
    parked_ns: int
    expires_in_s: float


def extent_numbers(paths: list[str]) -> list[int]:
    """Extent numbers of file names like '000003.ext' (others ignored)."""
    numbers = []
    for name in paths:
        stem, dot, suffix = name.partition(".")
        if dot and suffix == "ext" and stem.isdigit():
            numbers.append(int(stem))
    return sorted(numbers)


def sizes_of(blocks: list[SampleBlock]) -> int:
    return int(sum(int(np.sum(block.length)) for block in blocks))
