"""Placement of a striped dataset's samples on member daemons.

Rendezvous (highest-random-weight) hashing: every (member, sample path) pair
gets a pseudo-random 64-bit score, and a sample is stored on the `replicas`
members with the highest scores.  Properties that matter here:

- deterministic: any client computes the same placement from the same
  member list, dataset name and paths (the daemons also record it, and
  readers learn it from them, so a reader never recomputes it);
- balanced: each member holds replicas/N of the samples, with binomial
  spread (relative standard deviation sqrt((N - replicas) / (replicas * n)));
  for 1,000,000 samples on 1,000 daemons that is about 3% per daemon
  (`python -m bench.cluster_model` simulates it);
- minimal movement: adding an (N+1)-th daemon changes the holders of only
  the samples for which it scores in the top `replicas`, about
  replicas/(N+1) of them; removing one moves only the samples it held.
  That is what makes rebalancing cheap (docs/cluster.md).

Scores are splitmix64(hash(path) xor hash(member)), vectorized with numpy:
O(n x N) word operations, no Python loop per pair.

A `Placement` is where a dataset's samples live as its daemons recorded it
(`placement_of` a daemon's index): what readers route by.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Sequence

import numpy as np

from dlfs import limits
from dlfs.client.transport.control_replies import SampleLocations
from dlfs.errors import InvalidArgument


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a dataset's samples live, as its daemons reported it."""

    members: tuple  # addresses in placement order; () for a one-daemon dataset
    holders: np.ndarray | None  # uint16 (samples, replicas); None for a one-daemon dataset
    owner: str  # for a one-daemon dataset: the daemon that has it
    generation: int  # the version it describes; every part of a batch names it


def placement_of(index: SampleLocations, address: str) -> Placement:
    """The placement a daemon's index (from `address`) records: its members and holders,
    or for a one-daemon dataset that daemon as the owner."""
    if not index.members:
        return Placement((), None, address, index.generation)
    return Placement(index.members, index.holders, "", index.generation)

# Pairs scored per numpy step (bounds the temporary score matrix to ~32 MiB).
_PAIRS_PER_STEP = 4 * 1024 * 1024


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer on uint64 arrays (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def place(dataset: str, paths: Sequence[str], members: Sequence[str], replicas: int) -> np.ndarray:
    """Member indices holding each sample: uint16 array of shape (len(paths), replicas).

    Row i lists the holders of paths[i], highest score first (the first is
    the one readers try first).  Raises InvalidArgument for a bad replica
    count or member list.
    """
    n_members = len(members)
    if not 1 <= n_members <= limits.members_max or len(set(members)) != n_members:
        raise InvalidArgument(f"give 1..{limits.members_max} distinct daemon addresses")
    if not 1 <= replicas <= min(n_members, limits.replicas_max):
        raise InvalidArgument(
            f"--replicas {replicas} must be between 1 and {min(n_members, limits.replicas_max)} "
            f"(the number of daemons, at most {limits.replicas_max})")
    path_hashes = np.fromiter((_hash64(f"{dataset}\0{p}") for p in paths), dtype=np.uint64,
                              count=len(paths))
    member_hashes = np.array([_hash64(m) for m in members], dtype=np.uint64)
    holders = np.empty((len(paths), replicas), dtype=np.uint16)
    rows = max(1, _PAIRS_PER_STEP // n_members)
    with np.errstate(over="ignore"):
        for start in range(0, len(paths), rows):
            scores = _mix(path_hashes[start:start + rows, None] ^ member_hashes[None, :])
            if replicas < n_members:
                top = np.argpartition(scores, n_members - replicas, axis=1)[:, n_members - replicas:]
            else:
                top = np.broadcast_to(np.arange(n_members), scores.shape)
            top_scores = np.take_along_axis(scores, top, axis=1)
            order = np.argsort(top_scores, axis=1)[:, ::-1]
            holders[start:start + rows] = np.take_along_axis(top, order, axis=1)
    return holders


_MASK64 = (1 << 64) - 1


def _mix_int(x: int) -> int:
    """`_mix` on one Python int."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def member_hashes(members: Sequence[str]) -> list[int]:
    """The per-member hashes `place_one` takes (compute once per ingest)."""
    return [_hash64(m) for m in members]


def place_one(dataset: str, path: str, hashes: Sequence[int], replicas: int) -> list[int]:
    """Holders of one sample, as row `place` gives for it, without numpy: for
    samples whose paths are not known up front (archives).  O(members)."""
    h = _hash64(f"{dataset}\0{path}")
    scores = sorted(((_mix_int(h ^ m), index) for index, m in enumerate(hashes)), reverse=True)
    return [index for _, index in scores[:replicas]]
