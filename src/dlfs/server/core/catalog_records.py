"""The catalog's records: their types and payloads, and their encoding.

`catalog` writes and scans the log (framing, CRCs, torn tails); this module
says what a record holds.  All integers little endian.

Record types and payloads:

    BEGIN   dataset id u64 | created ns i64 | name (UTF-8, rest of payload)
    SAMPLES dataset id u64 | count u32 | extent u32[n] | offset u64[n] | length u64[n]
            | crc u32[n] | mode u32[n] | mtime ns i64[n] | paths: UTF-8, NUL-separated
    SEAL    dataset id u64 | replaces dataset id u64 (0: none)
    DELETE  dataset id u64 (also ends an ingest that was aborted)
    CLUSTER dataset id u64 | replicas u32 | member index u32 | member addresses
            (UTF-8, NUL-separated): the dataset is striped over these daemons
    HOLDERS dataset id u64 | count u32 | replicas u32 | member indices u16[n x r]
            of the samples of the SAMPLES record just before it
    GENERATION dataset id u64 | generation u64: the version id a striped ingest
            named, the same on every member (without it, the generation is the
            dataset id)
    BLOCKS  dataset id u64 | block bytes u32 | count u32 | crc u32[count]: the block
            CRC32Cs (dlfs.formats.block_crcs) of the samples of the SAMPLES record just
            before it that are stored here and longer than block bytes, in
            record order, ceil(length / block bytes) each.  Format version 2;
            a dataset without them (written by version 1) has whole-sample
            CRCs only.
    DIRS    dataset id u64 | paths (UTF-8, NUL-separated): directories of the
            dataset that hold no sample (empty in the ingest source).  Format
            version 2.
    PREPARE dataset id u64 | flags u32 (bit 0: replaces the dataset of its
            name): a two-phase ingest is durable and waits for its decision;
            replay keeps it prepared (not discarded) until a SEAL or DELETE.
            Format version 2.
    CHECKPOINT a resumable ingest's durable point (payload and meaning in
            dlfs.server.core.checkpoints): the dataset's first N samples recorded so
            far are durable, records of further samples before it are void.
            Format version 2.
    SPACE, FILE, MKDIR, REMOVE, RENAME: checkpoint spaces and their files (payloads
            and meaning in dlfs.server.core.space_records).  Format version 3.  A
            DELETE naming a space id removes the space and every file in it.

Version 2 added BLOCKS, DIRS, PREPARE and CHECKPOINT, version 3 the space records; a version 1 catalog is read as it
is and its header is rewritten to version 2 when opened, so a daemon that
knows only version 1 refuses it by its version rather than by an unknown
record.

Nothing here imports grpc.
"""

from __future__ import annotations

import dataclasses
import enum
import struct

import numpy as np

from dlfs import limits
from dlfs.formats import block_crcs
from dlfs.formats.disk_layout import NO_EXTENT

_U64 = struct.Struct("<Q")
_BEGIN = struct.Struct("<Qq")
_SAMPLES = struct.Struct("<QI")
_SEAL = struct.Struct("<QQ")


class RecordType(enum.IntEnum):
    BEGIN = 1
    SAMPLES = 2
    SEAL = 3
    DELETE = 4
    CLUSTER = 5
    HOLDERS = 6
    GENERATION = 7
    BLOCKS = 8
    DIRS = 9
    PREPARE = 10
    CHECKPOINT = 11
    SPACE = 12
    FILE = 13
    MKDIR = 14
    REMOVE = 15
    RENAME = 16


RECORD_TYPES = frozenset(t.value for t in RecordType)


@dataclasses.dataclass
class SampleBlock:
    """Locations and metadata of samples, in arrival order (one SAMPLES record)."""

    paths: list[str]
    extent: np.ndarray  # uint32
    offset: np.ndarray  # uint64
    length: np.ndarray  # uint64
    crc: np.ndarray  # uint32
    mode: np.ndarray  # uint32
    mtime_ns: np.ndarray  # int64
    # Striped datasets: uint16 (n, replicas) member indices holding each sample.
    holders: np.ndarray | None = None
    # Block CRC32Cs of the samples stored here that are longer than
    # `block_bytes` (see the BLOCKS record), or None: none were recorded.
    block_crc: np.ndarray | None = None  # uint32
    block_bytes: int = block_crcs.BLOCK_BYTES

    def __len__(self) -> int:
        return len(self.paths)

    def block_crcs_expected(self, block_bytes: int | None = None) -> int:
        """How many block CRCs this block's samples have.  O(n), vectorized."""
        local = self.extent != NO_EXTENT
        return int(block_crcs.block_counts(self.length[local],
                                         block_bytes or self.block_bytes).sum())

    @staticmethod
    def concat(blocks: list["SampleBlock"]) -> "SampleBlock":
        if not blocks:
            return SampleBlock([], *(np.empty(0, dt) for dt in _ARRAY_DTYPES),
                               block_crc=np.empty(0, np.uint32))
        paths: list[str] = []
        for block in blocks:
            paths.extend(block.paths)
        arrays = [np.concatenate([getattr(b, f) for b in blocks]) for f in _ARRAY_FIELDS]
        holders = None
        if any(b.holders is not None for b in blocks):
            holders = np.concatenate([b.holders for b in blocks])
        block_crc, block_bytes = _concat_block_crcs(blocks)
        return SampleBlock(paths, *arrays, holders=holders, block_crc=block_crc,
                           block_bytes=block_bytes)


def _concat_block_crcs(blocks: list[SampleBlock]) -> tuple[np.ndarray | None, int]:
    """The block CRCs of `blocks` together, or None unless every sample that needs
    them has them (all of one block size)."""
    sizes = {b.block_bytes for b in blocks if b.block_crc is not None}
    if len(sizes) > 1:
        return None, block_crcs.BLOCK_BYTES
    block_bytes = sizes.pop() if sizes else block_crcs.BLOCK_BYTES
    parts = []
    for block in blocks:
        if block.block_crc is not None:
            parts.append(block.block_crc)
        elif block.block_crcs_expected(block_bytes):
            return None, block_bytes  # written before block CRCs: whole-sample CRCs only
    if not parts:
        return np.empty(0, np.uint32), block_bytes
    return np.concatenate(parts).astype(np.uint32, copy=False), block_bytes


_ARRAY_FIELDS = ("extent", "offset", "length", "crc", "mode", "mtime_ns")
_ARRAY_DTYPES = (np.dtype("<u4"), np.dtype("<u8"), np.dtype("<u8"), np.dtype("<u4"),
                 np.dtype("<u4"), np.dtype("<i8"))


def encode_begin(dataset_id: int, created_ns: int, name: str) -> bytes:
    return _BEGIN.pack(dataset_id, created_ns) + name.encode("utf-8")


def encode_samples(dataset_id: int, block: SampleBlock) -> bytes:
    n = len(block)
    parts = [_SAMPLES.pack(dataset_id, n)]
    for field, dtype in zip(_ARRAY_FIELDS, _ARRAY_DTYPES):
        array = np.ascontiguousarray(getattr(block, field), dtype=dtype)
        assert array.shape == (n,)
        parts.append(array.tobytes())
    parts.append("\0".join(block.paths).encode("utf-8"))
    return b"".join(parts)


_CLUSTER = struct.Struct("<QII")
_GENERATION = struct.Struct("<QQ")
_HOLDERS = struct.Struct("<QII")


def encode_cluster(dataset_id: int, replicas: int, member_index: int, members: list[str]) -> bytes:
    return _CLUSTER.pack(dataset_id, replicas, member_index) + "\0".join(members).encode("utf-8")


def decode_cluster(payload: bytes) -> tuple[int, int, int, list[str]]:
    dataset_id, replicas, member_index = _CLUSTER.unpack_from(payload)
    return dataset_id, replicas, member_index, payload[_CLUSTER.size:].decode("utf-8").split("\0")


def encode_generation(dataset_id: int, generation: int) -> bytes:
    return _GENERATION.pack(dataset_id, generation)


def decode_generation(payload: bytes) -> tuple[int, int]:
    return _GENERATION.unpack_from(payload)


def encode_holders(dataset_id: int, holders: np.ndarray) -> bytes:
    n, replicas = holders.shape
    return _HOLDERS.pack(dataset_id, n, replicas) + np.ascontiguousarray(holders, "<u2").tobytes()


def decode_holders(payload: bytes) -> tuple[int, np.ndarray]:
    dataset_id, n, replicas = _HOLDERS.unpack_from(payload)
    array = np.frombuffer(payload, "<u2", count=n * replicas, offset=_HOLDERS.size)
    return dataset_id, array.reshape(n, replicas).copy()


_PREPARE = struct.Struct("<QI")
PREPARE_REPLACES = 1


def encode_prepare(dataset_id: int, replace: bool) -> bytes:
    return _PREPARE.pack(dataset_id, PREPARE_REPLACES if replace else 0)


def decode_prepare(payload: bytes) -> tuple[int, bool]:
    dataset_id, flags = _PREPARE.unpack_from(payload)
    return dataset_id, bool(flags & PREPARE_REPLACES)


_BLOCKS = struct.Struct("<QII")


def encode_blocks(dataset_id: int, block_bytes: int, crcs: np.ndarray) -> bytes:
    crcs = np.ascontiguousarray(crcs, "<u4")
    return _BLOCKS.pack(dataset_id, block_bytes, crcs.size) + crcs.tobytes()


def decode_blocks(payload: bytes) -> tuple[int, int, np.ndarray]:
    """(dataset id, block bytes, block CRCs) of a BLOCKS record."""
    dataset_id, block_bytes, count = _BLOCKS.unpack_from(payload)
    if len(payload) != _BLOCKS.size + 4 * count or block_bytes == 0:
        raise ValueError(f"BLOCKS record of {len(payload)} bytes announces {count} CRCs of "
                         f"{block_bytes}-byte blocks")
    return dataset_id, block_bytes, np.frombuffer(payload, "<u4", count, _BLOCKS.size).copy()


def encode_dirs(dataset_id: int, paths: list[str]) -> bytes:
    return _U64.pack(dataset_id) + "\0".join(paths).encode("utf-8")


def decode_dirs(payload: bytes) -> tuple[int, list[str]]:
    """(dataset id, directory paths) of a DIRS record."""
    text = payload[_U64.size:].decode("utf-8")
    return _U64.unpack_from(payload)[0], text.split("\0") if text else []


def dirs_records(dataset_id: int, paths: list[str]) -> list[tuple[RecordType, bytes]]:
    """DIRS records naming `paths` (empty directories), split to fit records."""
    records, part, size = [], [], 0
    for path in paths:
        if part and size + len(path) + 1 > limits.catalog_record_bytes_max // 2:
            records.append((RecordType.DIRS, encode_dirs(dataset_id, part)))
            part, size = [], 0
        part.append(path)
        size += len(path.encode("utf-8")) + 1
    if part:
        records.append((RecordType.DIRS, encode_dirs(dataset_id, part)))
    return records


def encode_seal(dataset_id: int, replaces_dataset_id: int = 0) -> bytes:
    return _SEAL.pack(dataset_id, replaces_dataset_id)


def encode_delete(dataset_id: int) -> bytes:
    return _U64.pack(dataset_id)


def start_records(dataset_id: int, created_ns: int, name: str, cluster=None
                  ) -> list[tuple[RecordType, bytes]]:
    """The records that open a dataset: BEGIN, then CLUSTER for a striped one
    (`cluster`: a `dlfs.server.core.directory.Cluster`, or None)."""
    records = [(RecordType.BEGIN, encode_begin(dataset_id, created_ns, name))]
    if cluster is not None:
        records.append((RecordType.CLUSTER, encode_cluster(
            dataset_id, cluster.replicas, cluster.member_index, list(cluster.members))))
        if cluster.generation:
            records.append((RecordType.GENERATION,
                            encode_generation(dataset_id, cluster.generation)))
    return records


def block_records(dataset_id: int, block: SampleBlock) -> list[tuple[RecordType, bytes]]:
    """The records of one block of samples: SAMPLES, then HOLDERS for a striped dataset."""
    records = [(RecordType.SAMPLES, encode_samples(dataset_id, block))]
    if block.holders is not None:
        records.append((RecordType.HOLDERS, encode_holders(dataset_id, block.holders)))
    if block.block_crc is not None and block.block_crc.size:
        records.append((RecordType.BLOCKS, encode_blocks(dataset_id, block.block_bytes,
                                                         block.block_crc)))
    return records


def decode_begin(payload: bytes) -> tuple[int, int, str]:
    dataset_id, created_ns = _BEGIN.unpack_from(payload)
    return dataset_id, created_ns, payload[_BEGIN.size:].decode("utf-8")


def decode_samples(payload: bytes) -> tuple[int, SampleBlock]:
    dataset_id, n = _SAMPLES.unpack_from(payload)
    pos = _SAMPLES.size
    arrays = []
    for dtype in _ARRAY_DTYPES:
        arrays.append(np.frombuffer(payload, dtype=dtype, count=n, offset=pos).copy())
        pos += n * dtype.itemsize
    text = payload[pos:].decode("utf-8")
    paths = text.split("\0") if n else []
    if len(paths) != n:
        raise ValueError(f"SAMPLES record holds {len(paths)} paths for {n} samples")
    return dataset_id, SampleBlock(paths, *arrays)


def decode_seal(payload: bytes) -> tuple[int, int]:
    return _SEAL.unpack_from(payload)


def decode_delete(payload: bytes) -> int:
    return _U64.unpack_from(payload)[0]
