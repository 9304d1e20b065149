"""A sealed dataset's arrays in one read-only mapping that every serving process shares.

Why (docs/DESIGN.md, "The data path on many cores"): the data path is
served by several worker processes, and each needs the numeric index of
every dataset it serves (where each sample lies, its length, CRC32C, block
CRCs, holders: `SampleArrays`).  Copying it into each worker, or pickling
it per request, would multiply the daemon's largest structure by the
workers.  Instead the main process writes a generation's arrays once into
a memfd, seals it against every change (F_SEAL_WRITE, _GROW, _SHRINK,
_SEAL), maps it read-only and makes its own `DatasetIndex` use those
views; workers receive the descriptor (SCM_RIGHTS) and map the same pages.
The memory exists once however many processes serve it, and a crash frees
it with the last descriptor or mapping: no names to clean up (a file under
the data dir would cost a write and a read of the index at every start; a
/dev/shm name outlives a killed daemon and is small in containers).

Layout of the memfd: a header (magic b"DLFSIDX\\0", format version, bytes
of metadata), the metadata as JSON (name, ids, cluster, block size, and
per array its dtype, shape and offset), then each array at a 64-byte
aligned offset.  Nothing here imports grpc or knows about processes.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import struct

import numpy as np

from dlfs.server.core.block_index import BlockIndex
from dlfs.server.core.sample_arrays import Cluster, SampleArrays

MAGIC = b"DLFSIDX\0"
VERSION = 1
_HEADER = struct.Struct("<8sII")  # magic, version, metadata bytes
_ALIGN = 64
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
# The kernel's limit on a memfd's name (249 bytes, less the "memfd:" it adds).
_NAME_CHARS_MAX = 200


class SharedIndex:
    """The sealed memfd of one dataset's index (`export`), owned: `close()` closes the
    descriptor (the mappings made from it live on); so does losing the last
    reference, so an index exported for an ingest that then failed leaks nothing."""

    def __init__(self, fd: int):
        self.fd = fd

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self):
        self.close()


def share(arrays: SampleArrays) -> SharedIndex:
    """Export `arrays` into a sealed memfd and make them use its mapping (`export`, then
    `adopt`): their private copies are freed.  Cost: one copy of the arrays.  Raises
    OSError (ENOMEM, EMFILE)."""
    handle = SharedIndex(export(arrays))
    adopt(arrays, handle.fd)
    return handle


def _columns(arrays: SampleArrays) -> dict[str, np.ndarray]:
    columns = {field: getattr(arrays, field) for field in SampleArrays.COLUMNS}
    if arrays.holders is not None:
        columns["holders"] = arrays.holders
    columns.update(arrays.blocks.columns())
    return columns


def export(arrays: SampleArrays) -> int:
    """A sealed memfd holding `arrays` (its columns, block CRCs and metadata); the
    caller owns the descriptor (close-on-exec; pass it on with SCM_RIGHTS).

    Cost: one copy of the arrays (36 bytes per sample, plus holders and block
    CRCs) into shared memory.  Raises OSError (ENOMEM, EMFILE).
    """
    columns = {name: np.ascontiguousarray(a) for name, a in _columns(arrays).items()}
    cluster = arrays.cluster
    meta = {"name": arrays.name, "dataset_id": arrays.dataset_id,
            "created_ns": arrays.created_ns, "total_bytes": arrays.total_bytes,
            "extents": arrays.extents, "block_bytes": arrays.blocks.block_bytes,
            "block_complete": arrays.blocks.complete,
            "cluster": None if cluster is None else [list(cluster.members), cluster.replicas,
                                                     cluster.member_index, cluster.generation],
            "arrays": {}}
    # Offsets depend on the metadata's length, which holds them: lay the arrays out
    # after a generous guess of it, then check the guess.
    guess = len(json.dumps(meta)) + 96 * len(columns) + 256
    offset = _aligned(_HEADER.size + guess)
    for name, array in columns.items():
        meta["arrays"][name] = [array.dtype.str, list(array.shape), offset]
        offset = _aligned(offset + array.nbytes)
    encoded = json.dumps(meta).encode()
    assert _HEADER.size + len(encoded) <= _aligned(_HEADER.size + guess)
    size = max(offset, _ALIGN)
    label = f"dlfs-index-{arrays.name}"[:_NAME_CHARS_MAX]
    fd = os.memfd_create(label, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size, flags=mmap.MAP_SHARED,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE) as target:
            target[:_HEADER.size] = _HEADER.pack(MAGIC, VERSION, len(encoded))
            target[_HEADER.size:_HEADER.size + len(encoded)] = encoded
            for name, array in columns.items():
                start = meta["arrays"][name][2]
                target[start:start + array.nbytes] = memoryview(array).cast("B")
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def load(fd: int) -> SampleArrays:
    """The dataset `export` wrote into `fd`, its arrays read-only views of one shared
    mapping (the descriptor may be closed afterwards; the mapping lives as long as
    the arrays do).  O(1): nothing is copied, pages are touched as reads use them.

    Raises ValueError when `fd` is not a sealed index of this format.
    """
    meta, columns = _map(fd)
    cluster = None if meta["cluster"] is None else Cluster(
        tuple(meta["cluster"][0]), *meta["cluster"][1:])
    blocks = BlockIndex.from_columns(meta["block_bytes"], meta["block_complete"],
                                     columns["block_crc"], columns["block_ids"],
                                     columns["block_first"])
    return SampleArrays(meta["name"], meta["dataset_id"], meta["created_ns"],
                        **{field: columns[field] for field in SampleArrays.COLUMNS},
                        blocks=blocks, cluster=cluster, holders=columns.get("holders"),
                        total_bytes=meta["total_bytes"], extents=meta["extents"])


def adopt(arrays: SampleArrays, fd: int) -> None:
    """Make `arrays` (the main process's own index, before it is published) use the
    views of `fd`, which `export(arrays)` wrote: its private copies are freed, so
    the index exists once in memory.  O(1)."""
    meta, columns = _map(fd)
    assert meta["dataset_id"] == arrays.dataset_id and meta["name"] == arrays.name
    for field in SampleArrays.COLUMNS:
        setattr(arrays, field, columns[field])
    if arrays.holders is not None:
        arrays.holders = columns["holders"]
    arrays.blocks = BlockIndex.from_columns(arrays.blocks.block_bytes, arrays.blocks.complete,
                                            columns["block_crc"], columns["block_ids"],
                                            columns["block_first"])


def _map(fd: int) -> tuple[dict, dict[str, np.ndarray]]:
    """(metadata, arrays) of a sealed index: views of one read-only mapping."""
    if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _SEALS != _SEALS:
        raise ValueError("a shared index must be sealed against writes")
    size = os.fstat(fd).st_size
    head = os.pread(fd, _HEADER.size, 0)
    if len(head) < _HEADER.size:
        raise ValueError("a shared index too short for its header")
    magic, version, meta_bytes = _HEADER.unpack(head)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"not a shared index of format {VERSION} (magic {magic!r}, "
                         f"version {version})")
    meta = json.loads(os.pread(fd, meta_bytes, _HEADER.size))
    mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    columns = {}
    for name, (dtype, shape, offset) in meta["arrays"].items():
        count = int(np.prod(shape, dtype=np.int64))
        if offset + count * np.dtype(dtype).itemsize > size:
            raise ValueError(f"array {name} of a shared index ends past its {size} bytes")
        columns[name] = np.frombuffer(mapping, dtype, count, offset).reshape(shape)
    return meta, columns


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN
