"""Every byte verified: block CRC32Cs of large samples, on every read path of a real daemon.

A byte flipped on disk inside one 1 MiB block of a 20 MiB sample: any read
that touches that block fails with DataCorruption naming the sample and the
block (data path, gRPC, whole-sample reads), reads of the other blocks
still succeed, and datasets written before block CRCs still read.
"""

from __future__ import annotations

import os

import crc32c
import numpy as np
import pytest

import dlfs
from dlfs import Client
from dlfs.formats import block_crcs
from helpers.damage import BAD_BLOCK, BIG, MiB, big_tree, flip_byte


@pytest.fixture
def damaged(daemon, tmp_path):
    """A daemon holding dataset "ds" whose big.bin (id 0) has a flipped byte in block 5."""
    files = big_tree(tmp_path / "src")
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")
    flip_byte(daemon, "ds", 0, BAD_BLOCK * MiB + 777)
    return daemon, files


BLOCK_ERROR = (f"block at bytes {BAD_BLOCK * MiB}..{(BAD_BLOCK + 1) * MiB} of sample 0 "
               "'big.bin' of dataset 'ds'")


@pytest.mark.parametrize("data_path", [True, False, "direct"],
                         ids=["data-path", "grpc", "direct"])
def test_a_range_touching_the_damaged_block_fails_and_others_read(damaged, data_path):
    """Through the daemon (data path, gRPC) and from the mapped extents of a co-located
    client (`direct=True`, block CRCs asked of the daemon)."""
    daemon, files = damaged
    good = files["big.bin"]
    options = {"direct": True} if data_path == "direct" else {"data_path": data_path}
    with Client(daemon.address, **options) as client:
        ds = client.dataset("ds")
        # Inside the bad block, straddling into it, and the whole sample: all refused.
        for offset, length in ((BAD_BLOCK * MiB + 700, 100), (BAD_BLOCK * MiB - 10, 20),
                               (0, 0)):
            with pytest.raises(dlfs.DataCorruption, match="checksum mismatch") as caught:
                ds.read("big.bin", offset, length)
            if length:
                message = BLOCK_ERROR if data_path in (True, "direct") else \
                    (f"block {BAD_BLOCK} (bytes {BAD_BLOCK * MiB}..{(BAD_BLOCK + 1) * MiB}) "
                     "of sample 0 'big.bin' of dataset 'ds'")
                assert message in str(caught.value)
        with pytest.raises(dlfs.DataCorruption, match="sample 0 'big.bin'"):
            ds.get_batch([0])
        # Every other block, parts of them and the short last one, read and verified.
        for offset, length in ((0, 10), (3 * MiB + 5, 2 * MiB - 5), (BAD_BLOCK * MiB - 10, 10),
                               ((BAD_BLOCK + 1) * MiB, MiB), (20 * MiB, 0), (BIG - 1, 5),
                               (BIG + 10, 5)):
            stop = BIG if length == 0 else min(BIG, offset + length)
            assert bytes(ds.read("big.bin", offset, length)) == good[offset:stop]
        assert bytes(ds.get_batch([1])[0]) == files["small.bin"]
        # Unverified reads still hand out what is stored (for salvage).
        damaged_bytes = bytes(ds.read("big.bin", BAD_BLOCK * MiB, MiB, verify=False))
        assert damaged_bytes != good[BAD_BLOCK * MiB:(BAD_BLOCK + 1) * MiB]
    if data_path is False:  # the daemon verified, and says so in its log naming the sample
        assert "block 5 (bytes 5242880..6291456) of sample 0 'big.bin'" in daemon.log()


def test_a_direct_range_is_a_view_of_the_extent_checked_by_its_blocks(damaged):
    daemon, files = damaged
    good = files["big.bin"]
    with Client(daemon.address, direct=True) as client:
        ds = client.dataset("ds")
        part = ds.read("big.bin", 7 * MiB + 3, MiB)  # blocks 7 and 8, checked
        assert bytes(part) == good[7 * MiB + 3:8 * MiB + 3] and part.readonly
        # Long ranges come in pieces, from the mapped extent too.
        pieces = list(ds.read_chunks("big.bin", 0, 4 * MiB + 1))
        assert b"".join(bytes(p) for _, p in pieces) == good[:4 * MiB + 1]
        with pytest.raises(dlfs.DataCorruption, match=BLOCK_ERROR):
            list(ds.read_chunks("big.bin"))
        reader = client.transport._reader("ds")
        assert [sample for _generation, sample in reader._block_crcs] == [0]  # asked once
        # The daemon says so for a sample of one block, and refuses bad ids.
        data = client.transport.data_path()
        generation, block_bytes, crcs = data.block_crcs("ds", 1)
        assert (block_bytes, crcs.tolist()) == (MiB, [crc32c.crc32c(files["small.bin"])])
        assert data.block_crcs("ds", 0)[2].size == 21  # 20 MiB and 4321 bytes
        with pytest.raises(dlfs.InvalidArgument, match="sample id 2 is out of range"):
            data.block_crcs("ds", 2)
        with pytest.raises(dlfs.StaleGeneration):
            data.block_crcs("ds", 0, generation + 1)


def test_a_partial_read_costs_at_most_a_block_on_each_side(damaged):
    """The data path reply carries whole blocks, each with its CRC32C."""
    daemon, files = damaged
    with Client(daemon.address) as client:
        data = client.transport.data_path()
        received = data.read_range("ds", 0, 7 * MiB + 3, MiB)  # blocks 7 and 8
        assert bytes(received.samples[0]) == files["big.bin"][7 * MiB + 3:8 * MiB + 3]
        unchecked = data.read_range("ds", 0, 7 * MiB + 3, MiB, verify=False)
        assert bytes(unchecked.samples[0]) == files["big.bin"][7 * MiB + 3:8 * MiB + 3]


def test_block_crcs_survive_a_restart_and_compaction(daemon, tmp_path):
    files = big_tree(tmp_path / "src")
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")
    daemon.restart()
    flip_byte(daemon, "ds", 0, 19 * MiB + 1)
    with Client(daemon.address) as client:
        ds = client.dataset("ds")
        assert bytes(ds.read("big.bin", 0, MiB)) == files["big.bin"][:MiB]
        with pytest.raises(dlfs.DataCorruption, match="block at bytes 19922944..20971520"):
            ds.read("big.bin", 19 * MiB, 10)


def write_old_format(data_dir: str) -> None:
    """Rewrite a stopped daemon's catalog as format version 1 wrote it: no BLOCKS records."""
    from dlfs.server.core import catalog as cat  # here: importing it defines an error class that
    # tests/fuse/test_errno_map.py would then find among DlfsError's subclasses

    path = os.path.join(data_dir, "catalog.log")
    from dlfs.server.core.catalog_records import RecordType

    records = [(t, p) for t, p in cat.scan(path).records if t is not RecordType.BLOCKS]
    with open(path, "wb") as f:
        f.write(cat._file_header(1))
        for record_type, payload in records:
            f.write(cat.encode_record(record_type, payload))


def test_datasets_from_before_block_crcs_still_read(daemon, tmp_path):
    files = big_tree(tmp_path / "src")
    with Client(daemon.address) as client:
        client.ingest(str(tmp_path / "src"), "ds")
    daemon.stop()
    write_old_format(daemon.data_dir)
    daemon.start()
    from dlfs.server.core import catalog as cat

    with open(os.path.join(daemon.data_dir, "catalog.log"), "rb") as f:
        assert cat.scan(f.name).version == cat.FORMAT_VERSION  # upgraded on open
    assert "has no block CRCs" in daemon.log()
    flip_byte(daemon, "ds", 0, BAD_BLOCK * MiB + 777)
    for data_path in (True, False):
        with Client(daemon.address, data_path=data_path) as client:
            ds = client.dataset("ds")
            # Whole-sample reads are verified ...
            with pytest.raises(dlfs.DataCorruption, match="sample 0 'big.bin'"):
                ds.get_batch([0])
            with pytest.raises(dlfs.DataCorruption, match="sample 0 'big.bin'"):
                ds.read("big.bin")
            # ... parts of a large sample are not: documented, and they still read.
            part = bytes(ds.read("big.bin", BAD_BLOCK * MiB, MiB))
            assert part != files["big.bin"][BAD_BLOCK * MiB:(BAD_BLOCK + 1) * MiB]
            assert bytes(ds.read("big.bin", 2 * MiB, 3)) == files["big.bin"][2 * MiB:2 * MiB + 3]
            assert bytes(ds.read("small.bin", 10, 20)) == files["small.bin"][10:30]


def test_block_hasher_matches_any_piece_size():
    data = np.random.default_rng(3).bytes(3 * block_crcs.BLOCK_BYTES + 17)
    expected = [crc32c.crc32c(data[i:i + block_crcs.BLOCK_BYTES])
                for i in range(0, len(data), block_crcs.BLOCK_BYTES)]
    for piece in (1000, block_crcs.BLOCK_BYTES, 3 * block_crcs.BLOCK_BYTES + 100):
        hasher = block_crcs.BlockHasher()
        for i in range(0, len(data), piece):
            hasher.update(data[i:i + piece])
        assert hasher.finish(len(data)) == expected
    small = block_crcs.BlockHasher()
    small.update(b"abc")
    assert small.finish(3) == []
    assert block_crcs.widen(10, 20, 100, 8) == (8, 24)
    assert block_crcs.widen(10, 99, 100, 8) == (8, 100)
