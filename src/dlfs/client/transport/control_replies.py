"""What a daemon's control calls answer, as plain values (no protobuf past the gRPC edge).

The summaries every side shares (`DatasetInfo`, `Entry`, `DaemonStatus`,
`WarmInfo`) are in `dlfs.types`; these are the answers only the client's
transports deal in.
"""

from __future__ import annotations

import builtins
import dataclasses

import numpy as np

from dlfs.types import Entry


@dataclasses.dataclass(frozen=True)
class UnsealedIngest:
    """An unsealed ingest a daemon holds (GetIngestProgress).

    `state`: "receiving" (a stream is still attached), "prepared" or
    "parked".  The ingest's streams carried `samples` files first (`bytes`
    their sizes summed), durable there; `digest` chains their paths, sizes
    and mtimes (dlfs.formats.ingest_digest), `last_path` is the last one's.
    The options it was started with follow (a resume must repeat them).
    """

    dataset: str
    state: str
    samples: int
    bytes: int
    digest: builtins.bytes  # `bytes` is a field of this class
    last_path: str
    replace: bool
    members: tuple[str, ...]
    replicas: int
    member_index: int
    generation: int
    parked_unix_ns: int = 0
    expires_in_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class ScrubUpdate:
    """One message of a scrub: how far it got, the damaged samples found since the
    previous one (with a reason each), and whether it is done."""

    samples_checked: int
    bytes_checked: int
    samples_total: int
    damaged: tuple[Entry, ...]
    reasons: tuple[str, ...]
    done: bool


@dataclasses.dataclass(frozen=True)
class SampleLocations:
    """Where a dataset's samples lie on one daemon (GetIndex), in id order.

    Per sample: `extent` number (0xFFFFFFFF: stored by another daemon),
    `offset` and `length` in it, `crc32c`; striped datasets also `holders`
    (uint16, shape (samples, replicas): indices into `members`).
    """

    generation: int
    samples: int
    extent: np.ndarray  # uint32
    offset: np.ndarray  # uint64
    length: np.ndarray  # uint64
    crc32c: np.ndarray  # uint32
    members: tuple[str, ...] = ()
    replicas: int = 0
    holders: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class DataPathOffer:
    """Where a daemon's data path listens (GetDataPath), or why it offers none."""

    enabled: bool
    reason: str
    port: int
    unix_socket: str
    instance: bytes
    version: int
