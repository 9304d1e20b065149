"""dlfs.crc against an independent CRC32C implementation (the `crc32c` package).

Every stored byte is checked with `dlfs.crc.crc32c`: catalog records,
extent headers, samples and their blocks.  Its SIMD kernels switch at
length thresholds and alignments, so the lengths and offsets here cross
them, and a continued CRC must equal the CRC of the whole.
"""

import mmap
import random

import crc32c as reference
import numpy as np

from dlfs.crc import crc32c


def test_known_value():
    # RFC 3720's check value for CRC32C.
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0


def test_lengths_offsets_and_continuations_match_the_reference():
    data = np.random.default_rng(7).integers(0, 256, 3 << 20, dtype=np.uint8)
    view = memoryview(data)
    pick = random.Random(7)
    lengths = list(range(0, 300)) + [pick.randrange(300, 70_000) for _ in range(300)] + \
        [pick.randrange(70_000, 3 << 20) for _ in range(30)] + [4095, 4096, 4097, 1 << 20]
    for length in lengths:
        start = pick.randrange(0, len(data) - length + 1)
        piece = view[start:start + length]
        value = pick.randrange(1 << 32) if pick.random() < 0.5 else 0
        assert crc32c(piece, value) == reference.crc32c(piece, value), (length, start, value)
        cut = pick.randrange(0, length + 1)
        assert crc32c(piece[cut:], crc32c(piece[:cut])) == crc32c(piece), (length, cut)


def test_buffer_kinds():
    raw = bytes(range(256)) * 100
    expected = reference.crc32c(raw)
    kinds = [raw, bytearray(raw), memoryview(raw), memoryview(bytearray(raw)).toreadonly(),
             np.frombuffer(raw, dtype=np.uint8).copy()]
    for kind in kinds:
        assert crc32c(kind) == expected, type(kind)
    mapping = mmap.mmap(-1, len(raw))
    mapping[:] = raw
    with memoryview(mapping) as mapped:  # how the direct reader checks samples
        assert crc32c(mapped[100:]) == reference.crc32c(raw[100:])
    mapping.close()
