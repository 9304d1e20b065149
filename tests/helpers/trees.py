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
