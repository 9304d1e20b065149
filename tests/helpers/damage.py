"""Damage on disk for the block CRC tests: a large sample, and one byte of it flipped
in its extent file (tests/e2e/test_block_crcs.py, tests/fuse/test_verified_blocks.py)."""

from __future__ import annotations

import os

import numpy as np

from dlfs import Client
from helpers.trees import write_tree

MiB = 1024 * 1024
BIG = 20 * MiB + 4321  # the last block is short
BAD_BLOCK = 5


def big_tree(root) -> dict[str, bytes]:
    rng = np.random.default_rng(11)
    files = {"big.bin": rng.bytes(BIG), "small.bin": rng.bytes(3000)}
    write_tree(root, files)
    return files


def sample_location(address: str, name: str, sample_id: int) -> tuple[int, int]:
    """(extent number, offset in the extent) of a sample, as GetIndex reports it."""
    with Client(address) as client:
        index = client.transport.control.index(name)
    return int(index.extent[sample_id]), int(index.offset[sample_id])


def flip_byte(daemon, name: str, sample_id: int, position: int) -> None:
    """Change one byte of a sample in its extent file on disk."""
    extent_no, offset = sample_location(daemon.address, name, sample_id)
    extents = os.path.join(daemon.data_dir, "extents")
    [dataset_dir] = os.listdir(extents)
    with open(os.path.join(extents, dataset_dir, f"{extent_no:06d}.ext"), "r+b") as f:
        f.seek(offset + position)
        old = f.read(1)
        f.seek(offset + position)
        f.write(bytes([old[0] ^ 0xFF]))
