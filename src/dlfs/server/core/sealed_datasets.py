"""The sample directory: every sealed dataset of the daemon, by name.

The file versions of checkpoint spaces are here too, each a one-sample
version named SPACE@VERSION (dlfs.paths.file_version_name) that the space
machine publishes and removes: every read path serves them as it serves
datasets.  `names` and `datasets` leave them out; `all` has them.

Datasets (`DatasetIndex`, directory.py) are immutable; publishing a new one
or removing one swaps whole datasets under a lock, so readers that resolved
a dataset keep a consistent view without locking.  Only the ingest machine
publishes and removes (with the catalog record that makes it durable).

A `DirectoryMirror` (the data path's worker supervisor) may be attached: it
sees every change in order, under the directory's lock, and `publish` and
`remove` return only once the mirror says the change reached every process
that serves reads (its waiter returned).  A replace or delete is thus
acknowledged to its client only after no serving process reads the old
version any more.
"""

from __future__ import annotations

import threading
from typing import Callable, Protocol

from dlfs.errors import NotFound
from dlfs.paths import FILE_VERSION_SEP
from dlfs.server.core.directory import DatasetIndex


class DirectoryMirror(Protocol):
    """Who else must see the directory's changes before they are acknowledged."""

    def prepare(self, dataset: DatasetIndex) -> None:
        """Called before `dataset` is published, before its publishing is durable and
        outside the lock (it may take time, and fail with OSError)."""

    def attached(self, datasets: list[DatasetIndex]) -> None:
        """Called once, under the lock, with every dataset published so far."""

    def published(self, dataset: DatasetIndex,
                  previous: DatasetIndex | None) -> Callable[[], None]:
        """Called under the lock; returns a wait for the change to be applied."""

    def removed(self, dataset: DatasetIndex) -> Callable[[], None]:
        """Called under the lock; returns a wait for the change to be applied."""


class SampleDirectory:
    """All sealed datasets by name.  Thread-safe; datasets themselves are immutable."""

    def __init__(self):
        self._lock = threading.Lock()
        self._datasets: dict[str, DatasetIndex] = {}
        self._mirror: DirectoryMirror | None = None

    def attach(self, mirror: DirectoryMirror) -> None:
        """Let `mirror` see the datasets published so far and every change from now on."""
        with self._lock:
            assert self._mirror is None, "one mirror per directory"
            mirror.attached(list(self._datasets.values()))
            self._mirror = mirror

    def get(self, name: str) -> DatasetIndex:
        """The dataset named `name`.  O(1).  Raises NotFound naming it."""
        dataset = self._datasets.get(name)
        if dataset is None:
            raise NotFound(f"no dataset named {name!r}; `dlfs datasets` lists the existing ones")
        return dataset

    def find(self, name: str) -> DatasetIndex | None:
        return self._datasets.get(name)

    def names(self) -> list[str]:
        """The sealed datasets' names, sorted (file versions of spaces left out)."""
        with self._lock:
            return sorted(n for n in self._datasets if FILE_VERSION_SEP not in n)

    def datasets(self) -> list[DatasetIndex]:
        """The sealed datasets by name (file versions of spaces left out)."""
        with self._lock:
            return [self._datasets[name] for name in sorted(self._datasets)
                    if FILE_VERSION_SEP not in name]

    def all(self) -> list[DatasetIndex]:
        """Everything readable: the sealed datasets and the file versions of the
        checkpoint spaces (each a one-sample version named SPACE@VERSION)."""
        with self._lock:
            return [self._datasets[name] for name in sorted(self._datasets)]

    def prepare(self, dataset: DatasetIndex) -> None:
        """Get `dataset` ready to be published (with a mirror: `DirectoryMirror.prepare`),
        before the record that makes its publishing durable.  Raises OSError."""
        if self._mirror is not None:
            self._mirror.prepare(dataset)

    def publish(self, dataset: DatasetIndex) -> DatasetIndex | None:
        """Make `dataset` visible under its name; return the one it replaced.  With a
        mirror, returns once the mirror applied the change (see DirectoryMirror)."""
        with self._lock:
            previous = self._datasets.get(dataset.name)
            self._datasets[dataset.name] = dataset
            wait = self._mirror.published(dataset, previous) if self._mirror else None
        if wait is not None:
            wait()
        return previous

    def remove(self, name: str) -> DatasetIndex:
        """Unpublish dataset `name` and return it; with a mirror, once it applied that.
        Raises NotFound."""
        with self._lock:
            dataset = self._datasets.pop(name, None)
            wait = self._mirror.removed(dataset) if self._mirror and dataset else None
        if dataset is None:
            raise NotFound(f"no dataset named {name!r}; `dlfs datasets` lists the existing ones")
        if wait is not None:
            wait()
        return dataset
