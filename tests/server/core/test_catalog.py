"""Catalog format, replay, torn tails at every byte, mid-log corruption."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from dlfs.server.core import catalog as cat
from dlfs.server.core import catalog_records as records


def block(paths, extent=0, start=4096):
    n = len(paths)
    lengths = np.arange(1, n + 1, dtype=np.uint64) * 10
    offsets = start + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.uint64)
    return records.SampleBlock(list(paths), np.full(n, extent, np.uint32), offsets, lengths,
                           np.arange(n, dtype=np.uint32) * 7, np.full(n, 0o100644, np.uint32),
                           np.arange(n, dtype=np.int64) * 1000)


def write_catalog(path) -> list[tuple[records.RecordType, bytes]]:
    catalog, _ = cat.Catalog.open(str(path))
    written = [
        (records.RecordType.BEGIN, records.encode_begin(1, 123, "alpha")),
        (records.RecordType.SAMPLES, records.encode_samples(1, block(["a/x", "a/ü y", "b"]))),
        (records.RecordType.SEAL, records.encode_seal(1)),
        (records.RecordType.BEGIN, records.encode_begin(2, 456, "beta")),
        (records.RecordType.SAMPLES, records.encode_samples(2, block(["only"]))),
    ]
    for rtype, payload in written:
        catalog.append(rtype, payload)
    catalog.close()
    return written


def test_records_round_trip(tmp_path):
    path = tmp_path / "catalog.log"
    written = write_catalog(path)
    result = cat.scan(str(path))
    assert result.records == written and not result.problem
    assert result.valid_bytes == result.file_bytes == os.path.getsize(path)
    dataset_id, decoded = records.decode_samples(written[1][1])
    original = block(["a/x", "a/ü y", "b"])
    assert dataset_id == 1 and decoded.paths == original.paths
    for field in ("extent", "offset", "length", "crc", "mode", "mtime_ns"):
        assert np.array_equal(getattr(decoded, field), getattr(original, field))
    assert records.decode_begin(written[0][1]) == (1, 123, "alpha")
    assert records.decode_seal(written[2][1]) == (1, 0)


def test_torn_tail_at_every_byte_of_the_last_record_is_cut(tmp_path):
    path = tmp_path / "catalog.log"
    written = write_catalog(path)
    full = path.read_bytes()
    last_len = cat.RECORD_HEADER_BYTES + len(written[-1][1])
    last_start = len(full) - last_len
    for cut in range(last_start, len(full)):
        torn = tmp_path / f"torn-{cut}.log"
        torn.write_bytes(full[:cut])
        catalog, result = cat.Catalog.open(str(torn))
        catalog.close()
        assert result.records == written[:-1], cut
        assert (cut == last_start) == (not result.problem)
        assert os.path.getsize(torn) == last_start  # the torn bytes were cut off
        torn.unlink()


def test_every_truncation_point_replays_a_prefix(tmp_path):
    path = tmp_path / "catalog.log"
    written = write_catalog(path)
    full = path.read_bytes()
    for cut in range(0, len(full) + 1, 3):
        torn = tmp_path / "t.log"
        torn.write_bytes(full[:cut])
        catalog, result = cat.Catalog.open(str(torn))
        catalog.append(records.RecordType.DELETE, records.encode_delete(9))  # appends still work
        catalog.close()
        again = cat.scan(str(torn))
        assert again.records[:-1] == written[:len(again.records) - 1]
        assert again.records[-1] == (records.RecordType.DELETE, records.encode_delete(9))
        assert not again.problem


def test_zero_filled_tail_counts_as_torn(tmp_path):
    path = tmp_path / "catalog.log"
    written = write_catalog(path)
    with open(path, "ab") as f:
        f.write(b"\0" * 5000)
    catalog, result = cat.Catalog.open(str(path))
    catalog.close()
    assert result.records == written and "bad record magic" in result.problem


def test_flipped_byte_in_a_checksummed_tail_record_is_cut(tmp_path):
    path = tmp_path / "catalog.log"
    written = write_catalog(path)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    catalog, result = cat.Catalog.open(str(path))
    catalog.close()
    assert result.records == written[:-1] and "checksum mismatch" in result.problem


def test_corruption_in_the_middle_refuses_to_start_unless_salvaging(tmp_path):
    path = tmp_path / "catalog.log"
    written = write_catalog(path)
    data = bytearray(path.read_bytes())
    second = cat.FILE_HEADER_BYTES + cat.RECORD_HEADER_BYTES + len(written[0][1])
    data[second + cat.RECORD_HEADER_BYTES + 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(cat.CatalogCorrupt, match="not a torn tail.*--salvage-catalog"):
        cat.Catalog.open(str(path))
    assert path.read_bytes() == bytes(data)  # nothing was cut without being asked
    salvaged = tmp_path / "salvaged.log"
    shutil.copy(path, salvaged)
    catalog, result = cat.Catalog.open(str(salvaged), salvage=True)
    catalog.close()
    assert result.records == written[:1]


def test_damaged_file_header_and_other_versions_are_refused(tmp_path):
    path = tmp_path / "catalog.log"
    write_catalog(path)
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(cat.CatalogCorrupt, match="not a DLFS catalog"):
        cat.scan(str(path))
    data[0] ^= 0xFF
    data[8] = 99  # version
    path.write_bytes(bytes(data))
    with pytest.raises(cat.CatalogCorrupt, match="format version 99"):
        cat.scan(str(path))


def test_oversized_length_field_does_not_allocate(tmp_path):
    path = tmp_path / "catalog.log"
    written = write_catalog(path)
    with open(path, "ab") as f:
        import struct

        f.write(struct.pack("<IIII", cat.RECORD_MAGIC, 2, 2**31, 0))
    catalog, result = cat.Catalog.open(str(path))
    catalog.close()
    assert result.records == written and "over the limit" in result.problem
