"""The digest both ends of a resumable ingest keep of the files it carried.

A resumable ingest that broke off is continued from the first file the
daemon does not hold durably.  The stream carries files in a fixed order
(sorted paths of a tree, archive order of an archive), so "what the daemon
holds" is a count K; to be sure the client's first K files are the ones
the daemon holds, both sides chain a digest over them:

    digest_0 = 16 zero bytes
    digest_i = BLAKE2b-128(digest_(i-1) | UTF-8 path | size u64 | mtime ns i64)

The daemon records it with each durable checkpoint; a client resuming
computes it over its first K entries without reading their bytes, and
refuses to resume when they differ (the source changed).  Shared by the
daemon and the client; imports nothing of either.
"""

from __future__ import annotations

import hashlib
import struct

DIGEST_BYTES = 16
EMPTY = bytes(DIGEST_BYTES)
_TAIL = struct.Struct("<Qq")


def chain(digest: bytes, path: str, size: int, mtime_ns: int) -> bytes:
    """The digest after one more file."""
    return hashlib.blake2b(digest + path.encode("utf-8") + _TAIL.pack(size, mtime_ns),
                           digest_size=DIGEST_BYTES).digest()
