"""Checksum mismatches found on the client's side, and how they come to name a path.

A transport that checks sample bytes itself (the data path checks what it
received, a co-located reader what it mapped) knows the sample's id, not
its path.  The error it raises says how to rename it (`renamable`); the
transport, or the mount, which knows the path, names it with
`named_checksum_error` (one Lookup by `with_sample_path`, on this error only).
"""

from __future__ import annotations

import logging
from typing import Callable

from dlfs.errors import DataCorruption, DlfsError

log = logging.getLogger(__name__)


def checksum_mismatch(sample: str, label: str, expected: int, got: int) -> DataCorruption:
    """The error for a sample (named by `sample`) whose bytes received from `label` fail
    their CRC32C."""
    return DataCorruption(
        f"checksum mismatch for {sample} (received from {label}): stored CRC32C "
        f"{expected:08x}, received {got:08x}; the daemon's copy or the transfer is damaged "
        "(`dlfs scrub` checks the daemon's copy)")


def block_prefix(block: tuple[int, int] | None) -> str:
    """How a checksum error names a block of a sample ("" for a whole sample)."""
    return "" if block is None else f"the block at bytes {block[0]}..{block[1]} of "


def renamable(error: DataCorruption, sample_id: int, block: tuple[int, int] | None,
              rename: Callable[[str], DataCorruption]) -> DataCorruption:
    """`error` (a mismatch of sample `sample_id`, or of `block` of it), carrying what
    `named_checksum_error` needs: `rename(what)` is the same error naming `what`."""
    error.sample_id, error.block, error.renamed = sample_id, block, rename
    return error


def named_checksum_error(exc: DataCorruption, describe: Callable[[int], str]) -> DataCorruption:
    """`exc` naming its sample as `describe(sample_id)` does (a path, say) when it is a
    checksum mismatch made `renamable`, logged; any other DataCorruption as it is."""
    sample_id = exc.sample_id
    if sample_id is None or exc.renamed is None:
        return exc
    error = exc.renamed(block_prefix(exc.block) + describe(sample_id))
    log.error("%s", error.message)
    return error


def with_sample_path(exc: DataCorruption, dataset: str, lookup) -> DataCorruption:
    """`exc` naming its sample's path too, found by `lookup(dataset, ids=..., retry=False)`
    (a `DaemonControl.lookup`: one round trip, on this error only); the id alone when
    the path cannot be had."""
    def describe(sample_id: int) -> str:
        try:
            path = lookup(dataset, ids=[sample_id], retry=False)[0].path
        except (DlfsError, IndexError):
            return f"sample {sample_id} of dataset {dataset!r}"
        return f"sample {sample_id} {path!r} of dataset {dataset!r}"

    return named_checksum_error(exc, describe)
