"""Trees of real files to ingest, and names no other test uses."""

from __future__ import annotations

import os
import uuid


def write_tree(root, files: dict[str, bytes]) -> None:
    """Create `files` (relative path -> contents) below `root`."""
    for rel, data in files.items():
        path = os.path.join(root, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def unique_name(prefix: str = "ds") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def named_content(name: str, size: int) -> bytes:
    """`size` bytes that `name` decides: a check needs no record of what was written."""
    from dlfs.crc import crc32c

    block = (crc32c(name.encode()).to_bytes(4, "little") * 1024)[:4096]
    return (block * (size // 4096 + 1))[:size]
