"""One sample per dataset path: a second entry for a path stops the ingest."""

from __future__ import annotations

from dlfs.errors import InvalidArgument
from dlfs.staging.source_files import SourceFile


class Duplicates:
    """Refuses a second entry for one dataset path (several sources, archives).

    Keeps every path and where it came from: about 200 bytes per file
    (250 MB for ImageNet's 1.28 million), only when duplicates are possible
    (`SourceSet.needs_duplicate_check`).  `check` is O(1).
    """

    def __init__(self):
        self._seen: dict[str, str] = {}

    def check(self, file: SourceFile) -> None:
        """Raise InvalidArgument, naming both places, when `file.path` was seen before."""
        first = self._seen.setdefault(file.path, file.source)
        if first is not file.source:
            raise InvalidArgument(
                f"two entries would both become sample {file.path!r}: {first} and "
                f"{file.source}; paths must be unique across the archives and trees of one "
                "ingest")
