"""The sample directory: every sealed dataset of the daemon, by name.

Datasets (`DatasetIndex`, directory.py) are immutable; publishing a new one
or removing one swaps whole datasets under a lock, so readers that resolved
a dataset keep a consistent view without locking.  Only the ingest machine
publishes and removes (with the catalog record that makes it durable).
"""

from __future__ import annotations

import threading

from dlfs.errors import NotFound
from dlfs.server.core.directory import DatasetIndex


class SampleDirectory:
    """All sealed datasets by name.  Thread-safe; datasets themselves are immutable."""

    def __init__(self):
        self._lock = threading.Lock()
        self._datasets: dict[str, DatasetIndex] = {}

    def get(self, name: str) -> DatasetIndex:
        """The dataset named `name`.  O(1).  Raises NotFound naming it."""
        dataset = self._datasets.get(name)
        if dataset is None:
            raise NotFound(f"no dataset named {name!r}; `dlfs datasets` lists the existing ones")
        return dataset

    def find(self, name: str) -> DatasetIndex | None:
        return self._datasets.get(name)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._datasets)

    def all(self) -> list[DatasetIndex]:
        with self._lock:
            return [self._datasets[name] for name in sorted(self._datasets)]

    def publish(self, dataset: DatasetIndex) -> DatasetIndex | None:
        """Make `dataset` visible under its name; return the one it replaced."""
        with self._lock:
            previous = self._datasets.get(dataset.name)
            self._datasets[dataset.name] = dataset
            return previous

    def remove(self, name: str) -> DatasetIndex:
        with self._lock:
            dataset = self._datasets.pop(name, None)
        if dataset is None:
            raise NotFound(f"no dataset named {name!r}; `dlfs datasets` lists the existing ones")
        return dataset
