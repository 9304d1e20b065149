"""The on-disk format of a data dir, shared by the daemon and co-located clients.

Layout::

    DATA_DIR/LOCK            flock'ed while a daemon runs (holds its pid)
    DATA_DIR/catalog.log     the catalog (format in dlfs.server.core.catalog)
    DATA_DIR/extents/<dataset id, 16 hex digits>/<extent number, 6 digits>.ext

An extent starts with a `HEADER_BYTES` header (magic, format version,
dataset id, extent number, creation time, CRC32C of the header) padded to
4 KiB, so sample data starts page aligned; samples follow back to back.

The daemon writes this layout (dlfs.server.core.extents, dlfs.server.store); a
client on the daemon's host checks the headers of the extents it is passed
(dlfs.client.transport.direct_transport).  Everything
here is pure path arithmetic and byte formats: nothing creates a directory,
and nothing imports grpc or the server package.
"""

from __future__ import annotations

import os
import struct

from dlfs.crc import crc32c
from dlfs.errors import DataCorruption

LOCK_FILE = "LOCK"
CATALOG_FILE = "catalog.log"
EXTENTS_DIR = "extents"

MAGIC = b"DLFSEXT1"
FORMAT_VERSION = 1
HEADER_BYTES = 4096
_HEADER = struct.Struct("<8sIQIq")  # magic, version, dataset id, extent no, created ns
_HEADER_CRC = struct.Struct("<I")
# Extent number of a sample of a striped dataset that other daemons store.
NO_EXTENT = 0xFFFFFFFF


def dataset_dir_name(dataset_id: int) -> str:
    return f"{dataset_id:016x}"


def extent_file_name(extent_no: int) -> str:
    return f"{extent_no:06d}.ext"


def extents_root(data_dir: str) -> str:
    """DATA_DIR/extents: one subdirectory per dataset."""
    return os.path.join(data_dir, EXTENTS_DIR)


def dataset_dir(data_dir: str, dataset_id: int) -> str:
    """The directory holding every extent of one dataset."""
    return os.path.join(extents_root(data_dir), dataset_dir_name(dataset_id))


def extent_path(data_dir: str, dataset_id: int, extent_no: int) -> str:
    """Path of one extent file.  Pure: creates nothing, checks nothing."""
    return os.path.join(dataset_dir(data_dir, dataset_id), extent_file_name(extent_no))


def encode_header(dataset_id: int, extent_no: int, created_ns: int) -> bytes:
    """The HEADER_BYTES that start an extent file."""
    body = _HEADER.pack(MAGIC, FORMAT_VERSION, dataset_id, extent_no, created_ns)
    body += _HEADER_CRC.pack(crc32c(body))
    return body.ljust(HEADER_BYTES, b"\0")


def check_header(raw: bytes, dataset_id: int, extent_no: int, path: str) -> None:
    """Raise DataCorruption unless `raw` is a valid header for this extent."""
    size = _HEADER.size + _HEADER_CRC.size
    if len(raw) < size:
        raise DataCorruption(f"extent {path} is truncated inside its header")
    magic, version, got_dataset, got_extent, _created = _HEADER.unpack_from(raw)
    (crc,) = _HEADER_CRC.unpack_from(raw, _HEADER.size)
    if magic != MAGIC or crc != crc32c(raw[: _HEADER.size]):
        raise DataCorruption(f"extent {path} has a damaged header (bad magic or checksum)")
    if version != FORMAT_VERSION:
        raise DataCorruption(
            f"extent {path} has format version {version}; this daemon reads version "
            f"{FORMAT_VERSION}"
        )
    if (got_dataset, got_extent) != (dataset_id, extent_no):
        raise DataCorruption(
            f"extent {path} belongs to dataset {got_dataset:x} extent {got_extent}, "
            f"not dataset {dataset_id:x} extent {extent_no}"
        )
